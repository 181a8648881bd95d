"""Entry points under the seed's own spellings (``python3 -m clops.tests.llama``); the test
suite itself lives in the repository's ``tests/`` folder."""
