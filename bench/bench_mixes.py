"""Benchmark: the decode table of one body in the weight types people download. Every file is
made by llama.cpp's own ``llama-quantize`` from one F16 file; clops and ``llama-bench`` run the
same file in the same run (``bench_llm.py`` for each row), and each row gives the weight bytes
read per second as a fraction of the device's copy bandwidth, measured in the same run.

    python bench/models.py write PREP /tmp/models --only llama8b-f16
    python bench/bench_mixes.py --f16 /tmp/models/llama8b-f16.gguf --device gpu \\
        --llama-quantize /tmp/lq/bin/llama-quantize --llama-bench /tmp/lb/bin/llama-bench \\
        --json bench/results/mixes_h200_llama8b.json
    python bench/bench_mixes.py --table bench/results/mixes_h200_llama8b.json

The bytes a token are counted twice. "file": what the file's matrices hold (every matrix once,
the embedding whole where it is also the output, else one row; the KV cache up to the middle of
the new tokens), the same for both engines, so that both fractions compare. "clops": what clops
keeps on the device (the types it repacks into 8-bit values, e.g. Q3_K and IQ4_NL, take more
than the file; on GPUs the K-quants and IQ4_XS about the file's bytes). A mix's file is deleted
after its row unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_llm  # noqa: E402

from clops.llm.gguf_file import GGUFFile, ggml_type_name  # noqa: E402

MIXES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q4_0")


def file_weight_bytes(path: str) -> tuple[int, dict[str, int]]:
    """Bytes of the file's tensors one decode token reads (norms included; the embedding whole
    when no separate output matrix exists, since it is the output then, else one row), and the
    count of matrices of each type."""
    f = GGUFFile(path)
    tied = "output.weight" not in f.tensors
    total = 0
    for name, t in f.tensors.items():
        n = t.data.nbytes
        total += n // t.shape[0] if name == "token_embd.weight" and not tied else n
    types = Counter(ggml_type_name(t.ggml_type) for t in f.tensors.values() if len(t.shape) > 1)
    return total, dict(types)


def quantize(tool: str, f16: str, dst: str, mix: str) -> float:
    """Seconds ``llama-quantize`` took to write ``dst`` in ``mix`` from ``f16``."""
    t0 = time.perf_counter()
    res = subprocess.run([tool, f16, dst, mix], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"llama-quantize {mix} failed:\n{res.stderr[-2000:]}")
    return time.perf_counter() - t0


def row(mix: str, path: str, a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        args = ["-m", path, "--label", mix, "--prompt-tokens", str(a.prompt_tokens),
                "--new-tokens", str(a.new_tokens), "--pp", a.pp, "--no-peers",
                "--llama-bench", a.llama_bench, "--rounds", str(a.rounds), "--json", out]
        if a.device:
            args += ["--device", a.device]
        if a.llama_bench_args:
            args += ["--llama-bench-args", a.llama_bench_args]
        bench_llm.main(args)
        with open(out) as f:
            got = json.load(f)
    c, peer = got["rows"][0], got["rows"][1]
    weights, types = file_weight_bytes(path)
    kv = c["bytes_per_token"]["kv_per_position"] * (a.prompt_tokens + a.new_tokens // 2)
    ceiling = c["copy_ceiling_gbps"] * 1e9
    return {"mix": mix, "file_bytes": os.path.getsize(path), "matrices": types,
            "file_bytes_per_token": weights + kv,
            "clops_bytes_per_token": c["bytes_per_token"]["total"],
            "copy_ceiling_gbps": c["copy_ceiling_gbps"],
            "clops": {"decode_tps": c["decode_tps"], "pp": c["pp"],
                      "of_copy_bw_file": (weights + kv) * c["decode_tps"] / ceiling,
                      "of_copy_bw_device": c["of_copy_bw"],
                      "launches_per_step": c["launches_per_step"], "bound": c["bound"],
                      "device_ms_per_step": c["device_ms_per_step_no_events"],
                      "kernel_us_per_step": c["kernel_us_per_step"]},
            "llama_cpp": {"decode_tps": peer["decode_tps"], "pp": peer["pp"],
                          "of_copy_bw_file": (weights + kv) * peer["decode_tps"] / ceiling,
                          "source": peer.get("source"), "gpu_info": peer.get("gpu_info")},
            "rows": got["rows"]}


def table(results: dict) -> str:
    pp = results["pp"].split(",")[-1]
    head = (f"| file ({results['body']}) | GB | clops decode tok/s | llama.cpp | ratio | "
            f"clops of copy bw | llama.cpp of copy bw | clops pp{pp} | llama.cpp | ratio |")
    lines = [head, "|" + "---|" * 10]
    for r in results["rows"]:
        c, p = r["clops"], r["llama_cpp"]
        cp, lp = c["pp"].get(pp, 0.0), p["pp"].get(pp, 0.0)
        lines.append(
            f"| {r['mix']} | {r['file_bytes'] / 1e9:.1f} | {c['decode_tps']:.0f} | "
            f"{p['decode_tps']:.0f} | {c['decode_tps'] / p['decode_tps']:.2f}x | "
            f"{c['of_copy_bw_file']:.0%} | {p['of_copy_bw_file']:.0%} | {cp:.0f} | {lp:.0f} | "
            f"{cp / lp if lp else 0:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--table", metavar="JSON", help="print the table of a results file and stop")
    ap.add_argument("--f16", help="the F16 GGUF every mix is made from")
    ap.add_argument("--llama-quantize", metavar="PATH")
    ap.add_argument("--llama-bench", metavar="PATH")
    ap.add_argument("--llama-bench-args", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--out", default=None, help="where the mixes are written (default: beside "
                    "the F16 file)")
    ap.add_argument("--keep", action="store_true", help="keep each mix's file")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--pp", default="512")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", default="bench/results/mixes.json")
    a = ap.parse_args(argv)
    if a.table:
        with open(a.table) as f:
            print(table(json.load(f)))
        return 0
    if not (a.f16 and a.llama_quantize and a.llama_bench):
        ap.error("--f16, --llama-quantize and --llama-bench are needed (or --table)")
    out_dir = a.out or os.path.dirname(os.path.abspath(a.f16))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.basename(a.f16).rsplit(".", 1)[0]
    results: dict = {"bench": "mixes", "body": stem, "f16": os.path.basename(a.f16),
                     "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens, "pp": a.pp,
                     "rows": []}
    for mix in a.mixes.split(","):
        path = a.f16 if mix == "F16" else os.path.join(out_dir, f"{stem}-{mix}.gguf")
        made = None
        if not os.path.exists(path):
            made = quantize(a.llama_quantize, a.f16, path, mix)
        try:
            r = row(mix, path, a)
        except Exception as e:  # noqa: BLE001 - a row that fails is reported, the rest run
            r = {"mix": mix, "error": f"{type(e).__name__}: {str(e)[:1000]}"}
            print(f"{mix}: FAILED {r['error']}", flush=True)
        r["quantize_s"] = made
        results["rows"].append(r)
        if path != a.f16 and not a.keep:
            os.remove(path)
        with open(a.json, "w") as f:  # after every row: a run cut short keeps what it has
            json.dump(results, f, indent=1)
    results["rows"] = [r for r in results["rows"] if "error" not in r] + \
        [r for r in results["rows"] if "error" in r]
    with open(a.json, "w") as f:
        json.dump(results, f, indent=1)
    ok = {**results, "rows": [r for r in results["rows"] if "error" not in r]}
    print(table(ok))
    print(f"wrote {a.json}")
    return 1 if len(ok["rows"]) < len(results["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
