"""The CPU runtimes side by side, one run: each CPU device OpenCL lists (PoCL 3.0 of the
``pocl-binary-distribution`` wheel, a distribution's PoCL 3.1+, Intel's runtime of the
``intel-opencl-rt`` wheel, whichever are installed) runs the PoCL benchmark rows in turn: the
fused chain, sum, row softmax and column sum (``bench_compiler.py``), a float32 matmul
(``bench_kernels.py``) and SmolLM2 prefill and decode (``bench_llm.py``), each beside numpy
measured in the same process where it has a peer. Writes one JSON and prints the Markdown table
the README quotes, with whether each runtime passes the CPU product probe and which one
``clops.device()`` picks.

With ``--llama-bench PATH`` (``scripts/llama_cpp.sh build TARBALL DIR cpu``) llama.cpp's CPU
backend runs the same GGUF files with as many threads as the machine has cores, beside each
runtime in the same run, and the LLM rows give the ratios; ``--models`` adds GGUF files (the 1B
bodies ``bench/models.py write`` makes), run on the runtimes that pass the product probe. Each
decode figure comes with the fraction of the machine's copy bandwidth its bytes per token take
(a copy kernel on the same device, ``bench_llm.py``). ``--rounds N`` (default 3) runs the two
engines in turn N times on each model and quotes the medians of the rounds: this VM's memory
bandwidth moves by tens of percent within minutes, and a single stretch of it would otherwise
fall on one engine.

    python bench/bench_cpu_runtimes.py [--devices opencl:cpu:0,opencl:cpu:1] [--repeat 10]
        [--llama-bench PATH] [--models a.gguf,b.gguf] [--rounds 3]
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


def _child(args: list[str]) -> bool:
    print("$ " + " ".join(args), flush=True)
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    print((res.stdout + res.stderr)[-3000:], flush=True)
    return res.returncode == 0


def _json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _describe(selectors: list[str]) -> list[dict]:
    """Each device's runtime, the product probe's verdict and clops' default choice, in a child
    process (as a fresh user would see them)."""
    code = """
import json, sys
import clops
from clops.kernels import gemm
out = []
for sel in sys.argv[1:]:
    d = clops.device(sel)
    out.append({"selector": sel, "device": d.name, "platform": d.platform_version,
                "driver": d.driver_version, "products": gemm.cpu_kernel_works(d, "float32")})
default = clops.device()
print(json.dumps({"devices": out, "default": default.selector}))
"""
    res = subprocess.run([sys.executable, "-c", code, *selectors], capture_output=True,
                         text=True, check=True)
    data = json.loads(res.stdout.strip().splitlines()[-1])
    for d in data["devices"]:
        d["default"] = d["selector"] == data["default"]
    return data["devices"]


def _cpu_selectors() -> list[str]:
    code = ("import clops\nfrom clops.runtime import discovery\n"
            "cpus = [e for e in discovery.entries() if e.kind == 'cpu']\n"
            "print(','.join(f'opencl:cpu:{i}' for i in range(len(cpus))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return [s for s in res.stdout.strip().splitlines()[-1].split(",") if s]


def _llm(sel: str, model: str | None, path: str, llama_bench: str | None,
         rounds: int = 1) -> dict | None:
    peer = ["--llama-bench", llama_bench, "--llama-bench-args",
            f"-t {os.cpu_count() or 1} -ngl 0", "--rounds", str(rounds)] if llama_bench else []
    _child([os.path.join(HERE, "bench_llm.py"), "--device", sel, "--no-peers",
            "--prompt-tokens", "64", "--new-tokens", "32", "--pp", "", *peer, "--json", path,
            *(["-m", model] if model else [])])
    return _json(path)


def measure(selectors: list[str], repeat: int, model: str | None,
            llama_bench: str | None = None, models: list[str] | None = None,
            rounds: int = 1) -> dict:
    runtimes = _describe(selectors)
    with tempfile.TemporaryDirectory() as tmp:
        for rt in runtimes:
            sel, tag = rt["selector"], rt["selector"].replace(":", "_")
            comp, kern, llm = (os.path.join(tmp, f"{k}_{tag}.json")
                               for k in ("compiler", "kernels", "llm"))
            _child([os.path.join(HERE, "bench_compiler.py"), "--device", sel, "--repeat",
                    str(repeat), "--json", comp])
            rt["kernels"] = {}
            for size in (1024, 2048):
                path = f"{kern[:-5]}_{size}.json"  # (a failed run leaves no file to misread)
                _child([os.path.join(HERE, "bench_kernels.py"), "--device", sel, "--only",
                        "gemm", "--size", str(size), "--gemm-dtypes", "float32", "--repeat",
                        str(repeat), "--json", path])
                rt["kernels"][str(size)] = _json(path)
            rt["compiler"] = _json(comp)
            rt["llm"] = _llm(sel, model, llm, llama_bench, rounds)
            rt["models"] = {}
            for i, path in enumerate(models or []):
                if rt["products"]:
                    name = os.path.basename(path).rsplit(".", 1)[0]
                    rt["models"][name] = _llm(sel, path, os.path.join(tmp, f"m{i}_{tag}.json"),
                                              llama_bench, rounds)
    return {"bench": "cpu_runtimes", "repeat": repeat, "rounds": rounds, "runtimes": runtimes}


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


def render(data: dict) -> str:
    rts = data["runtimes"]
    cols = [_cells(rt) for rt in rts]
    for c in cols:  # rows some runtimes lack (models run where the probe passes)
        for label in [k for col in cols for k in col]:
            c.setdefault(label, "")
    order = list(dict.fromkeys(k for col in cols for k in col))
    cols = [{k: c[k] for k in order} for c in cols]
    head = "| benchmark | " + " | ".join(f"{_runtime_name(rt)} (`{rt['selector']}`)"
                                         for rt in rts) + " |"
    lines = [head, "|---" * (len(rts) + 1) + "|"]
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
    a = ap.parse_args(argv)
    if a.render:
        print(render(_json(a.render) or {"runtimes": []}))
        return 0
    selectors = a.devices.split(",") if a.devices else _cpu_selectors()
    data = measure(selectors, a.repeat, a.model, a.llama_bench,
                   a.models.split(",") if a.models else None, a.rounds)
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(data, f, indent=1)
    print(render(data))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
