"""cli: ``python3 -m clops.tests.llama -p "What's Oxygen?" -n 32`` is ``clops run`` (the seed's
spelling of the LLM command, like ``python -m clops.llama``)."""

from __future__ import annotations

import sys

from ..llama import main

if __name__ == "__main__":
    sys.exit(main())
