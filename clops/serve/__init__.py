"""serve: ``clops serve``, an OpenAI-compatible HTTP server over one model with continuous
batching (``clops.llm.batch``). Needs the ``serve`` extra: ``pip install 'clops-opencl[serve]'``."""

from .app import APIError, Server, create_app
from .limits import Limits

# (the command line, ``clops.serve.cli``, is of the cli layer: ``clops serve`` imports it)
__all__ = ["APIError", "Limits", "Server", "create_app"]
