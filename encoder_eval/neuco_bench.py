"""`neuco-bench`: NeuCo-Bench's own command line, as a drop-in, on this harness's probes.

    neuco-bench --annotation_path labels/ --submission_file embeddings.csv \\
        [--output_dir results] [--config config.yaml] [--method_name NAME] [--phase dev] \\
        [--exclude_file bad_ids.txt] [--neuco-rule RULE ...]

The flags are NeuCo-Bench's (`main.py`'s), each also spelled with hyphens; the run is the
same code as `encoder-eval probe --annotation-path ...` (`encoder_eval.reports.neuco`), so
the outputs, defaults and refusals are that mode's (docs/probing.md).
"""

from __future__ import annotations

import sys

from encoder_eval.reports.neuco import main as neuco_main


def main(argv: list[str] | None = None) -> int:
    """Run NeuCo-Bench mode with NeuCo-Bench's flags under the program name `neuco-bench`."""
    return neuco_main(sys.argv[1:] if argv is None else list(argv), prog="neuco-bench")


if __name__ == "__main__":
    sys.exit(main())
