"""Benchmark: an OpenAI-compatible server under concurrent streams: aggregate generated tokens/s
and time to first token at 1, 4, 16 and 64 concurrent streaming completions, for ``clops serve``
and, with ``--llama-server PATH``, for llama.cpp's ``llama-server`` on the same GGUF file in
the same run (``scripts/llama_cpp.sh build TARBALL DIR cuda llama-server``). Every request
asks for the same number of new tokens past end-of-text (``ignore_eos``), greedy.

    python bench/bench_serve.py [-m model.gguf] [--device gpu] [--streams 1,4,16,64]
                                [--llama-server PATH] [--json bench/results/serve.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WORDS = ("oxygen hydrogen carbon nitrogen helium neon argon sodium potassium calcium iron "
         "copper silver gold zinc tin lead mercury").split()


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _wait(url: str, proc: subprocess.Popen | None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up")


def _prompt(i: int, words: int) -> str:
    return " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words))


def one(client: httpx.Client, url: str, i: int, new: int, words: int,
        ) -> tuple[float, float, int]:
    """(seconds to the first token, seconds in all, tokens) of one streamed completion."""
    body = {"model": "m", "prompt": _prompt(i, words), "max_tokens": new, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, tokens, chunks = None, None, 0
    with client.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                tokens = d["usage"]["completion_tokens"]
            for c in d.get("choices", []):
                if c.get("text"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return first if first is not None else total, total, tokens if tokens else chunks


def _clients(n: int) -> list[httpx.Client]:
    """A client per stream, made before any timing: making one (its TLS context, even for
    plain HTTP) took about 25 ms of the client's interpreter, and 16 at once added hundreds of
    milliseconds to every request's first token, on either server. A client keeps its
    connection open between requests, as the ``openai`` package does."""
    return [httpx.Client(timeout=600) for _ in range(n)]


def wave(clients: list[httpx.Client], url: str, new: int, words: int) -> list:
    """A request on each client at once: [(ttft s, total s, tokens)]."""
    with ThreadPoolExecutor(len(clients)) as ex:
        return list(ex.map(lambda i: one(clients[i], url, i, new, words), range(len(clients))))


def warm(url: str, streams: int, words: int) -> None:
    """An unmeasured wave of ``streams`` short requests: a server's first ones pay for what it
    builds or touches once (clops: step plans and kernels for each batch size as it grows
    and shrinks through them; the runtime's first runs of each)."""
    clients = _clients(streams)
    wave(clients, url, 8, words)
    for c in clients:
        c.close()


def measure(url: str, streams: int, new: int, words: int, rounds: int = 3) -> dict:
    """``rounds`` waves of ``streams`` concurrent requests, after one unmeasured wave (the
    step plans and kernels of its batch sizes built: clops compiles them at first use)."""
    clients = _clients(streams)
    wave(clients, url, 8, words)
    ttft, tps = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        res = wave(clients, url, new, words)
        wall = time.perf_counter() - t0
        ttft += [r[0] for r in res]
        tps.append(sum(r[2] for r in res) / wall)
    for c in clients:
        c.close()
    return {"streams": streams, "tok_s": statistics.median(tps),
            "ttft_ms_median": 1e3 * statistics.median(ttft), "ttft_ms_max": 1e3 * max(ttft)}


def _start(cmd: list[str], cwd: str | None = None):
    """A server process of ``cmd`` (which names the port) once its /health answers: (url, its
    log file, a stop, the process). The log goes to a file: a pipe nobody reads fills up
    (64 KB) and stops the server in its next write (llama-server's CUDA build logs every
    request)."""
    port = int(cmd[cmd.index("--port") + 1])
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, proc)
    except RuntimeError:
        log.seek(0)
        print(log.read()[-3000:], file=sys.stderr)
        proc.kill()
        raise
    return url, log, (lambda: (proc.terminate(), proc.wait(30), log.close())), proc


def start_clops(model: str | None, device: str | None, parallel: int, ctx: int,
                with_process: bool = False):
    """``clops serve`` in a process of its own, as a user runs it (and as llama-server runs):
    the clients' threads here do not share its interpreter. (url, stop, device name[, the
    process])."""
    cmd = [sys.executable, "-m", "clops.serve", *([model] if model else []), "--port",
           str(_port()), "--parallel", str(parallel), "--ctx-size", str(ctx), "--queue", "1024",
           "--name", "m", *(["--device", device] if device else [])]
    url, log, stop, proc = _start(cmd,
                                  os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    log.seek(0)
    # its line "clops serve: NAME on DEVICE, N slots, URL" (a runtime's warnings may come first)
    said = next((ln for ln in log if ln.startswith("clops serve:")), "")
    dev = said.split(" on ", 1)[1].rsplit(",", 2)[0] if " on " in said else "?"
    return (url, stop, dev, proc) if with_process else (url, stop, dev)


def start_llama(binary: str, model: str, parallel: int, ctx: int, extra: list[str]):
    url, _, stop, _ = _start([binary, "-m", model, "--port", str(_port()), "-np", str(parallel),
                           "-c", str(ctx * parallel), *extra])
    return url, stop


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="a GGUF file (default: SmolLM2)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--streams", default="1,4,16,64")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--parallel", type=int, default=None,
                    help="slots of both servers (default: the most streams measured, <= 64)")
    ap.add_argument("--ctx", type=int, default=512, help="context per slot")
    ap.add_argument("--llama-server", default=None, metavar="PATH")
    ap.add_argument("--llama-server-args", default="-ngl 99")
    ap.add_argument("--json", default="bench/results/serve.json")
    a = ap.parse_args(argv)
    streams = [int(s) for s in a.streams.split(",") if s]
    parallel = a.parallel or min(max(streams), 64)
    import clops.llm

    model = a.model or clops.llm.default_model_path()
    rows = []
    url, stop, dev = start_clops(model, a.device, parallel, a.ctx)
    try:
        warm(url, max(streams), a.prompt_words)
        for s in streams:
            r = measure(url, s, a.new_tokens, a.prompt_words)
            rows.append({"engine": f"clops serve ({dev[:30]})", **r})
            print(rows[-1], flush=True)
    finally:
        stop()
    if a.llama_server:
        url, stop = start_llama(a.llama_server, model, parallel, a.ctx,
                                a.llama_server_args.split())
        try:
            warm(url, max(streams), a.prompt_words)
            for s in streams:
                r = measure(url, s, a.new_tokens, a.prompt_words)
                rows.append({"engine": "llama-server", **r})
                print(rows[-1], flush=True)
        finally:
            stop()
    base = next((r["tok_s"] for r in rows if r["streams"] == 1 and "clops" in r["engine"]),
                None)
    print(f"{os.path.basename(model)}, {a.new_tokens} new tokens a request, {parallel} slots, "
          f"{platform.machine()}")
    print(f"{'engine':<44} {'streams':>7} {'tok/s':>9} {'x 1 stream':>10} "
          f"{'TTFT ms (median)':>17} {'vs llama-server':>15}")
    for r in rows:
        peer = next((p["tok_s"] for p in rows if p["engine"] == "llama-server"
                     and p["streams"] == r["streams"]), None)
        vs = f"{r['tok_s'] / peer:.2f}x" if peer and "clops" in r["engine"] else ""
        x1 = f"{r['tok_s'] / base:.1f}x" if base and "clops" in r["engine"] else ""
        print(f"{r['engine']:<44} {r['streams']:>7} {r['tok_s']:>9.1f} {x1:>10} "
              f"{r['ttft_ms_median']:>17.0f} {vs:>15}")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"bench": "serve", "model": os.path.basename(model), "parallel": parallel,
                   "new_tokens": a.new_tokens, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
