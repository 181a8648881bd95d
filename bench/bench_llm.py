"""Benchmark: prefill and decode tokens/s of an LLM with clops on an OpenCL device, beside
Hugging Face transformers (eager) on PyTorch in the same run: on the same GPU in float16 when
PyTorch sees one, else on the CPU; and llama.cpp's Python binding when it is installed. Reports
the kernels enqueued per decode token, the host time to enqueue them, and how busy the device is
during decode. Prints a table and writes JSON.

    python bench/bench_llm.py [-m model.gguf | --shape llama-3.2-1b] [--device gpu]

``--shape llama-3.2-1b`` makes a Llama-3.2-1B-shaped model with random float16 weights (saved as
safetensors in a temporary folder) and runs both engines on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import clops  # noqa: E402
import clops.llm  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import back_to_back, copy_ceiling, gpu_clocks, nvidia_smi_id  # noqa: E402

TEXT = ("Oxygen is the chemical element with the symbol O and atomic number 8. It is a member "
        "of the chalcogen group in the periodic table, a highly reactive nonmetal, and an "
        "oxidizing agent that readily forms oxides with most elements. ")

LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192})


def make_llama_1b(path: str) -> None:
    """A Llama-3.2-1B-shaped model with random float16 weights and a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    where = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(where):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_1B)).to(torch.float16)
    model.save_pretrained(path, safe_serialization=True)
    v = LLAMA_1B["vocab_size"]
    vocab = {f"w{i}": i for i in range(v - 3)}
    vocab.update({"<unk>": v - 3, "<s>": v - 2, "</s>": v - 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}, f)
    del model


def measure_clops(model: Any, ids: list[int], new: int,
                  prompts: dict[int, list[int]] | None = None
                  ) -> tuple[float, float, dict[str, float], dict[str, list[float]]]:
    """Prefill tokens/s at each prompt length (medians of 5 generations of one token: the
    prompt alone, as llama-bench's pp times it) and decode tokens/s (the median of 5
    generations of ``new`` tokens), of a loaded model; and the 5 prefill figures at each
    length, in the order measured.

    (A longer generation enqueues its first decode step before it waits for the prompt's
    token, so that the step follows the prompt on the device at once; its time to the first
    token then takes in that step's enqueues wherever the host enqueues slower than the device
    runs the prompt: an H100 host taking 1.15 ms for the 83 launches of the 1B F16 body's step
    measured its 128-token prompt at 36k tok/s that way, its kernels taking 2.4 ms.)"""
    decode = []
    for _ in range(5):
        list(model.generate_ids(ids, max_new_tokens=new, stop_ids=[]))
        decode.append(model.stats.decode_tps)
    samples: dict[str, list[float]] = {}
    for p_ids in [ids, *(prompts or {}).values()]:  # prompt tokens/s at each length
        list(model.generate_ids(p_ids, max_new_tokens=1, stop_ids=[]))
        samples[str(len(p_ids))] = [
            (list(model.generate_ids(p_ids, max_new_tokens=1, stop_ids=[])),
             model.stats.prefill_tps)[1] for _ in range(5)]
    pp = {n: statistics.median(v) for n, v in samples.items()}
    return pp[str(len(ids))], statistics.median(decode), pp, samples


def rounds_with_llama_bench(rows: list[dict], path: str, device: str | None, ids: list[int],
                            new: int, prompts: dict[int, list[int]], rounds: int,
                            binary: str, extra: list[str]) -> None:
    """More rounds of clops' and llama-bench's prefill and decode figures, one engine after
    the other in turn (rows[0] and rows[1] hold the first round): each figure becomes the
    median of its rounds, so that a stretch of slower memory in the run weighs on both. The
    rounds' figures are kept under "rounds"."""
    c, peer = rows[0], rows[1]
    model = clops.llm.load(path, device=device, max_seq_len=1024, progress=False)
    list(model.generate_ids(ids, max_new_tokens=4, stop_ids=[]))
    c_rounds = [(c["prefill_tps"], c["decode_tps"], dict(c["pp"]))]
    p_rounds = [(peer["prefill_tps"], peer["decode_tps"], dict(peer["pp"]))]
    c_samples = [c.get("pp_samples", {})]
    p_empty = [peer.get("decode_tps_empty")]  # (llama-bench's decode from an empty context)
    for _ in range(rounds - 1):
        pre, dec, pps, smp = measure_clops(model, ids, new, prompts)
        c_rounds.append((pre, dec, pps))
        c_samples.append(smp)
        got = bench_llama_bench(binary, path, [len(ids), *prompts], new, [], extra)
        p_rounds.append((got["prefill_tps"], got["decode_tps"], got["pp"]))
        p_empty.append(got.get("decode_tps_empty"))
    del model
    first = c["decode_tps"]
    for row, rs in ((c, c_rounds), (peer, p_rounds)):
        row["rounds"] = [{"prefill_tps": a, "decode_tps": b, "pp": pp} for a, b, pp in rs]
        row["prefill_tps"] = statistics.median(r[0] for r in rs)
        row["decode_tps"] = statistics.median(r[1] for r in rs)
        row["pp"] = {n: statistics.median(r[2][n] for r in rs) for n in rs[0][2]}
    c["of_copy_bw"] *= c["decode_tps"] / first
    for r, smp in zip(c["rounds"], c_samples):
        r["pp_samples"] = smp
    if all(v is not None for v in p_empty):
        for r, v in zip(peer["rounds"], p_empty):
            r["decode_tps_empty"] = v
        peer["decode_tps_empty"] = statistics.median(p_empty)


_T0 = time.perf_counter()


def progress(what: str) -> None:
    """A line on stderr as each phase ends (so that a run stopped by a time limit shows where
    it was)."""
    print(f"[{time.perf_counter() - _T0:7.1f} s] {what}", file=sys.stderr, flush=True)


def bench_clops(path: str, device: str | None, ids: list[int], new: int,
                prompts: dict[int, list[int]] | None = None) -> dict:
    model = clops.llm.load(path, device=device, max_seq_len=1024, progress=False)
    progress("clops: loaded")
    list(model.generate_ids(ids, max_new_tokens=4, stop_ids=[]))  # builds kernels once
    progress("clops: kernels built (a first generation)")
    dev = model.device
    with gpu_clocks(nvidia_smi_id(dev)) as clocks:
        prefill_tps, decode_tps, pp, pp_samples = measure_clops(model, ids, new, prompts)
    progress(f"clops: prefill {prefill_tps:.1f} tok/s, decode {decode_tps:.1f} tok/s")
    moved = bytes_per_token(model, len(ids) + new // 2)
    ceiling = copy_ceiling(dev)
    # how long the host takes to enqueue one decode step, and the device time of one step
    # (the plan generate_ids runs at the middle of the new tokens)
    plan = model._plan(1, "last", True, model._decode_span(len(ids) + new // 2 + 1))
    # one step at a time onto an idle device: NVIDIA's driver makes an enqueue wait once
    # about a thousand launches are queued, so steps enqueued back to back would time that
    times = []
    for _ in range(20):
        dev.synchronize()
        t0 = time.perf_counter()
        plan.replay()
        times.append(time.perf_counter() - t0)
    enqueue = statistics.median(times)
    dev.synchronize()
    with clops.profile() as prof:
        for _ in range(10):
            plan.replay()
        dev.synchronize()
    ks = prof.kernels()
    busy_ms = sum(r.duration_ns for r in ks) / 10 / 1e6
    span_ms = (max(r.end_ns for r in ks) - min(r.start_ns for r in ks)) / 10 / 1e6
    # Without events: the device time of a step when steps run back to back, and the host's
    # time to enqueue one while the device is busy (so that a full queue never throttles it).
    # The larger bounds decode; profiled kernel times above include ~3 us of event cost each.
    # Where the device records command buffers, the plan replays as one enqueue; the
    # per-kernel enqueues are measured beside it.
    prepared = plan._prepared
    paths = {"per-kernel enqueues": dataclasses.replace(prepared, recorded=None)}
    if prepared.recorded is not None:
        paths["command buffer"] = prepared
    # (as many steps as stay under the ~1000 launches NVIDIA's driver queues without blocking
    # the host: a mixture of experts' step of 48 layers has about 700)
    steps = max(1, min(4, 800 // max(1, len(plan.launches))))
    replay = {name: back_to_back(dev, [lambda p=p: dev.enqueue_prepared(p)], count=steps)
              for name, p in paths.items()}
    path = "command buffer" if prepared.recorded is not None else "per-kernel enqueues"
    free_ms, free_enqueue_ms = replay[path]
    step_ms = 1e3 / decode_tps
    by_name = _by_name(ks, 10)
    # the prompt's kernels (one chunk of the plan, profiled)
    model._start(ids)
    model._set_pos(0)
    chunk = model._plan(min(len(ids), model.chunk), "last", True)
    chunk.replay()
    dev.synchronize()
    with clops.profile() as prof:
        chunk.replay()
        dev.synchronize()
    prompt = _by_name(prof.kernels(), 1)
    return {"name": f"clops ({dev.name[:30]})", "prefill_tps": prefill_tps, "pp": pp,
            "pp_samples": pp_samples,
            "decode_tps": decode_tps, "bytes_per_token": moved,
            "kv_cache": "float16" if model.kv_half else "float32",
            "copy_ceiling_gbps": ceiling["gbps"],
            "of_copy_bw": moved["total"] * decode_tps / (ceiling["gbps"] * 1e9),
            "launches_per_step": len(plan.launches),
            "enqueues_per_step": (1 if prepared.recorded is not None else
                                  len(prepared.chained) if prepared.chained is not None
                                  else len(plan.launches)),
            "enqueue_ms_per_step": enqueue * 1e3, "device_ms_per_step": busy_ms,
            "device_span_ms_per_step": span_ms, "gpu_busy": busy_ms / step_ms,
            "device_ms_per_step_no_events": free_ms,
            "enqueue_ms_per_step_no_events": free_enqueue_ms,
            "bound": "device" if free_ms >= free_enqueue_ms else "host",
            "replay": path,
            "replay_paths": {k: {"device_ms": v[0], "enqueue_ms": v[1]}
                             for k, v in replay.items()},
            "kernel_us_per_step": by_name, "gpu_clocks": clocks,
            "prompt_chunk_rows": min(len(ids), model.chunk), "prompt_chunk_kernel_us": prompt}


def _by_name(records, steps: int) -> dict[str, float]:
    """Kernel microseconds per step, by the first part of the launch name, largest first."""
    out: dict[str, float] = {}
    for r in records:
        key = r.name.split(".")[0]
        out[key] = out.get(key, 0.0) + r.duration_ns / steps / 1e3
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _hf_from_gguf(path: str):
    """The test suite's reference: transformers' Llama holding the GGUF's dequantized weights."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from tests.llm.reference import hf_model_from_gguf

    return hf_model_from_gguf(path)


def bench_torch(path: str, ids: list[int], new: int) -> dict | None:
    """transformers eager: float16 on the GPU when PyTorch sees one, else float32 on the CPU."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    cuda = torch.cuda.is_available()
    dtype = torch.float16 if cuda else torch.float32
    if path.endswith(".gguf"):
        from gguf import GGUFReader

        arch = GGUFReader(path).fields["general.architecture"].contents()
        if arch != "llama":  # (the test suite's reference builds Llama models only)
            print(f"transformers: no reference for a GGUF of architecture {arch!r}; skipped",
                  flush=True)
            return None
        model = _hf_from_gguf(path)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                     attn_implementation="eager")
    model = model.to("cuda" if cuda else "cpu", dtype=dtype).eval()
    model.config._attn_implementation = "eager"
    x = torch.tensor([ids], device=model.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    with torch.no_grad():
        model(x)
        model.generate(x, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
        prefill = statistics.median(timed(lambda: model(x)) for _ in range(3))
        total = statistics.median(
            timed(lambda: model.generate(x, max_new_tokens=new, min_new_tokens=new,
                                         do_sample=False, pad_token_id=0)) for _ in range(3))
    decode = max(total - prefill, 1e-9)
    where = torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)"
    name = f"transformers eager, torch {torch.__version__}, {str(dtype)[6:]}, {where}"
    model.to("cpu")
    if cuda:
        torch.cuda.empty_cache()
    return {"name": name, "prefill_tps": len(ids) / prefill, "decode_tps": (new - 1) / decode}


def bench_llama_cpp(path: str, ids: list[int], new: int) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(path, n_ctx=1024, verbose=False)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for n, _ in enumerate(llm.generate(ids, temp=0.0, reset=True)):
        if n + 1 >= new:
            break
    total = time.perf_counter() - t0
    return {"name": "llama.cpp (llama-cpp-python)", "prefill_tps": len(ids) / prefill,
            "decode_tps": new / max(total - prefill, 1e-9)}


def bench_llama_bench(binary: str, path: str, prompts: list[int], new: int,
                      depths: list[int], extra: list[str]) -> dict:
    """llama.cpp's own benchmark (``llama-bench``) on the same file: pp (prompt tokens/s) for
    each prompt length; tg (decode tokens/s) for ``new`` tokens after prompts[0] tokens of
    context (``-d``: the positions clops decodes at after its prompt), after an empty context
    (llama-bench's default; ``decode_tps_empty``) and after ``depths`` tokens of context.
    Medians of its repetitions."""
    import subprocess

    def run(args: list[str]) -> list[dict]:
        cmd = [binary, "-m", path, "-r", "5", "-o", "json", *extra, *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n"
                               f"{res.stderr[-3000:]}")
        return json.loads(res.stdout)

    def tps(rec: dict) -> float:
        samples = rec.get("samples_ts")
        return float(statistics.median(samples)) if samples else float(rec["avg_ts"])

    recs = run(["-p", ",".join(map(str, prompts)), "-n", str(new)])
    out: dict = {"name": "llama.cpp (llama-bench)", "binary": binary, "args": extra,
                 "pp": {}, "decode_at": {}}
    # scripts/llama_cpp.sh notes which source distribution it built from
    stamp = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(binary))), "src",
                         "llama.cpp", "CLOPS_SOURCE")
    if os.path.exists(stamp):
        with open(stamp) as f:
            out["source"] = f.read().strip()
    for r in recs:
        if r.get("n_gen", 0) == 0:
            out["pp"][str(r["n_prompt"])] = tps(r)
        else:
            out["decode_tps_empty"] = tps(r)
        for key in ("build_commit", "build_number", "gpu_info", "cpu_info", "backends",
                    "n_threads", "flash_attn", "type_k"):
            if key in r:
                out.setdefault(key, r[key])
    out["prefill_tps"] = out["pp"].get(str(prompts[0]), 0.0)
    # (decode where clops' is measured: after the prompt's tokens)
    for r in run(["-p", "0", "-n", str(new), "-d", ",".join(map(str, [prompts[0], *depths]))]):
        if r["n_depth"] == prompts[0]:
            out["decode_tps"] = tps(r)
        else:
            out["decode_at"][str(r["n_depth"])] = tps(r)
    return out


def bench_clops_depths(path: str, device: str | None, ids: list[int], depths: list[int],
                       new: int) -> dict[str, float]:
    """clops' decode tok/s after ``depth`` tokens of context (the prompt), for each depth."""
    model = clops.llm.load(path, device=device, max_seq_len=max(depths) + new + 8,
                           progress=False)
    out = {}
    for d in depths:
        runs = []
        for _ in range(2):
            list(model.generate_ids(ids[:d], max_new_tokens=new, stop_ids=[]))
            runs.append(model.stats.decode_tps)
        out[str(d)] = max(runs)
    return out


def bytes_per_token(model, pos: int) -> dict:
    """What one decode step at position ``pos`` reads: every weight matrix once (the embedding
    only its row; of a mixture of experts the router and the k chosen experts' weights, k / n
    of theirs) and the KV cache up to ``pos``."""
    seen: set[int] = set()
    weights = 0
    for ly in model.layers:
        mats = [p[0] for p in ly.qkv.parts] + [ly.o]
        if ly.experts is not None:
            ex = ly.experts
            mats.append(ex.router)
            weights += sum(w.nbytes for w in ex.products()) * ex.k // ex.n
        else:
            mats += [p[0] for p in ly.gate_up.parts] + [ly.down]
        for w in mats:
            if id(w) not in seen:
                seen.add(id(w))
                weights += w.nbytes
    weights += model.output.nbytes
    cfg = model.config
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * (2 if model.kv_half else 4)
    return {"weights": weights, "kv_per_position": kv, "total": weights + kv * pos}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--shape", choices=["llama-3.2-1b"], default=None,
                    help="a model of this shape with random float16 weights")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--json", default="bench/results/llm.json")
    ap.add_argument("--no-peers", action="store_true", help="measure clops only")
    ap.add_argument("--label", default=None, help="the model's name in the results")
    ap.add_argument("--llama-bench", default=None, metavar="PATH",
                    help="llama.cpp's llama-bench binary (scripts/llama_cpp.sh builds it): its "
                    "figures on the same file go beside clops'")
    ap.add_argument("--llama-bench-args", default="-ngl 99",
                    help="more arguments for llama-bench (default: %(default)s; on a CPU "
                    "give e.g. '-t 2 -ngl 0')")
    ap.add_argument("--pp", default="512", help="more prompt lengths to time prefill at")
    ap.add_argument("--depths", default="",
                    help="context lengths to time decode at (e.g. 4096,16384)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --llama-bench: rounds of both engines in turn, each figure the "
                    "median of its rounds (default: %(default)s)")
    args = ap.parse_args(argv)
    tmp = None
    pps = [int(v) for v in args.pp.split(",") if v]
    depths = [int(v) for v in args.depths.split(",") if v]
    if args.shape:
        tmp = tempfile.TemporaryDirectory()
        path, label = tmp.name, "Llama-3.2-1B shape, random float16 weights"
        make_llama_1b(path)
        rng = np.random.default_rng(0)
        ids = [int(i) for i in rng.integers(0, LLAMA_1B["vocab_size"] - 3, args.prompt_tokens)]
    else:
        path = args.model or clops.llm.default_model_path()
        label = args.label or os.path.basename(path)
        tok = clops.llm.load_tokenizer(path)  # (no weights: a large body loads once)
        longest = max([args.prompt_tokens, *pps, *depths])
        stream = tok.encode(TEXT * (longest // 30 + 20))
        ids = stream[: args.prompt_tokens]
    if args.shape:
        stream = [int(i) for i in rng.integers(0, LLAMA_1B["vocab_size"] - 3,
                                               max([args.prompt_tokens, *pps, *depths]))]
    def save(rows: list[dict], final: bool = False) -> None:
        # (after each engine, so that a run stopped by a time limit keeps what it measured)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"bench": "llm", "model": label, "prompt_tokens": len(ids),
                       "new_tokens": args.new_tokens, "complete": final, "rows": rows}, f,
                      indent=1)

    def measured(rows: list[dict]) -> None:
        r = rows[-1]
        pp = ", ".join(f"pp{n} {v:.1f}" for n, v in r.get("pp", {}).items() if v)
        print(f"measured {r['name']}: prefill {r['prefill_tps']:.1f} tok/s, decode "
              f"{r['decode_tps']:.1f} tok/s{', ' + pp if pp else ''}", flush=True)
        save(rows)

    rows = [bench_clops(path, args.device, ids, args.new_tokens,
                        {n: stream[:n] for n in pps})]
    measured(rows)
    if depths:
        rows[0]["decode_at"] = bench_clops_depths(path, args.device, stream, depths,
                                                  args.new_tokens)
    if args.llama_bench:
        if args.shape:
            raise SystemExit("--llama-bench needs a GGUF file (-m), not --shape")
        with gpu_clocks(nvidia_smi_id(clops.device(args.device))) as clocks:
            rows.append(bench_llama_bench(args.llama_bench, path, [args.prompt_tokens, *pps],
                                          args.new_tokens, depths,
                                          args.llama_bench_args.split()))
        rows[-1]["gpu_clocks"] = clocks
        measured(rows)
        if args.rounds > 1:
            rounds_with_llama_bench(rows, path, args.device, ids, args.new_tokens,
                                    {n: stream[:n] for n in pps}, args.rounds,
                                    args.llama_bench, args.llama_bench_args.split())
    if not args.no_peers:
        rows += [r for r in (bench_torch(path, ids, args.new_tokens),
                             bench_llama_cpp(path, ids, args.new_tokens)) if r]
    print(f"{label}, {len(ids)} prompt tokens, {args.new_tokens} new tokens, "
          f"{platform.processor() or platform.machine()}")
    print(f"{'engine':<64} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for r in rows:
        print(f"{r['name']:<64} {r['prefill_tps']:>14.1f} {r['decode_tps']:>13.1f}")
    c = rows[0]
    print(f"clops decode step: {c['launches_per_step']} launches in "
          f"{c['enqueues_per_step']} enqueue(s), "
          f"{c['enqueue_ms_per_step']:.2f} ms to enqueue from Python, "
          f"{c['device_ms_per_step']:.2f} ms of kernels, device busy {c['gpu_busy']:.0%}; "
          f"without events {c['enqueue_ms_per_step_no_events']:.2f} ms to enqueue, "
          f"{c['device_ms_per_step_no_events']:.2f} ms on the device: {c['bound']}-bound "
          f"(replayed by {c['replay']})")
    for name, v in c["replay_paths"].items():
        print(f"  {name}: {v['enqueue_ms']:.3f} ms to enqueue a step, "
              f"{v['device_ms']:.3f} ms on the device")
    print("kernel us per step: " + ", ".join(f"{k} {v:.0f}"
                                            for k, v in c["kernel_us_per_step"].items()))
    print(f"kernel us per prompt chunk of {c['prompt_chunk_rows']} rows: "
          + ", ".join(f"{k} {v:.0f}" for k, v in c["prompt_chunk_kernel_us"].items()))
    m = c["bytes_per_token"]
    print(f"per token {m['total'] / 1e6:.1f} MB read ({m['weights'] / 1e6:.1f} MB of weights): "
          f"{c['of_copy_bw']:.2f} of the copy bandwidth ({c['copy_ceiling_gbps']:.0f} GB/s)")
    for r in rows:
        if r.get("gpu_clocks"):
            k = r["gpu_clocks"]
            print(f"{r['name']}: SM clock {k['sm_mhz_median']:.0f} MHz (median; lowest "
                  f"{k['sm_mhz_min']}), memory {k['mem_mhz_median']:.0f} MHz, "
                  f"{k['samples']} samples")
    for peer in rows[1:]:
        ratios = [f"decode {c['decode_tps'] / peer['decode_tps']:.2f}x"]
        if peer.get("decode_tps_empty"):
            ratios.append(f"decode beside {peer['name']}'s from an empty context "
                          f"{c['decode_tps'] / peer['decode_tps_empty']:.2f}x")
        for n, v in peer.get("pp", {}).items():
            if n in c["pp"] and v:
                ratios.append(f"pp{n} {c['pp'][n] / v:.2f}x")
        for d, v in peer.get("decode_at", {}).items():
            if d in c.get("decode_at", {}) and v:
                ratios.append(f"decode at {d} {c['decode_at'][d] / v:.2f}x")
        if "pp" not in peer:
            ratios.append(f"prefill {c['prefill_tps'] / peer['prefill_tps']:.2f}x")
        print(f"clops vs {peer['name']}: " + ", ".join(ratios))
    for d, v in c.get("decode_at", {}).items():
        print(f"clops decode after {d} tokens of context: {v:.1f} tok/s")
    save(rows, final=True)
    print(f"wrote {args.json}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
