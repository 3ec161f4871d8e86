"""`python -m pipeline <command> [key=value ...]` (pipeline/cli.py, main)."""

from pipeline.cli import main

main()
