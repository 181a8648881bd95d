"""A clops server on loopback for the tests: started once per module in a thread of this
process (uvicorn), stopped at the end."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")


class Running:
    def __init__(self, app, server, **kw) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.server = server
        from clops.serve.cli import config

        self.uv = uvicorn.Server(config(app, port=self.port, log_level="error", **kw))
        self.thread = threading.Thread(target=self.uv.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uv.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.uv.should_exit = True
        self.thread.join(timeout=30)


def start(model, limits=None, timeout: float = 30.0, http: str | None = None, **kw) -> Running:
    """A server of ``model`` (``kw``: ``Server``'s options) behind ``limits``; ``timeout``:
    the seconds a client has for its headers; ``http``: the HTTP protocol (None: the
    server's default)."""
    from clops.serve import Server, create_app

    server = Server(model, **kw)
    return Running(create_app(server, limits), server, timeout=timeout, http=http)
