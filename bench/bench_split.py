"""Benchmark: a model split over the GPUs of one host (each GPU a run of layers,
``clops.llm.load(device="gpu:0,gpu:1")``) beside llama.cpp's layer split (``llama-bench -sm
layer``) on the same GPUs and the same file, in the same run: prompt tokens/s (pp512 and the
first prompt length) and decode tokens/s after that prompt, medians of rounds that alternate the
two engines (these machines are noisy).

    python bench/models.py write PREP /tmp/models --only llama70b-q8_0
    python bench/bench_split.py -m /tmp/models/llama70b-q8_0.gguf --device gpu:0,gpu:1 \\
        --llama-bench /tmp/llama/bin/llama-bench --rounds 3

The placement (layers and bytes per device) and each device's memory after loading go into
the JSON beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_llm import TEXT, bench_llama_bench, measure_clops  # noqa: E402

import clops  # noqa: E402
import clops.llm  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--device", default="gpu:0,gpu:1",
                    help="the devices to split over (default: %(default)s)")
    ap.add_argument("--split", default=None, help="each device's share of the layers (3,1)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--llama-bench", default=None, metavar="PATH")
    ap.add_argument("--llama-bench-args", default="-ngl 99 -sm layer",
                    help="llama-bench's split options (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="bench/results/split.json")
    args = ap.parse_args(argv)
    split = [float(v) for v in args.split.split(",")] if args.split else None

    t0 = time.perf_counter()
    model = clops.llm.load(args.model, device=args.device, split=split,
                           max_seq_len=max(args.pp, args.prompt_tokens) + args.new_tokens + 8)
    load_s = time.perf_counter() - t0
    stream = model.tokenizer.encode(TEXT * (max(args.pp, args.prompt_tokens) // 30 + 20))
    ids, long = stream[: args.prompt_tokens], {args.pp: stream[: args.pp]}
    list(model.generate_ids(ids, max_new_tokens=4, stop_ids=[]))  # (kernels built)
    mine: list[tuple[float, float, dict]] = []
    peer: list[dict] = []
    for r in range(args.rounds):
        pre, dec, pps, _ = measure_clops(model, ids, args.new_tokens, long)
        mine.append((pre, dec, pps))
        print(f"round {r}: clops pp{args.prompt_tokens} {pre:.1f} pp{args.pp} "
              f"{pps[str(args.pp)]:.1f} decode {dec:.2f} tok/s", flush=True)
        if args.llama_bench:
            got = bench_llama_bench(args.llama_bench, args.model, [args.prompt_tokens, args.pp],
                                    args.new_tokens, [], args.llama_bench_args.split())
            peer.append(got)
            print(f"round {r}: llama.cpp pp{args.prompt_tokens} {got['prefill_tps']:.1f} "
                  f"pp{args.pp} {got['pp'][str(args.pp)]:.1f} decode {got['decode_tps']:.2f}",
                  flush=True)
    c = {"prefill_tps": statistics.median(m[0] for m in mine),
         "decode_tps": statistics.median(m[1] for m in mine),
         f"pp{args.pp}": statistics.median(m[2][str(args.pp)] for m in mine)}
    out: dict = {
        "model": args.model, "bytes": os.path.getsize(args.model), "load_s": load_s,
        "devices": [{"selector": d.selector, "name": d.name, "memory": d.memory_stats()}
                    for d in model.devices],
        "placement": [{"selector": st.device.selector, "first": st.first, "stop": st.stop,
                       "planned_bytes": st.nbytes} for st in model.stages],
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "rounds": args.rounds,
        "clops": {**c, "rounds": mine}}
    print(f"clops on {model.where}: pp{args.prompt_tokens} {c['prefill_tps']:.1f}, "
          f"pp{args.pp} {c[f'pp{args.pp}']:.1f}, decode {c['decode_tps']:.2f} tok/s "
          f"(loaded in {load_s:.0f} s)")
    if peer:
        p = {"prefill_tps": statistics.median(g["prefill_tps"] for g in peer),
             "decode_tps": statistics.median(g["decode_tps"] for g in peer),
             f"pp{args.pp}": statistics.median(g["pp"][str(args.pp)] for g in peer)}
        out["llama.cpp"] = {**p, "args": args.llama_bench_args, "rounds": peer,
                            **{k: peer[0][k] for k in ("build_commit", "gpu_info", "source")
                               if k in peer[0]}}
        out["ratio"] = {k: c[k] / p[k] for k in p if p[k]}
        print(f"llama.cpp ({args.llama_bench_args}): pp{args.prompt_tokens} "
              f"{p['prefill_tps']:.1f}, pp{args.pp} {p[f'pp{args.pp}']:.1f}, decode "
              f"{p['decode_tps']:.2f} tok/s")
        print("clops / llama.cpp: " + ", ".join(f"{k} {v:.2f}x" for k, v in out["ratio"].items()))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
