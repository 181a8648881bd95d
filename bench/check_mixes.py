"""Every mix llama.cpp's ``llama-quantize`` writes, made from one F16 model and run by clops:
the mix's matrix types, that it loads and generates, and its logits' distance from the F16
model's (the largest difference over the largest F16 logit, for ten tokens).

    scripts/llama_cpp.sh build .whl/llama.cpp.tar.gz /tmp/lcpu cpu llama-quantize
    python bench/models.py write PREP /tmp/models --only llama1b-f16
    python bench/check_mixes.py --llama-quantize /tmp/lcpu/bin/llama-quantize \\
        --f16 /tmp/models/llama1b-f16.gguf --out /tmp/mixes

A body of random weights carries each matrix's quantization error through every layer, so the
distance grows with fewer bits; it is a check that each mix runs, not a measure of its quality
(the types' values are checked bit for bit in ``tests/nn/test_gguf_types.py``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clops.llm  # noqa: E402
from clops.llm.gguf_file import GGUFFile, ggml_type_name  # noqa: E402

MIXES = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
         "Q8_0", "IQ4_NL", "IQ4_XS")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-quantize", required=True, metavar="PATH")
    ap.add_argument("--f16", required=True, help="the F16 GGUF every mix is made from")
    ap.add_argument("--out", default="/tmp/mixes", help="where the mixes are written")
    ap.add_argument("--device", default=None)
    ap.add_argument("--mixes", default=",".join(MIXES))
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    ids = list(range(100, 110))
    ref = clops.llm.load(a.f16, device=a.device, max_seq_len=64, progress=False)
    want = ref.logits(ids)
    del ref
    print("| mix | file | matrices | runs | logits' distance from F16 |")
    print("|---|---|---|---|---|")
    failed = 0
    for mix in a.mixes.split(","):
        path = os.path.join(a.out, f"{os.path.basename(a.f16).rsplit('.', 1)[0]}-{mix}.gguf")
        if not os.path.exists(path):
            res = subprocess.run([a.llama_quantize, a.f16, path, mix], capture_output=True,
                                 text=True)
            if res.returncode != 0:
                print(f"| {mix} | llama-quantize failed: {res.stderr.strip()[-200:]} | | | |")
                failed += 1
                continue
        types = Counter(ggml_type_name(t.ggml_type) for t in GGUFFile(path).tensors.values()
                        if len(t.shape) > 1)
        t0 = time.perf_counter()
        try:
            model = clops.llm.load(path, device=a.device, max_seq_len=64, progress=False)
            got = model.logits(ids)
            new = list(model.generate_ids(ids, 4, stop_ids=[]))
        except Exception as e:  # noqa: BLE001 - reported in the table
            print(f"| {mix} | {os.path.getsize(path) / 2**20:.0f} MiB | {dict(types)} | "
                  f"FAILED: {type(e).__name__}: {str(e)[:200]} | |")
            failed += 1
            continue
        dist = float(np.abs(got - want).max() / np.abs(want).max())
        print(f"| {mix} | {os.path.getsize(path) / 2**20:.0f} MiB | "
              f"{', '.join(f'{n} {t}' for t, n in types.most_common())} | "
              f"{len(new)} tokens in {time.perf_counter() - t0:.0f} s | {dist:.2f} |", flush=True)
        del model
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
