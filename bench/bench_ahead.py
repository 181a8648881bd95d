"""A lone greedy stream through the batched engine with its next step enqueued ahead of the
token's read-back (``BatchEngine._may_run_ahead``) and without, in interleaved runs of one
process: the wall time a token (median of the gaps after ``--skip`` tokens) of each.

    python bench/bench_ahead.py MODEL.gguf [MODEL.gguf ...] [--device gpu] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import per_token_summary, stream_args, write_json  # noqa: E402
from profile_step import _engine_tokens, _per_token  # noqa: E402

import clops.llm  # noqa: E402
from clops.llm.batch import BatchEngine  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    stream_args(ap)
    a = ap.parse_args(argv)
    ahead = BatchEngine._may_run_ahead
    variants = {"ahead": ahead, "no ahead": lambda self, s, pending: False}
    out = []
    try:
        for path in a.models:
            model = clops.llm.load(path, device=a.device, max_seq_len=a.prompt + a.new + 64,
                                   progress=False)
            ids = np.random.default_rng(0).integers(100, model.config.vocab_size - 1,
                                                    a.prompt).tolist()
            _engine_tokens(model, ids, 8)  # (builds)
            ms: dict[str, list[float]] = {k: [] for k in variants}
            for _ in range(a.rounds):
                for name, may in variants.items():
                    BatchEngine._may_run_ahead = may  # type: ignore[method-assign]
                    ms[name].append(_per_token(_engine_tokens(model, ids, a.new), a.skip) * 1e3)
            BatchEngine._may_run_ahead = ahead  # type: ignore[method-assign]
            row = {"model": os.path.basename(path), "device": model.where,
                   **{f"{k} ms": statistics.median(v) for k, v in ms.items()},
                   **{f"{k} runs ms": v for k, v in ms.items()}}
            print(f"{row['model']}: {per_token_summary(ms)}", flush=True)
            out.append(row)
    finally:
        BatchEngine._may_run_ahead = ahead  # type: ignore[method-assign]
    if a.json:
        write_json(a.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
