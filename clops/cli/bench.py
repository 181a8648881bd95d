"""cli, bench: ``clops bench``, how fast the model runs on the device, as llama-bench measures it.

Two tests, each repeated ``-r`` times after one untimed warm-up run: prompt processing
(``pp512``: a prompt of ``-p`` random tokens, until its first new token is on the host) and text
generation (``tg128``: ``-n`` tokens decoded one at a time, greedy, after a one-token prompt).
Each is printed as tokens per second, the median of the runs with their least and greatest and
the spread, half the range, as a share of the median; ``--json`` prints every run instead. A
CPU's figures carry its instruction set, which they depend on."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from . import args as cli

if TYPE_CHECKING:
    from ..llm import Model
    from ..runtime import CLDevice

PROG = "clops bench"
DESCRIPTION = """\
Measure the model on the device as llama-bench does: prompt processing (ppN: N random tokens
until the first new token is on the host) and text generation (tgN: N tokens decoded one at a
time), each after a warm-up run, repeated -r times; the table gives the median tokens/s, the
least and greatest, and the spread (half the range, as a share of the median).

example: clops bench -m model.gguf -p 512 -n 128 -r 5 --json"""


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = cli.Parser(prog=prog, description=DESCRIPTION,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-p", "--n-prompt", type=cli.whole(0), default=512, metavar="N",
                   help="tokens of the prompt-processing test (default 512; 0: no such test)")
    p.add_argument("-n", "--n-gen", type=cli.whole(0), default=128, metavar="N",
                   help="tokens of the generation test (default 128; 0: no such test)")
    p.add_argument("-r", "--repetitions", type=cli.whole(1, 1000), default=3, metavar="N",
                   help="timed runs of each test (default 3)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    cli.add_model_options(p, ctx_default=None,
                          ctx_help="tokens of context to allocate (default: what the tests need)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def cpu_isa() -> str:
    """The widest vector instructions of this machine's processor, from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return "instruction set unknown"
    for flag, name in (("avx512_vnni", "AVX-512 VNNI"), ("avx512f", "AVX-512"),
                       ("avx2", "AVX2"), ("neon", "NEON"), ("asimd", "NEON")):
        if flag in flags:
            return name
    return "no AVX2"


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                   if os.path.isfile(os.path.join(path, f)))
    return os.path.getsize(path)


def prompt_rate(model: Model, ids: list[int]) -> float:
    """Tokens a second of the prompt ``ids``, until its first new token is on the host."""
    for _ in model.generate_ids(ids, max_new_tokens=1):
        pass
    return model.stats.prefill_tps


def generation_rate(model: Model, first: int, n: int) -> float:
    """Tokens a second of ``n`` decode steps after the one-token prompt ``first``."""
    for _ in model.generate_ids([first], max_new_tokens=n + 1):
        pass
    return model.stats.decode_tps


def summary(name: str, tokens: int, rates: list[float]) -> dict[str, Any]:
    median = statistics.median(rates)
    return {"test": name, "tokens": tokens, "runs": len(rates), "tokens_per_s": rates,
            "median": median, "min": min(rates), "max": max(rates),
            "stdev": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "spread": (max(rates) - min(rates)) / 2 / median if median > 0 else 0.0}


def run_tests(model: Model, n_prompt: int, n_gen: int, repetitions: int,
              progress: bool = False) -> list[dict[str, Any]]:
    """Each test, warmed up once, then timed ``repetitions`` times."""
    import numpy as np

    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    tests: list[tuple[str, int, Any]] = []
    if n_prompt:
        ids = [int(i) for i in rng.integers(0, vocab, n_prompt)]
        tests.append((f"pp{n_prompt}", n_prompt, lambda: prompt_rate(model, ids)))
    if n_gen:
        first = int(rng.integers(0, vocab))
        tests.append((f"tg{n_gen}", n_gen, lambda: generation_rate(model, first, n_gen)))
    out = []
    for name, tokens, once in tests:
        if progress:
            print(f"[{name}: warm-up, then {repetitions} runs]", file=sys.stderr, flush=True)
        once()
        out.append(summary(name, tokens, [once() for _ in range(repetitions)]))
    return out


def device_text(dev: CLDevice) -> str:
    what = f"{dev.kind}, {dev.backend}"
    return f"{dev.name} ({what}, {cpu_isa()})" if dev.kind == "cpu" else f"{dev.name} ({what})"


def table(results: list[dict[str, Any]]) -> str:
    rows = [("test", "t/s", "min", "max", "spread")]
    rows += [(r["test"], f"{r['median']:.2f}", f"{r['min']:.2f}", f"{r['max']:.2f}",
              f"± {100 * r['spread']:.1f}%") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(row: tuple[str, ...]) -> str:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                 enumerate(zip(row, widths, strict=True))]
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(rows[0]), rule] + [line(r) for r in rows[1:]])


def _run(args: argparse.Namespace) -> int:
    if not args.n_prompt and not args.n_gen:
        raise cli.Refused("-p and -n are both 0: nothing to measure")
    # (a prompt and its first new token; a one-token prompt and n + 1 new tokens)
    need = max(args.n_prompt + 1 if args.n_prompt else 0, args.n_gen + 2 if args.n_gen else 0)
    if args.ctx_size is not None and args.ctx_size < need:
        raise cli.Refused(f"-c/--ctx-size {args.ctx_size} is too small for the tests: give at "
                          f"least {need}, or leave it out")
    cli.check_model_path(args.model)
    device = cli.open_device(args.device)
    t0 = time.perf_counter()
    model = cli.load_model(args.model, device, args.ctx_size or need, not args.quiet,
                           args.kv_cache, args.tensor_split)
    if model.max_seq < need:
        raise cli.Refused(f"the model's context is {model.max_seq} tokens, and the tests need "
                          f"{need}: give smaller -p and -n")
    c = model.config
    head = (f"{c.arch}, {c.n_layers} layers, dim {c.dim}, {_size(model.source_path) / 2**20:.1f} "
            f"MiB ({model.source_path}) on {device_text(model.device)}"
            + (f", layers split: {model.where}" if len(model.devices) > 1 else ""))
    if not args.quiet:
        print(f"[{head}, loaded in {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    results = run_tests(model, args.n_prompt, args.n_gen, args.repetitions,
                        progress=not args.quiet)
    if args.json:
        dev = model.device
        print(json.dumps({
            "model": {"path": model.source_path, "arch": c.arch, "layers": c.n_layers,
                      "dim": c.dim, "bytes": _size(model.source_path)},
            "device": {"selector": dev.selector, "name": dev.name, "kind": dev.kind,
                       "backend": dev.backend,
                       "isa": cpu_isa() if dev.kind == "cpu" else None},
            "stages": [{"selector": st.device.selector, "first_layer": st.first,
                        "layers": st.stop - st.first} for st in model.stages],
            "kv_cache": "float16" if model.kv_half else "float32",
            "ctx_size": model.max_seq, "tests": results}, indent=2))
    else:
        print(f"{head}; {args.repetitions} run(s) a test, after a warm-up")
        print(table(results))
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    return cli.guarded(prog, lambda: _run(args))
