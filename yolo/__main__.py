"""``python -m yolo``: the single-process detector (sequential/cli.py). An entry point, like
runner.py, sits above every package; nothing in yolo/ imports what lies above it."""

import sys

from sequential.cli import main

if __name__ == "__main__":
    sys.exit(main())
