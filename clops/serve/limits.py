"""serve, limits: what the server takes from a client before a route sees the request: an API key,
a body no larger than ``max_body`` bytes read within ``read_timeout`` seconds (an ASGI
middleware), and request headers within ``read_timeout`` seconds of a connection's start or its
last response (a uvicorn protocol; uvicorn alone keeps a connection that drips header lines
open for ever).

The protocol is uvicorn's httptools one where httptools is installed (a C parser, each
streamed chunk framed in one write: a streamed token's host time on two EPYC cores, with
nothing but the streaming itself, 54-72 us on h11 against 28-54 at 16 and 64 streams), else its
h11 one; both keep the header deadline and a limit on a request's headers.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.util
import json
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# (uvicorn's httptools protocol needs httptools, one of uvicorn's "standard" extras)
HAS_HTTPTOOLS = importlib.util.find_spec("httptools") is not None

# The scope's key of the server's own send, as the middleware was given it
RAW_SEND = "clops.send"
# The most bytes of a request line and headers httptools takes (h11 holds at most 16 KiB of an
# incomplete request, and takes more where it comes at once)
MAX_HEADER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """What one request may be. ``api_key`` None: no key asked. ``open_paths`` answer without
    a key (the health check and the chat page; the page asks for the key itself).
    ``cors_origins``: the web origins whose pages may call the API (``*``: any), none by
    default."""

    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    max_body: int = 8 << 20
    read_timeout: float = 30.0
    open_paths: tuple[str, ...] = ("/", "/health")


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def _refuse(send: Any, status: int, message: str, code: str,
                  extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps(error_body(message, code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            # the rest of the body is not read: the connection cannot go on
                            (b"connection", b"close"), *extra]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class LimitsMiddleware:
    """Checks the key, reads the whole body under the limits, then hands the app the body as
    one message (and the client's later messages, such as its disconnect, as they come)."""

    def __init__(self, app: Any, limits: Limits) -> None:
        self.app, self.limits = app, limits
        self.refused: dict[str, int] = {"unauthorized": 0, "too_large": 0, "timeout": 0}

    def _authorized(self, scope: MutableMapping[str, Any]) -> bool:
        key = self.limits.api_key
        if key is None or scope["path"] in self.limits.open_paths or scope["method"] == "OPTIONS":
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    given.strip().encode(), key.encode())
        return False

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lim = self.limits
        if not self._authorized(scope):
            self.refused["unauthorized"] += 1
            await _refuse(send, 401, "a valid API key is required: send 'Authorization: "
                          "Bearer <key>' (the key the server was started with)",
                          code="invalid_api_key",
                          extra=((b"www-authenticate", b'Bearer realm="clops"'),))
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > lim.max_body:
                self.refused["too_large"] += 1
                await _refuse(send, 413, f"the request body has {int(value)} bytes; this "
                              f"server takes at most {lim.max_body}", code="body_too_large")
                return
        body = bytearray()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lim.read_timeout
        while True:
            try:
                msg = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                self.refused["timeout"] += 1
                await _refuse(send, 408, f"the request body did not arrive within "
                              f"{lim.read_timeout:g} s", code="request_timeout")
                return
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > lim.max_body:
                self.refused["too_large"] += 1
                await _refuse(send, 413, f"the request body is larger than {lim.max_body} "
                              "bytes, the most this server takes", code="body_too_large")
                return
            if not msg.get("more_body", False):
                break
        whole: dict | None = {"type": "http.request", "body": bytes(body), "more_body": False}
        del body

        async def replay() -> dict:
            nonlocal whole
            if whole is not None:
                msg, whole = whole, None
                return msg
            return await receive()

        # (the server's own send, for a streamed response's body: see app.EventStream)
        scope[RAW_SEND] = send
        await self.app(scope, replay, send)


class _HeaderDeadline:
    """The header deadline of either protocol: a connection whose request line and headers have
    not all come within ``header_timeout`` seconds of its start or of its last response is
    closed. A protocol says whether it waits for headers (``_awaiting_headers``)."""

    header_timeout = 30.0
    _header_timer: asyncio.TimerHandle | None = None
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def _awaiting_headers(self) -> bool:
        raise NotImplementedError

    def _arm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _headers_late(self) -> None:
        self._header_timer = None
        if self._awaiting_headers() and not self.transport.is_closing():
            self.transport.close()

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    # (the protocol's own callbacks, after this class in the order of bases)
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]


class TimedH11Protocol(_HeaderDeadline, H11Protocol):
    """uvicorn's h11 protocol with the header deadline."""

    def _awaiting_headers(self) -> bool:
        # IDLE: no whole request line and headers since the connection or the last response
        return self.conn.their_state is h11.IDLE


if HAS_HTTPTOOLS:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class TimedHttpToolsProtocol(_HeaderDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol with the header deadline, and h11's limit of
        ``MAX_HEADER_BYTES`` on a request's line and headers (past it: 400, closed, as h11
        answers)."""

        _headed = 0  # requests whose headers have all come
        _answered = 0  # responses sent whole
        _header_bytes = 0  # of the request being read

        def _awaiting_headers(self) -> bool:
            return self._headed <= self._answered

        def _count(self, n: int) -> None:
            self._header_bytes += n
            if self._header_bytes > MAX_HEADER_BYTES:
                # (raised in the parser's callback: uvicorn answers 400 and closes)
                raise ValueError(f"request headers past {MAX_HEADER_BYTES} bytes")

        def on_message_begin(self) -> None:
            self._header_bytes = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._headed += 1
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            self._answered += 1
            super().on_response_complete()


PROTOCOLS = ("httptools", "h11") if HAS_HTTPTOOLS else ("h11",)


def protocol(header_timeout: float, kind: str | None = None) -> type:
    """The protocol class for uvicorn's ``http=`` with this header timeout: ``kind``
    "httptools" or "h11" (None: httptools where it is installed)."""
    kind = kind or PROTOCOLS[0]
    if kind not in PROTOCOLS:
        raise ValueError(f"the HTTP protocol {kind!r} is not one of {', '.join(PROTOCOLS)} "
                         "(httptools needs 'pip install httptools')")
    base = TimedHttpToolsProtocol if kind == "httptools" else TimedH11Protocol
    return type(f"Clops{base.__name__[5:]}", (base,), {"header_timeout": header_timeout})
