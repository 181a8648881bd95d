"""cli: the ``clops`` command line's subcommands (``run``, ``chat``, ``bench``) and the options
they share with ``clops serve``: llama.cpp's spellings, each checked before a model loads."""
