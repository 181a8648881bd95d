"""The CPU runtimes side by side, one run: each CPU device OpenCL lists (PoCL 3.0 of the
``pocl-binary-distribution`` wheel, a distribution's PoCL 3.1+, Intel's runtime of the
``intel-opencl-rt`` wheel, whichever are installed) runs the PoCL benchmark rows in turn: the
fused chain, sum, row softmax and column sum (``bench_compiler.py``), a float32 matmul
(``bench_kernels.py``) and SmolLM2 prefill and decode (``bench_llm.py``), each beside numpy
measured in the same process where it has a peer. Writes one JSON and prints the Markdown table
the README quotes, with whether each runtime passes the CPU product probe and which one
``clops.device()`` picks.

With ``--llama-bench PATH`` (``scripts/llama_cpp.sh build TARBALL DIR cpu``) llama.cpp's CPU
backend runs the same GGUF files with as many threads as this process has cores (``taskset -c``
gives it fewer), beside each runtime in the same run, and the LLM rows give the ratios;
``--models`` adds GGUF files (the 1B bodies ``bench/models.py write`` makes), run on the runtimes
that pass the product probe. Each
decode figure comes with the fraction of the machine's copy bandwidth its bytes per token take
(a copy kernel on the same device, ``bench_llm.py``). ``--rounds N`` (default 3) runs the two
engines in turn N times on each model and quotes the medians of the rounds: this VM's memory
bandwidth moves by tens of percent within minutes, and a single stretch of it would otherwise
fall on one engine.

The JSON names the machine (``"machine"``: the CPU's model name, its core count, its instruction
set level, ``avx512-vnni``, ``avx512``, ``avx2`` or ``sse``, from ``/proc/cpuinfo``, and the
restriction the run was made under, ``isa_run``) and, for each runtime, what clops' native CPU
kernels were built for (``native_isa``: ``native_cpu.isa()``) or why that runtime does not run
them (``native_why_not``); the table is headed by a line naming the machine and has a row
"native CPU kernels".

``--isa avx2`` measures, on a machine with AVX-512, what an AVX2 machine would run: every child
process (the device description and ``bench_compiler.py``, ``bench_kernels.py``,
``bench_llm.py``) starts with the environment of ``ISA_ENV["avx2"]``: clops' native kernels
built for AVX2 (``CLOPS_NATIVE_CPU=avx2``), Intel's CPU runtime compiling for ``core-avx2``
(``CL_CONFIG_CPU_TARGET_ARCH``) and PoCL for ``haswell`` (``POCL_KERNELLIB_NAME=avx2`` where it
was built with CPU variants, as distributions build it, ``POCL_LLVM_CPU_NAME`` where it was
built for one CPU). PoCL 3.0 of the ``pocl-binary-distribution`` wheel reads neither, and runs
the machine's own level whatever is asked. llama-bench is a built binary, which none of these
reach: for a fair peer, build llama.cpp for AVX2 itself (``scripts/llama_cpp.sh build ... cpu``
configures ``-DGGML_NATIVE=ON``; ``scripts/llama_cpp.sh build ... avx2`` configures
``-DGGML_NATIVE=OFF`` with AVX2, FMA and F16C and no AVX-512) and pass that one as
``--llama-bench``. On a machine whose
level is AVX2 already, ``--isa avx2`` changes nothing but the record.

    python bench/bench_cpu_runtimes.py [--devices opencl:cpu:0,opencl:cpu:1] [--repeat 10]
        [--llama-bench PATH] [--models a.gguf,b.gguf] [--rounds 3] [--isa avx2]
    python bench/bench_cpu_runtimes.py --render bench/results/cpu_runtimes.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
COMPILER_ROWS = [("chain a*b+c*d-e*0.5 (clops)", "fused chain a*b+c*d-e*0.5, 2^24 float32"),
                 ("sum (clops)", "sum of 2^24 float32"),
                 ("softmax 4096x4096 (clops, 1 kernel)", "softmax 4096x4096 rows"),
                 ("sum axis 0 4096x4096 (clops, 1 kernel)", "column sum 4096x4096")]

# --isa: the environment each child process starts with, so that every engine in it compiles
# for that instruction set and no wider (the machine's own where --isa is not given).
ISA_ENV: dict[str, dict[str, str]] = {
    "avx2": {
        # clops' native CPU kernels (clops/kernels/native_cpu.py): built for AVX2 with FMA and
        # F16C, without AVX-512, on a CPU that has it.
        "CLOPS_NATIVE_CPU": "avx2",
        # Intel's CPU runtime for OpenCL: "generates code exclusively for a given target CPU
        # architecture", only lowering the level the CPU has; core-avx2: AVX2, AVX, SSE4.2 and
        # below (skx is AVX-512). Intel CPU Runtime for OpenCL Applications, developer guide,
        # "Targeting a Different CPU Architecture": https://cdrdv2.intel.com/v1/dl/getContent/671055
        "CL_CONFIG_CPU_TARGET_ARCH": "core-avx2",
        # PoCL built with host CPU variants (KERNELLIB_HOST_CPU_VARIANTS=distro, as Debian's
        # PoCL 3.1 is): the kernel library variant it picks in place of the best one the CPU
        # runs; avx2's target CPU is "haswell" (pocl_get_distro_kernellib_name in
        # lib/CL/pocl_llvm_utils.cc, https://github.com/pocl/pocl). The device's name shows it:
        # "pthread-haswell-...".
        "POCL_KERNELLIB_NAME": "avx2",
        # PoCL built for one CPU: the LLVM target CPU in place of llvm::sys::getHostCPUName()
        # (pocl_get_llvm_cpu_name, same file); haswell is LLVM's CPU of AVX2, FMA, F16C, BMI2.
        "POCL_LLVM_CPU_NAME": "haswell",
    },
}


def _env(isa: str | None) -> dict[str, str] | None:
    """The environment of a child process run under ``--isa`` (None: this process's own)."""
    return {**os.environ, **ISA_ENV[isa]} if isa else None


def _isa_level(flags: set[str]) -> str:
    """The instruction set level of a CPU of these /proc/cpuinfo flags."""
    if "avx512f" in flags:
        return "avx512-vnni" if "avx512_vnni" in flags else "avx512"
    return "avx2" if {"avx2", "fma"} <= flags else "sse"


def machine(isa_run: str | None = None) -> dict:
    """The CPU's model name, core count and instruction set level, and the restriction the run
    is made under (``isa_run``: None for the machine's own level)."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model or "unknown CPU", "cores": _cores(), "isa": _isa_level(flags),
            "isa_run": isa_run}


def _cores() -> int:
    """The cores this process may run on (``taskset -c 0,1 python ...`` measures two cores of a
    larger machine: llama-bench gets as many threads, and Intel's runtime, whose thread pool
    takes the process's affinity, as many workers)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _child(args: list[str], isa: str | None = None) -> bool:
    print("$ " + " ".join(args), flush=True)
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(isa))
    print((res.stdout + res.stderr)[-3000:], flush=True)
    return res.returncode == 0


def _json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _describe(selectors: list[str], isa: str | None = None) -> list[dict]:
    """Each device's runtime, the product probe's verdict, what clops' native CPU kernels were
    built for (or why the device does not run them) and clops' default choice, in a child
    process (as a fresh user would see them)."""
    code = """
import json, sys
import clops
from clops.kernels import gemm, native_cpu
out = []
for sel in sys.argv[1:]:
    d = clops.device(sel)
    out.append({"selector": sel, "device": d.name, "platform": d.platform_version,
                "driver": d.driver_version, "compute_units": d.caps.compute_units,
                "products": gemm.cpu_kernel_works(d, "float32"),
                "native_isa": native_cpu.isa(), "native_why_not": native_cpu.why_not(d)})
default = clops.device()
print(json.dumps({"devices": out, "default": default.selector}))
"""
    res = subprocess.run([sys.executable, "-c", code, *selectors], capture_output=True,
                         text=True, check=True, env=_env(isa))
    data = json.loads(res.stdout.strip().splitlines()[-1])
    for d in data["devices"]:
        d["default"] = d["selector"] == data["default"]
    return data["devices"]


def _cpu_selectors(isa: str | None = None) -> list[str]:
    code = ("import clops\nfrom clops.runtime import discovery\n"
            "cpus = [e for e in discovery.entries() if e.kind == 'cpu']\n"
            "print(','.join(f'opencl:cpu:{i}' for i in range(len(cpus))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=_env(isa))
    return [s for s in res.stdout.strip().splitlines()[-1].split(",") if s]


def _llm(sel: str, model: str | None, path: str, llama_bench: str | None,
         rounds: int = 1, isa: str | None = None) -> dict | None:
    peer = ["--llama-bench", llama_bench, "--llama-bench-args",
            f"-t {_cores()} -ngl 0", "--rounds", str(rounds)] if llama_bench else []
    _child([os.path.join(HERE, "bench_llm.py"), "--device", sel, "--no-peers",
            "--prompt-tokens", "64", "--new-tokens", "32", "--pp", "", *peer, "--json", path,
            *(["-m", model] if model else [])], isa)
    return _json(path)


def measure(selectors: list[str], repeat: int, model: str | None,
            llama_bench: str | None = None, models: list[str] | None = None,
            rounds: int = 1, isa: str | None = None, json_path: str | None = None) -> dict:
    """Every runtime's rows; with ``json_path``, the record so far is written there after each
    runtime (``"partial": true`` until the last), so a run stopped part way keeps what it
    measured."""
    runtimes = _describe(selectors, isa)

    def record(done: int) -> dict:
        return {"bench": "cpu_runtimes", "machine": machine(isa), "repeat": repeat,
                "rounds": rounds, "runtimes": runtimes[:done],
                **({"partial": True} if done < len(runtimes) else {})}

    with tempfile.TemporaryDirectory() as tmp:
        for done, rt in enumerate(runtimes):
            if json_path is not None and done:
                _write(json_path, record(done))
            sel, tag = rt["selector"], rt["selector"].replace(":", "_")
            comp, kern, llm = (os.path.join(tmp, f"{k}_{tag}.json")
                               for k in ("compiler", "kernels", "llm"))
            _child([os.path.join(HERE, "bench_compiler.py"), "--device", sel, "--repeat",
                    str(repeat), "--json", comp], isa)
            rt["kernels"] = {}
            for size in (1024, 2048):
                path = f"{kern[:-5]}_{size}.json"  # (a failed run leaves no file to misread)
                _child([os.path.join(HERE, "bench_kernels.py"), "--device", sel, "--only",
                        "gemm", "--size", str(size), "--gemm-dtypes", "float32", "--repeat",
                        str(repeat), "--json", path], isa)
                rt["kernels"][str(size)] = _json(path)
            rt["compiler"] = _json(comp)
            rt["llm"] = _llm(sel, model, llm, llama_bench, rounds, isa)
            rt["models"] = {}
            for i, path in enumerate(models or []):
                if rt["products"]:
                    name = os.path.basename(path).rsplit(".", 1)[0]
                    rt["models"][name] = _llm(sel, path, os.path.join(tmp, f"m{i}_{tag}.json"),
                                              llama_bench, rounds, isa)
    return record(len(runtimes))


def _write(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def _runtime_name(rt: dict) -> str:
    plat = rt["platform"]
    if "PoCL" in plat:
        return "PoCL " + plat.split("PoCL ")[1].split()[0]
    if "intel" in rt["device"].lower() or "LINUX" in plat:
        return f"Intel {rt['driver']}"
    return plat


def _cells(rt: dict) -> dict[str, str]:
    cells: dict[str, str] = {}
    comp = {r["bench"]: r for r in (rt.get("compiler") or {}).get("rows", [])}
    for key, label in COMPILER_ROWS:
        r = comp.get(key)
        cells[label] = (f"{r['ms']:.1f} ms ({r['speedup_vs_peer']:.2f}x numpy)" if r
                        else "failed")
    runs = rt.get("kernels") or {}
    if "rows" in runs:  # (a run of one size: 1024)
        runs = {"1024": runs}
    for size, run in runs.items():
        kern = [r for r in (run or {}).get("rows", []) if "float32" in r["kernel"]]
        # wall time: PoCL 3.0's profiling events under-report the portable kernel's time
        wall = kern[0].get("wall_ms") if kern else None
        cells[f"matmul float32 {size}^3"] = (f"{wall:.1f} ms ({kern[0]['peer_ms'] / wall:.2f}x "
                                             "numpy)" if wall and wall == wall else "failed")
    _llm_cells(cells, "SmolLM2-135M Q4_1", rt.get("llm"))
    for name, run in (rt.get("models") or {}).items():
        _llm_cells(cells, name, run)
    if "native_why_not" in rt:  # (runs before the machine entry have none)
        why = rt["native_why_not"]
        cells["native CPU kernels"] = ((rt["native_isa"] or "none") if why is None
                                       else f"not run: {why}")
    cells["CPU product probe (gemm_cpu)"] = ("passes" if rt["products"]
                                             else "fails (portable kernel)")
    cells["clops.device() picks it"] = "yes" if rt["default"] else "no"
    return cells


def _llm_cells(cells: dict[str, str], name: str, run: dict | None) -> None:
    """Prefill and decode of one model, with llama.cpp's figures and the ratios where it ran,
    and decode's fraction of the copy bandwidth."""
    rows = (run or {}).get("rows", [])
    c = rows[0] if rows else None
    p = next((r for r in rows[1:] if "llama-bench" in r.get("name", "")), None)
    for what, key, fmt in (("prefill (64 tokens)", "prefill_tps", ".0f"),
                           ("decode", "decode_tps", ".1f")):
        label = f"{name} {what}"
        if c is None:
            cells[label] = "failed" if run is not None else ""
            continue
        cell = f"{c[key]:{fmt}} tok/s"
        if p and p.get(key):
            cell += f" (**{c[key] / p[key]:.2f}x** llama.cpp's {p[key]:{fmt}})"
        if key == "decode_tps" and c.get("of_copy_bw"):
            cell += f"; {c['of_copy_bw']:.2f} of copy bw"
        cells[label] = cell


def _machine_line(m: dict) -> str:
    """The machine in words: "2-core AMD EPYC 9B14 (avx512-vnni), runs restricted to AVX2"."""
    line = f"{m.get('cores') or '?'}-core {m.get('cpu') or 'unknown CPU'} ({m.get('isa')})"
    if m.get("isa_run"):
        line += f", runs restricted to {m['isa_run'].upper()}"
    return line


def render(data: dict) -> str:
    rts = data["runtimes"]
    top = [_machine_line(data["machine"]), ""] if data.get("machine") else []
    if not rts:
        return "\n".join(top)
    cols = [_cells(rt) for rt in rts]
    for c in cols:  # rows some runtimes lack (models run where the probe passes)
        for label in [k for col in cols for k in col]:
            c.setdefault(label, "")
    order = list(dict.fromkeys(k for col in cols for k in col))
    cols = [{k: c[k] for k in order} for c in cols]
    head = "| benchmark | " + " | ".join(f"{_runtime_name(rt)} (`{rt['selector']}`)"
                                         for rt in rts) + " |"
    lines = [*top, head, "|---" * (len(rts) + 1) + "|"]
    for label in cols[0]:
        lines.append(f"| {label} | " + " | ".join(c[label] for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--devices", default=None, help="CPU selectors (default: every CPU device)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: bundled SmolLM2)")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "cpu_runtimes.json"))
    ap.add_argument("--render", default=None, metavar="JSON", help="print the table of a run")
    ap.add_argument("--llama-bench", default=None, metavar="PATH",
                    help="llama.cpp's llama-bench built for the CPU: run beside each runtime")
    ap.add_argument("--models", default=None, help="more GGUF files (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="with --llama-bench: rounds of both engines in turn per model")
    ap.add_argument("--isa", default=None, choices=sorted(ISA_ENV),
                    help="run every runtime restricted to this instruction set (AVX2 on an "
                         "AVX-512 machine; see ISA_ENV)")
    a = ap.parse_args(argv)
    if a.render:
        print(render(_json(a.render) or {"runtimes": []}))
        return 0
    if a.isa == "avx2" and machine()["isa"] == "sse":
        ap.error("--isa avx2: this CPU has no AVX2 with FMA (a restriction only lowers)")
    selectors = a.devices.split(",") if a.devices else _cpu_selectors(a.isa)
    data = measure(selectors, a.repeat, a.model, a.llama_bench,
                   a.models.split(",") if a.models else None, a.rounds, a.isa, a.json)
    _write(a.json, data)
    print(render(data))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
