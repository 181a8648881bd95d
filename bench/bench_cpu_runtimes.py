"""The CPU runtimes side by side, one run: each CPU device OpenCL lists (PoCL 3.0 of the
``pocl-binary-distribution`` wheel, a distribution's PoCL 3.1+, Intel's runtime of the
``intel-opencl-rt`` wheel, whichever are installed) runs the PoCL benchmark rows in turn: the
fused chain, sum, row softmax and column sum (``bench_compiler.py``), a float32 matmul
(``bench_kernels.py``) and SmolLM2 prefill and decode (``bench_llm.py``), each beside numpy
measured in the same process where it has a peer. Writes one JSON and prints the Markdown table
the README quotes, with whether each runtime passes the CPU product probe and which one
``clops.device()`` picks.

    python bench/bench_cpu_runtimes.py [--devices opencl:cpu:0,opencl:cpu:1] [--repeat 10]
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


def measure(selectors: list[str], repeat: int, model: str | None) -> dict:
    runtimes = _describe(selectors)
    with tempfile.TemporaryDirectory() as tmp:
        for rt in runtimes:
            sel, tag = rt["selector"], rt["selector"].replace(":", "_")
            comp, kern, llm = (os.path.join(tmp, f"{k}_{tag}.json")
                               for k in ("compiler", "kernels", "llm"))
            _child([os.path.join(HERE, "bench_compiler.py"), "--device", sel, "--repeat",
                    str(repeat), "--json", comp])
            _child([os.path.join(HERE, "bench_kernels.py"), "--device", sel, "--only", "gemm",
                    "--size", "1024", "--gemm-dtypes", "float32", "--repeat", str(repeat),
                    "--json", kern])
            _child([os.path.join(HERE, "bench_llm.py"), "--device", sel, "--no-peers",
                    "--prompt-tokens", "64", "--new-tokens", "32", "--pp", "", "--json", llm,
                    *(["-m", model] if model else [])])
            rt["compiler"], rt["kernels"], rt["llm"] = _json(comp), _json(kern), _json(llm)
    return {"bench": "cpu_runtimes", "repeat": repeat, "runtimes": runtimes}


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
    kern = [r for r in (rt.get("kernels") or {}).get("rows", []) if "float32" in r["kernel"]]
    label = "matmul float32 1024^3"
    # wall time: PoCL 3.0's profiling events under-report the portable kernel's time
    wall = kern[0].get("wall_ms") if kern else None
    cells[label] = (f"{wall:.1f} ms ({kern[0]['peer_ms'] / wall:.2f}x numpy)"
                    if wall and wall == wall else "failed")
    llm = (rt.get("llm") or {}).get("rows", [])
    cells["SmolLM2-135M Q4_1 prefill (64 tokens)"] = (f"{llm[0]['prefill_tps']:.0f} tok/s"
                                                       if llm else "failed")
    cells["SmolLM2-135M Q4_1 decode"] = f"{llm[0]['decode_tps']:.1f} tok/s" if llm else "failed"
    cells["CPU product probe (gemm_cpu)"] = ("passes" if rt["products"]
                                             else "fails (portable kernel)")
    cells["clops.device() picks it"] = "yes" if rt["default"] else "no"
    return cells


def render(data: dict) -> str:
    rts = data["runtimes"]
    cols = [_cells(rt) for rt in rts]
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
    a = ap.parse_args(argv)
    if a.render:
        print(render(_json(a.render) or {"runtimes": []}))
        return 0
    selectors = a.devices.split(",") if a.devices else _cpu_selectors()
    data = measure(selectors, a.repeat, a.model)
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(data, f, indent=1)
    print(render(data))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
