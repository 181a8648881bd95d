"""Benchmark: the server's own host cost per streamed token, apart from the engine's work.

``clops serve``'s app (Starlette on uvicorn, the runner's engine thread, its protocol and
limits) runs in a process of its own, as a user runs it, on a model's real tokenizer; by
default its ``BatchEngine`` is replaced, in that process alone, by a stand-in whose step
takes no host time: it sleeps as long as a step of the H200 takes (2.41 ms for one row, 3.64
for 16, so ``--step-ms 2.4 --row-us 77``; the sleep releases the interpreter as a wait on
the device does) and gives each running sequence the next token of an English text. The
server's CPU time over each wave of concurrent streamed completions, per streamed token, is
then the server's own: its event loop thread (HTTP, SSE, detokenization, stop strings), the
engine thread's loop between steps, and the rest of the process. ``--engine real`` runs the
real engine instead (its steps' host time then counts on the engine thread).

Every streamed answer is checked against the non-streamed answer to the same request.

    python bench/bench_serve_host.py [--streams 1,16,64] [--new-tokens 128] [--rounds 5]
                                     [--engine stub|real] [--py-spy OUT.txt]
                                     [--json bench/results/serve_host.json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_serve import _port, _prompt, _wait  # noqa: E402

# The stand-in's tokens: an English text in the model's own tokens, over and over
TEXT = ("The quick brown fox jumps over the lazy dog. Servers stream their answers one token "
        "at a time, and each token becomes a small event on the wire: a few bytes of JSON "
        "framed as server-sent events, written to the socket as soon as it is ready. ")


# -- the server's process ---------------------------------------------------------------------
class StubEngine:
    """``BatchEngine``'s interface as the runner uses it, with steps that cost the host
    nothing: a step sleeps ``step_s + row_s`` a row (as a wait on a device does) and gives
    every running sequence its next token of ``tokens`` (a sequence's first token in the step
    that admits it, as a prompt that fits one prefill chunk gets it)."""

    step_s = 2.4e-3
    row_s = 77e-6
    tokens: list[int] = []

    def __init__(self, model: Any, max_batch: int = 8, prefill_chunk: int = 64) -> None:
        self.model, self.max_batch = model, max_batch
        self.context = int(model.max_seq)
        self._lock = threading.RLock()
        self._waiting: list[list[int]] = []  # [seq, max_new, produced]
        self._running: dict[int, list[int]] = {}
        self._next = 0
        self.prompt_tokens = self.generated_tokens = 0

    def add(self, ids: list[int], params: Any, max_new_tokens: int, mask: Any = None) -> int:
        with self._lock:
            seq, self._next = self._next, self._next + 1
            self._waiting.append([seq, int(max_new_tokens), 0])
            self.prompt_tokens += len(ids)
            return seq

    def cancel(self, seq: int) -> None:
        with self._lock:
            self._running.pop(seq, None)
            self._waiting = [s for s in self._waiting if s[0] != seq]

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._waiting or self._running)

    def waiting(self) -> int:
        return len(self._waiting)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"running": len(self._running), "waiting": len(self._waiting),
                    "free_blocks": 1, "total_blocks": 1, "cached_blocks": 0,
                    "prompt_tokens": self.prompt_tokens,
                    "generated_tokens": self.generated_tokens, "reused_prompt_tokens": 0}

    def step(self) -> list:
        from clops.llm.batch import StepOutput

        with self._lock:
            while self._waiting and len(self._running) < self.max_batch:
                s = self._waiting.pop(0)
                self._running[s[0]] = s
            time.sleep(self.step_s + self.row_s * len(self._running))
            out = []
            for seq, s in list(self._running.items()):
                tok = self.tokens[s[2] % len(self.tokens)]
                s[2] += 1
                done = s[2] >= s[1]
                if done:
                    del self._running[seq]
                out.append(StepOutput(seq, tok, -0.5, [], done, "length" if done else None))
            self.generated_tokens += len(out)
            return out

    def embed(self, ids: list[int]) -> Any:
        raise ValueError("the stand-in engine does not embed")


def _cpu_app(app: Any, threads: dict[str, int]) -> Any:
    """``app`` with ``GET /bench/cpu``: the process's CPU nanoseconds and each named thread's
    (by its pthread id), read in the server's process."""

    async def outer(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/bench/cpu":
            await app(scope, receive, send)
            return
        now = {name: time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
               for name, ident in threads.items()}
        now["process"] = time.process_time_ns()
        body = json.dumps(now).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    return outer


def serve(a: argparse.Namespace) -> None:
    """The server's process: ``clops serve``'s app on the model, the stand-in engine in
    place of the real one where asked."""
    import uvicorn

    import clops.llm
    from clops.serve import app as serve_app
    from clops.serve.cli import config

    model = clops.llm.load(a.model or clops.llm.default_model_path(), progress=False,
                           max_seq_len=a.ctx)
    if a.engine == "stub":
        StubEngine.step_s, StubEngine.row_s = a.step_ms * 1e-3, a.row_us * 1e-6
        StubEngine.tokens = model.tokenizer.encode(TEXT)
        serve_app.BatchEngine = StubEngine  # type: ignore[misc,assignment]
    server = serve_app.Server(model, parallel=a.parallel, queue_limit=4096, model_name="m")
    threads = {"loop": threading.main_thread().ident or 0,
               "engine": server.runner._thread.ident or 0}
    app = _cpu_app(serve_app.create_app(server), threads)
    prof = cProfile.Profile() if a.cprofile else None
    if prof is not None:  # the event loop's thread alone (cProfile follows one thread)
        prof.enable()
    try:
        kw = {"http": a.http} if a.http else {}  # (as clops serve runs it, by default)
        uvicorn.Server(config(app, port=a.serve, log_level="warning", **kw)).run()
    except KeyboardInterrupt:  # (uvicorn raises the SIGINT it stopped for again)
        pass
    finally:
        if prof is not None:
            prof.disable()
            prof.dump_stats(a.cprofile)


# -- the clients ------------------------------------------------------------------------------
async def _stream(port: int, reader_writer: tuple, body: bytes) -> bytes:
    """One streamed completion on an open connection: its response body, de-chunked."""
    reader, writer = reader_writer
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: " +
                 str(len(body)).encode() + b"\r\n\r\n" + body)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    out = bytearray()
    while True:  # chunked transfer encoding
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return bytes(out)
        out += chunk[:-2]


def _events(raw: bytes) -> tuple[str, int, int]:
    """(the text, completion tokens by the usage chunk, events) of a streamed answer."""
    text, usage, n = "", -1, 0
    for ev in raw.decode().split("\n\n"):
        if not ev.startswith("data: ") or ev == "data: [DONE]":
            continue
        n += 1
        d = json.loads(ev[6:])
        if d.get("usage"):
            usage = d["usage"]["completion_tokens"]
        text += "".join(c.get("text", "") for c in d.get("choices", []))
    return text, usage, n


def _body(i: int, new: int, words: int, stream: bool = True) -> dict:
    return {"model": "m", "prompt": _prompt(i, words), "max_tokens": new, "temperature": 0,
            "stream": stream, "ignore_eos": True, "stream_options": {"include_usage": True}
            } if stream else {"model": "m", "prompt": _prompt(i, words), "max_tokens": new,
                              "temperature": 0, "ignore_eos": True}


async def _wave(port: int, conns: list, new: int, words: int) -> tuple[float, list[bytes]]:
    """A streamed request on each connection at once: (seconds, the answers' bodies)."""
    bodies = [json.dumps(_body(i, new, words)).encode() for i in range(len(conns))]
    t0 = time.perf_counter()
    raws = await asyncio.gather(*(_stream(port, c, b) for c, b in zip(conns, bodies)))
    return time.perf_counter() - t0, raws


def _cpu(url: str) -> dict[str, int]:
    return httpx.get(url + "/bench/cpu", timeout=30).json()


async def measure(url: str, port: int, streams: int, new: int, words: int, rounds: int,
                  expect: list[str]) -> dict:
    """``rounds`` waves of ``streams`` streamed completions after an unmeasured one: the
    server's CPU microseconds per streamed token (the process, its event loop, its engine
    thread) and tokens/s, medians over the waves."""
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(streams)]
    await _wave(port, conns, 8, words)
    rows = []
    for _ in range(rounds):
        before = await asyncio.to_thread(_cpu, url)
        wall, raws = await _wave(port, conns, new, words)
        after = await asyncio.to_thread(_cpu, url)
        tokens = 0
        for i, raw in enumerate(raws):
            text, used, _ = _events(raw)
            if used != new or text != expect[i % len(expect)]:
                raise RuntimeError(f"stream {i}: {used} tokens, text {text[:80]!r}... is not "
                                   f"the non-streamed answer {expect[i % len(expect)][:80]!r}")
            tokens += used
        spent = {k: (after[k] - before[k]) / 1e3 / tokens for k in after}
        rows.append({"tok_s": tokens / wall, "us_per_token": spent["process"],
                     "loop_us": spent["loop"], "engine_us": spent["engine"],
                     "other_us": spent["process"] - spent["loop"] - spent["engine"]})
    for _, w in conns:
        w.close()
    return {"streams": streams, **{k: statistics.median(r[k] for r in rows) for k in rows[0]},
            "us_per_token_all": [round(r["us_per_token"], 1) for r in rows]}


async def _expected(url: str, n: int, new: int, words: int) -> list[str]:
    """The non-streamed answers of the bench's first ``n`` requests."""
    async with httpx.AsyncClient(timeout=600) as client:
        rs = await asyncio.gather(*(client.post(url + "/v1/completions",
                                                json=_body(i, new, words, stream=False))
                                    for i in range(n)))
    return [r.json()["choices"][0]["text"] for r in rs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="a GGUF file (default: SmolLM2)")
    ap.add_argument("--engine", choices=("stub", "real"), default="stub")
    ap.add_argument("--step-ms", type=float, default=2.4, help="the stand-in's step, ms")
    ap.add_argument("--row-us", type=float, default=77.0,
                    help="the stand-in's step, more for each row, us")
    ap.add_argument("--http", choices=("httptools", "h11"), default=None,
                    help="the server's HTTP protocol (default: as clops serve chooses)")
    ap.add_argument("--streams", default="1,16,64")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=None,
                    help="slots (default: the most streams measured)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--py-spy", default=None, metavar="OUT",
                    help="sample the server with py-spy over the measured waves of the "
                         "most streams; its flat profile to OUT")
    ap.add_argument("--cprofile", default=None, metavar="OUT",
                    help="profile the server's event loop thread with cProfile over the whole "
                         "run; its stats to OUT (pstats)")
    ap.add_argument("--json", default="bench/results/serve_host.json")
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    streams = [int(s) for s in a.streams.split(",") if s]
    a.parallel = a.parallel or max(streams)
    if a.serve is not None:
        serve(a)
        return 0
    port = _port()
    cmd = [sys.executable, os.path.abspath(__file__), "--serve", str(port),
           *(sys.argv[1:] if argv is None else argv)]
    proc = subprocess.Popen(cmd + ["--parallel", str(a.parallel)])
    url = f"http://127.0.0.1:{port}"
    rows, spy = [], None
    try:
        _wait(url, proc)
        expect = asyncio.run(_expected(url, max(streams), a.new_tokens, a.prompt_words))
        for s in streams:
            if a.py_spy and s == max(streams):
                spy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"),
                                        "record", "--pid", str(proc.pid), "-f", "raw", "-o",
                                        a.py_spy, "-r", "200", "--threads"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            r = asyncio.run(measure(url, port, s, a.new_tokens, a.prompt_words, a.rounds,
                                    expect))
            rows.append(r)
            print({k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()},
                  flush=True)
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    load = os.getloadavg()
    print(f"{a.engine} engine, {a.new_tokens} new tokens a request, {a.parallel} slots, "
          f"{platform.machine()}, {os.cpu_count()} cores, load {load[0]:.2f}")
    print(f"{'streams':>7} {'tok/s':>9} {'host us/token':>14} {'loop':>8} {'engine':>8} "
          f"{'other':>8}")
    for r in rows:
        print(f"{r['streams']:>7} {r['tok_s']:>9.1f} {r['us_per_token']:>14.1f} "
              f"{r['loop_us']:>8.1f} {r['engine_us']:>8.1f} {r['other_us']:>8.1f}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"bench": "serve_host", "engine": a.engine, "step_ms": a.step_ms,
                       "row_us": a.row_us, "new_tokens": a.new_tokens, "parallel": a.parallel,
                       "cores": os.cpu_count(), "load": load, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
