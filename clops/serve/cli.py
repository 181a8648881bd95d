"""serve, cli: ``clops serve -m MODEL --host --port -np ...`` (``python -m clops.serve``).

Every option is checked before the model loads; a mistake (an option out of range, a model
file that is not there, a device that is not there, a model the server cannot run) ends with
one line on stderr and status 2. If the engine's thread ever stops, the server stops too, with
status 1, rather than answering nothing. The options the model subcommands share are spelled as
in ``clops run`` and ``clops chat`` (``clops.cli.args``); the model may also be given as the
first argument, as before.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .. import _config
from ..cli import args as cli
from ..cli import serve_ray
from ..cli.args import USAGE_ERROR, one_line

PROG = "clops serve"
MAX_PARALLEL = 1024


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    ap = cli.Parser(prog=prog, description=(
        "An OpenAI-compatible server (chat, completions, embeddings, models, health, metrics "
        "and a chat page at /) with continuous batching."))
    # (the model as the first argument: the spelling before -m)
    ap.add_argument("model_arg", nargs="?", default=None, metavar="MODEL", help=argparse.SUPPRESS)
    cli.add_model_options(ap, ctx_default=4096, ctx_min=2,
                          ctx_help="the longest prompt + completion, in tokens")
    ap.add_argument("--host", default="127.0.0.1", type=cli.text("host"),
                    help="the address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=cli.whole(1, 65535), default=8080,
                    help="the port to listen on (default 8080)")
    ap.add_argument("-np", "--parallel", type=cli.whole(1, MAX_PARALLEL), default=4, metavar="N",
                    help="sequences decoded together (slots; default 4)")
    ap.add_argument("--queue", type=cli.whole(0), default=64,
                    help="requests that may wait for a slot; past it the server answers 429")
    ap.add_argument("--row-invariant", action="store_true",
                    help="every step through the batched kernels, so that a request's values "
                         "never depend on the others running (by default a lone decode row on "
                         "NVIDIA GPUs takes the faster single-sequence kernel)")
    ap.add_argument("--name", default=None, type=cli.text("name"),
                    help="the model's name in the API")
    limits = ap.add_argument_group("limits of a request (defaults a public server can keep)")
    limits.add_argument("-n", "--n-predict", "--max-tokens", dest="max_tokens",
                        type=cli.whole(1), default=None, metavar="N",
                        help="the most tokens one request may generate (default: the context). "
                             "Without max_tokens a completion gets 16, a chat completion the "
                             "rest of the context, within this")
    limits.add_argument("--max-body", type=_bytes, default=8 << 20, metavar="BYTES",
                        help="the largest request body (default 8MiB; e.g. 512KB, 16MiB): "
                             "past it 413")
    limits.add_argument("--timeout", type=cli.number(0.0, low_open=True), default=30.0,
                        metavar="SECONDS",
                        help="time a client has to send its request's headers, and again its "
                             "body (default 30): past it the connection is closed (408)")
    limits.add_argument("--api-key", default=None, type=cli.text("API key"),
                        help="ask every API request for 'Authorization: Bearer KEY' (401 "
                             "without it); also from CLOPS_API_KEY. /health and the chat page "
                             "stay open")
    limits.add_argument("--cors-origins", default="", metavar="ORIGINS",
                        help="comma-separated web origins whose pages may call the API "
                             "(e.g. https://example.org; * for any); none by default")
    limits.add_argument("--parse-special", action="store_true",
                        help="read special-token text inside messages (<|im_start|>, ...) as "
                             "special tokens, as older versions did; by default only the chat "
                             "template's own markers are special")
    serve_ray.add_options(ap)
    return ap


def _bytes(raw: str) -> int:
    try:
        n = _config.parse_bytes(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n < 1024:
        raise argparse.ArgumentTypeError(f"{raw!r} is too small: give at least 1KB")
    return n


def _load(a: argparse.Namespace) -> Any:
    cli.check_model_path(a.model)
    device = cli.open_device(a.device)
    return cli.load_model(a.model, device, a.ctx_size, True, a.kv_cache, a.tensor_split)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    ap = parser(prog)
    a = ap.parse_args(argv)
    if a.model_arg is not None:
        if a.model is not None and a.model != a.model_arg:
            ap.error(f"two models given ({a.model_arg!r} and -m {a.model!r}): give one")
        a.model = a.model_arg
    if serve_ray.wanted(ap, a):
        return serve_ray.main(a, prog)
    try:
        import uvicorn
    except ImportError:
        print(f"{prog}: error: the server needs uvicorn and starlette: pip install "
              "'clops-opencl[serve]'", file=sys.stderr)
        return USAGE_ERROR
    from .app import Server, create_app
    from .limits import Limits

    api_key = a.api_key or _config.api_key()
    try:
        model = _load(a)
        name = a.name or os.path.basename(a.model or model.source_path)
        server = Server(model, parallel=a.parallel, queue_limit=a.queue, model_name=name,
                        max_tokens=a.max_tokens, parse_special=a.parse_special,
                        row_invariant=a.row_invariant)
    except (cli.Refused, ValueError) as e:
        print(f"{prog}: error: {one_line(str(e))}", file=sys.stderr)
        return USAGE_ERROR
    limits = Limits(api_key=api_key, max_body=a.max_body, read_timeout=a.timeout,
                    cors_origins=tuple(o.strip() for o in a.cors_origins.split(",")
                                       if o.strip()))
    uv = uvicorn.Server(config(create_app(server, limits), a.host, a.port, a.timeout))
    died: list[BaseException] = []

    def engine_died(e: BaseException) -> None:
        died.append(e)
        uv.should_exit = True

    server.runner.on_death = engine_died
    print(f"{prog}: {name} on {model.where}, {a.parallel} slots, "
          f"http://{a.host}:{a.port}/{' (API key required)' if api_key else ''}",
          file=sys.stderr)
    uv.run()
    if died:
        print(f"{prog}: stopped: the engine thread failed ({type(died[0]).__name__}: "
              f"{one_line(str(died[0]))})", file=sys.stderr)
        return 1
    return 0


def config(app: Any, host: str = "127.0.0.1", port: int = 8080, timeout: float = 30.0,
           http: str | None = None, **kw: Any) -> Any:
    """uvicorn's configuration for the server: its own HTTP protocol (closing connections
    whose headers come too slowly; ``http`` "httptools" or "h11", by default httptools where
    it is installed) and quiet logs."""
    import uvicorn

    from .limits import protocol

    return uvicorn.Config(app, host=host, port=port, log_level=kw.pop("log_level", "warning"),
                          http=protocol(timeout, http), lifespan="on", **kw)
