"""`python -m encoder_eval`: the same as the `encoder-eval` command."""

import sys

from encoder_eval.cli import main

sys.exit(main())
