"""serve: ``clops serve``, an OpenAI-compatible HTTP server over one model with continuous
batching (``clops.llm.batch``). Needs the ``serve`` extra: ``pip install 'clops[serve]'``."""

from .app import APIError, Server, create_app
from .cli import main

__all__ = ["APIError", "Server", "create_app", "main"]
