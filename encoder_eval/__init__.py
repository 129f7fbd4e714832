"""encoder-eval-harness: compare encoders by fine-tuning them under one fixed protocol."""

__version__ = "0.1.0"
