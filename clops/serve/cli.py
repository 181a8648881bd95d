"""serve, cli: ``clops serve [MODEL] --host --port --parallel`` (also ``python -m clops.serve``)."""

from __future__ import annotations

import argparse
import sys


def parser(prog: str = "clops serve") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=(
        "An OpenAI-compatible server (chat, completions, embeddings, models, health, metrics "
        "and a chat page at /) with continuous batching."))
    ap.add_argument("model", nargs="?", default=None,
                    help="a .gguf file or a model directory (default: the bundled SmolLM2)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--parallel", "-np", type=int, default=4,
                    help="sequences decoded together (slots)")
    ap.add_argument("--ctx-size", "-c", type=int, default=4096,
                    help="the longest prompt + completion, in tokens")
    ap.add_argument("--queue", type=int, default=64,
                    help="requests that may wait for a slot; past it the server answers 429")
    ap.add_argument("--device", default=None, help="an OpenCL device selector")
    ap.add_argument("--kv-cache", choices=("float16", "float32"), default=None,
                    help="type of the KV cache (default: float16 on GPUs, float32 on CPUs)")
    ap.add_argument("--name", default=None, help="the model's name in the API")
    return ap


def main(argv: list[str] | None = None, prog: str = "clops serve") -> int:
    a = parser(prog).parse_args(argv)
    try:
        import uvicorn
    except ImportError:
        print("clops serve needs uvicorn and starlette: pip install 'clops[serve]'",
              file=sys.stderr)
        return 2
    import os

    import clops.llm

    from .app import Server, create_app

    model = clops.llm.load(a.model, device=a.device, max_seq_len=a.ctx_size, kv_cache=a.kv_cache)
    name = a.name or os.path.basename(a.model or clops.llm.default_model_path())
    server = Server(model, parallel=a.parallel, queue_limit=a.queue, model_name=name)
    print(f"clops serve: {name} on {model.device.name}, {a.parallel} slots, "
          f"http://{a.host}:{a.port}/", file=sys.stderr)
    uvicorn.run(create_app(server), host=a.host, port=a.port, log_level="warning")
    return 0
