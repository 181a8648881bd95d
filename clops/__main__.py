"""The clops command line: language models on any OpenCL device (run, chat, serve, bench) and the
devices themselves (info, demo, cache). ``clops <command> --help`` tells more of each."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def info(probe: bool = True) -> int:
    import clops
    from clops.runtime import cmdbuf, discovery

    devs = clops.devices()
    if not devs:
        print(discovery.NO_PLATFORM_HELP)
        return 1
    default = clops.device()
    print(f"clops {clops.__version__}: {len(devs)} OpenCL device(s); default {default.selector}")
    from clops.runtime.device import DEFAULT_WHY

    if DEFAULT_WHY:
        print("  why the default: " + "; ".join(DEFAULT_WHY))
    for d in devs:
        c = d.caps
        mark = "*" if d is default else " "
        print(f"{mark} {d.selector:<16} {d.name}")
        print(f"    platform        {d.platform_version}")
        print(f"    backend         {d.backend} ({c.vendor}), driver {c.driver}")
        print(f"    compute units   {c.compute_units}, max work-group {c.max_work_group}")
        print(f"    memory          {_fmt_bytes(c.global_mem)} global, "
              f"{_fmt_bytes(c.max_alloc)} max allocation, {_fmt_bytes(c.local_mem)} local")
        flags = [f"fp64={'yes' if c.fp64 else 'no'}",
                 f"subgroups={'yes' if c.subgroups else 'no'}"]
        if probe:
            flags.append(f"builds={'yes' if d.probe('builds') else 'NO'}")
            flags.append(f"fp16-runs={'yes' if d.probe('fp16') else 'no'}")
            flags.append(f"nvidia-ptx={'yes' if d.probe('nvidia_ptx') else 'no'}")
        print(f"    capabilities    {', '.join(flags)}")
        if probe and not d.probe("builds"):
            print(f"    cannot build    {_why_no_builds(d)}")
        if probe and d.kind == "cpu":
            from clops.kernels import gemm

            ok = gemm.cpu_kernel_works(d, "float32")
            print("    cpu products    " + ("gemm_cpu (vectorized)" if ok else
                  "FAILED the gemm_cpu probe (CLOPS_DEBUG=1 says why): the portable kernel, "
                  "slower; not chosen by default where another CPU runtime passes"))
            from clops.kernels import native_cpu

            why = native_cpu.why_not(d)
            print("    native products " + (
                f"4- and 8-bit LLM weights meet int8 rows natively ({native_cpu.isa()})"
                if why is None else f"off: {why}"))
        recorded, why = cmdbuf.support(d.queue.cl_queue)
        print(f"    launch plans    {'one command buffer a replay' if recorded else why}")
    return 0


def placement(model: str | None, device: str | None, ctx_size: int | None,
              kv_cache: str | None, split: list[float] | None) -> int:
    """Where ``clops run/serve`` with these options put the model's layers (nothing loaded)."""
    from clops import llm
    from clops.cli.args import check_model_path

    check_model_path(model)
    if split is not None and len(split) != len((device or "").split(",")):
        raise ValueError(f"--tensor-split gives {len(split)} shares: give one a device of "
                         "--device")
    stages = llm.place(model, device, max_seq_len=ctx_size, kv_cache=kv_cache, split=split)
    cfg_layers = stages[-1].stop
    print(f"{model or 'the bundled SmolLM2'}: {cfg_layers} layers on {len(stages)} device(s)")
    for st in stages:
        print("  " + st.describe(cfg_layers))
    return 0


def _why_no_builds(d: Any) -> str:
    """What the device's compiler says to a one-line kernel (the builds probe failed)."""
    try:
        d.build("__kernel void k(__global int *x) { x[0] = 1; }")
    except Exception as e:  # the reason is the whole point here
        return str(e).splitlines()[0][:400]
    return "a kernel builds, but running it failed (the driver does not complete it)"


def demo() -> int:
    import numpy as np

    import clops

    dev = clops.device()
    print(f"device: {dev}")
    if hasattr(clops, "asarray"):
        xp = clops
        rng = np.random.default_rng(0)
        a, b, c = (rng.standard_normal((1024, 1024), dtype=np.float32) for _ in range(3))
        t0 = time.perf_counter()
        out = xp.sum(xp.asarray(a) * xp.asarray(b) + xp.asarray(c), axis=1)
        got = np.asarray(out)
        dt = time.perf_counter() - t0
        ref = (a * b + c).sum(axis=1)
        ok = np.allclose(got, ref, rtol=1e-4, atol=1e-3)
        print(f"(a*b + c).sum(axis=1) on 1024x1024 float32: {'matches numpy' if ok else 'WRONG'}"
              f" ({dt * 1e3:.1f} ms including build)")
        return 0 if ok else 1
    # Runtime-only demo: a kernel through the program cache and the pool.
    src = "__kernel void axpy(float a, __global const float *x, __global float *y)" \
          "{ size_t i = get_global_id(0); y[i] = a * x[i] + y[i]; }"
    k = dev.build(src).axpy
    x = np.arange(1 << 16, dtype=np.float32)
    y = np.ones_like(x)
    bx, by = dev.alloc(x.nbytes), dev.alloc(y.nbytes)
    dev.write(bx, x)
    dev.write(by, y)
    dev.launch(k, (x.size,), None, [np.float32(2), bx, by], reads=[bx], writes=[by])
    result = np.empty_like(y)
    dev.read(result, by)
    ok = np.array_equal(result, 2 * x + y)
    print(f"axpy on {x.size} floats: {'matches numpy' if ok else 'WRONG'}")
    return 0 if ok else 1


def cache(trim: bool = False, clear: bool = False) -> int:
    """Where the kernel caches are, what they hold and their limit; trim or clear them."""
    from . import _config
    from .runtime import cachefiles, cachesize

    root = cachefiles.root()
    limit = _config.cache_limit()
    if clear or trim:
        freed = cachesize.clear() if clear else cachesize.trim(limit)
        print(f"removed {freed / 2**20:.1f} MiB")
    used = cachesize.usage()
    print(f"cache folder    {root} (CLOPS_CACHE_DIR)")
    for name, nbytes in used.items():
        print(f"  {name + '/':<14}{nbytes / 2**20:.1f} MiB")
    limit_text = ("none" if not limit else f"{limit / 2**30:.2f} GiB" if limit >= 2**30
                  else f"{limit / 2**20:.1f} MiB")
    print(f"limit           {limit_text} (CLOPS_CACHE_LIMIT; trimmed when a process that "
          "compiled ends, least recently used first)")
    return 0


# name -> (module whose main(argv, prog) runs it, one line for `clops --help`)
MODEL_COMMANDS = {
    "run": ("clops.cli.run", "generate text from a prompt, streamed to stdout"),
    "chat": ("clops.cli.chat", "talk with the model: an interactive conversation"),
    "serve": ("clops.serve.cli", "an OpenAI-compatible HTTP server with continuous batching"),
    "bench": ("clops.cli.bench", "measure prompt processing and generation speed (tokens/s)"),
}


DESCRIPTION = ("The clops command line: language models on any OpenCL device (run, chat, serve, "
               "bench) and the devices themselves (info, demo, cache). `clops COMMAND --help` "
               "tells more of each.")


def parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser (for --help), and the parsers of the commands of this module."""
    from .cli.args import Parser

    p = Parser(prog="clops", description=DESCRIPTION,
               epilog="the model commands take llama.cpp's options: -m/--model, "
                      "-c/--ctx-size, -n/--n-predict, --temp, --top-k, --top-p, -s/--seed, "
                      "and --device")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)
    for name, (_, summary) in MODEL_COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    p_info = sub.add_parser("info", help="list OpenCL devices and their capabilities; with "
                                         "-m, where a model's layers would go")
    p_info.add_argument("--no-probe", action="store_true", help="skip compile-and-run probes")
    from .cli.args import add_model_options

    add_model_options(p_info, ctx_default=None)
    sub.add_parser("demo", help="run a short computation on the default device")
    p_cache = sub.add_parser("cache", help="the kernel caches' folder and size (CLOPS_CACHE_LIMIT)")
    what = p_cache.add_mutually_exclusive_group()
    what.add_argument("--trim", action="store_true", help="trim to the limit now")
    what.add_argument("--clear", action="store_true", help="remove every compiled kernel")
    return p, {name: sub.choices[name] for name in ("info", "demo", "cache")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv else None
    if name in MODEL_COMMANDS:  # each parses its own options
        import importlib

        command = importlib.import_module(MODEL_COMMANDS[name][0])
        return int(command.main(argv[1:], prog=f"clops {name}"))
    top, own = parser()
    if name is None or name.startswith("-"):
        top.parse_args(argv)  # --help, or an option clops itself does not have
        top.print_help()
        return 0
    if name not in own:
        known = ", ".join([*MODEL_COMMANDS, *own])
        top.error(f"unknown command {name!r}: give one of {known}")
    args = own[name].parse_args(argv[1:])
    commands = {"info": lambda: info(probe=not args.no_probe), "demo": demo,
                "cache": lambda: cache(trim=args.trim, clear=args.clear)}
    if name == "info" and (args.model or args.tensor_split or "," in (args.device or "")):
        commands["info"] = lambda: placement(args.model, args.device, args.ctx_size,
                                             args.kv_cache, args.tensor_split)
    from .cli.args import Refused

    try:
        return commands[name]()
    except (LookupError, ValueError, Refused) as e:  # CLOPS_DEVICE names no device, a bad
        # selector, a model that is not there or does not fit
        message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"{top.prog} {name}: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
