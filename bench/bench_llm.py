"""Benchmark: prefill and decode tokens/s of SmolLM2-135M-Instruct (GGUF) with clops on an OpenCL
device, beside transformers on PyTorch CPU (same dequantized weights) and llama.cpp's Python
binding when it is installed, in the same run. Prints a table and writes JSON.

    python bench/bench_llm.py [--device cpu] [--prompt-tokens 128] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import clops  # noqa: E402
import clops.llm  # noqa: E402

TEXT = ("Oxygen is the chemical element with the symbol O and atomic number 8. It is a member "
        "of the chalcogen group in the periodic table, a highly reactive nonmetal, and an "
        "oxidizing agent that readily forms oxides with most elements. ")


def bench_clops(path: str, device: str | None, ids: list[int], new: int) -> dict:
    model = clops.llm.load(path, device=device, max_seq_len=1024, progress=False)
    list(model.generate_ids(ids, max_new_tokens=4, stop_ids=[]))  # builds kernels once
    list(model.generate_ids(ids, max_new_tokens=new, stop_ids=[]))
    st = model.stats
    # how long the host takes to enqueue one decode step (the step itself runs on the device)
    plan = model._plan(1, "last", True)
    model.device.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        plan.replay()
    enqueue = (time.perf_counter() - t0) / 20
    model.device.synchronize()
    return {"name": f"clops ({model.device.name[:30]})", "prefill_tps": st.prefill_tps,
            "decode_tps": st.decode_tps, "launches_per_step": len(plan.launches),
            "enqueue_ms_per_step": enqueue * 1e3}


def _hf_from_gguf(path: str):
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import LlamaConfig, LlamaForCausalLM

    r = GGUFReader(path)

    def m(k):
        return r.fields[k].contents()

    nh, nkv = int(m("llama.attention.head_count")), int(m("llama.attention.head_count_kv"))
    cfg = LlamaConfig(vocab_size=int(m("llama.vocab_size")),
                      hidden_size=int(m("llama.embedding_length")),
                      intermediate_size=int(m("llama.feed_forward_length")),
                      num_hidden_layers=int(m("llama.block_count")), num_attention_heads=nh,
                      num_key_value_heads=nkv,
                      rms_norm_eps=float(m("llama.attention.layer_norm_rms_epsilon")),
                      rope_theta=float(m("llama.rope.freq_base")), tie_word_embeddings=True)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": float(m("llama.rope.freq_base"))}
    top = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight"}
    per = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
           "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
           "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    sd = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(s) for s in reversed(t.shape.tolist())])
        if t.name in top:
            sd[top[t.name]] = w
            continue
        _, i, kind, _ = t.name.split(".")
        if kind in ("attn_q", "attn_k"):  # back to split-halves rotary order
            h = nh if kind == "attn_q" else nkv
            w = w.reshape(h, w.shape[0] // h // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)
        sd[f"model.layers.{i}.{per[kind]}.weight"] = w
    model = LlamaForCausalLM(cfg).eval()
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()},
                          strict=False)
    model.tie_weights()
    return model


def bench_torch(path: str, ids: list[int], new: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    model = _hf_from_gguf(path)
    x = torch.tensor([ids])
    with torch.no_grad():
        model(x)
        t0 = time.perf_counter()
        model(x)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       pad_token_id=0)
        total = time.perf_counter() - t0
    decode = max(total - prefill, 1e-9)
    return {"name": f"transformers {torch.__version__} CPU ({torch.get_num_threads()} threads)",
            "prefill_tps": len(ids) / prefill, "decode_tps": (new - 1) / decode}


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--json", default="bench_llm.json")
    ap.add_argument("--no-peers", action="store_true", help="measure clops only")
    args = ap.parse_args()
    path = args.model or clops.llm.default_model_path()
    tok = clops.llm.load(path, device=args.device, max_seq_len=64, progress=False).tokenizer
    ids = (tok.encode(TEXT * 20))[: args.prompt_tokens]
    rows = [bench_clops(path, args.device, ids, args.new_tokens)]
    if not args.no_peers:
        rows += [r for r in (bench_torch(path, ids, args.new_tokens),
                             bench_llama_cpp(path, ids, args.new_tokens)) if r]
    print(f"SmolLM2-135M-Instruct ({os.path.basename(path)}), {len(ids)} prompt tokens, "
          f"{args.new_tokens} new tokens, {platform.processor() or platform.machine()}")
    print(f"{'engine':<52} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for r in rows:
        print(f"{r['name']:<52} {r['prefill_tps']:>14.1f} {r['decode_tps']:>13.1f}")
    c = rows[0]
    print(f"clops decode step: {c['launches_per_step']} launches, "
          f"{c['enqueue_ms_per_step']:.2f} ms to enqueue from Python")
    with open(args.json, "w") as f:
        json.dump({"prompt_tokens": len(ids), "new_tokens": args.new_tokens, "rows": rows}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
