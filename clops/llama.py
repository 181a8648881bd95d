"""cli: ``python -m clops.llama`` is ``clops run`` (text generation: ``-p "What's Oxygen?" -n
32``), kept for the commands users already have."""

from __future__ import annotations

import argparse
import sys

from .cli.run import _prompt_tokens
from .cli.run import build_parser as _build_parser
from .cli.run import main as _main

PROG = "python -m clops.llama"

__all__ = ["PROG", "_prompt_tokens", "build_parser", "main"]


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    return _build_parser(prog)


def main(argv: list[str] | None = None) -> int:
    return _main(argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
