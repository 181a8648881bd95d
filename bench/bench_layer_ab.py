"""The layer kernel (``decode_layers``: a decode row's layers in a few launches) against the
per-layer plans, for one stream, in interleaved runs of one process: ``Model``'s decode and the
batched engine's lone row (``lone_row`` against ``single_row``), the wall time a token (median
of the gaps after ``--skip`` tokens) of each, and the launches a step.

    python bench/bench_layer_ab.py MODEL.gguf [MODEL.gguf ...] [--device gpu] [--rounds 4]
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
from profile_step import _engine_tokens, _model_tokens, _per_token  # noqa: E402

import clops.llm  # noqa: E402
from clops.llm.batch import LONE, SINGLE  # noqa: E402


def _use_kernel(model, engine, on: bool) -> None:
    """Both builders' choice of the layer kernel set to ``on`` (where it takes the layers),
    their plans made again."""
    for builder in (model._builder, engine.builder):
        builder.whole = None
        if on:
            builder.whole_layers()
        else:
            builder.whole = False
    model._plans.clear()
    engine._plans.clear()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    stream_args(ap)
    a = ap.parse_args(argv)
    out = []
    for path in a.models:
        model = clops.llm.load(path, device=a.device, max_seq_len=a.prompt + a.new + 64,
                               progress=False)
        ids = np.random.default_rng(0).integers(100, model.config.vocab_size - 1,
                                                a.prompt).tolist()
        engine = model._engine_for([len(ids) + a.new])
        taken = model._builder.whole_layers()
        ms: dict[str, list[float]] = {}
        launches: dict[str, int] = {}
        tokens: dict[str, list[int]] = {}
        for r in range(a.rounds + 1):  # (the first round builds)
            for on in ((True, False) if taken else (False,)):
                _use_kernel(model, engine, on)
                tag = "kernel" if on else "per-layer"
                got = list(model.generate_ids(ids, max_new_tokens=a.new, stop_ids=[]))
                tokens.setdefault(f"model {tag}", got)
                for kind, run in (("model", _model_tokens), ("engine", _engine_tokens)):
                    t = _per_token(run(model, ids, a.new), a.skip) * 1e3
                    if r:
                        ms.setdefault(f"{kind} {tag}", []).append(t)
                plan = engine._plans.get(LONE if on else SINGLE)
                if plan is not None:
                    launches[f"engine {tag}"] = len(plan.plan.launches)
        same = len({tuple(v) for v in tokens.values()}) == 1
        row = {"model": os.path.basename(path), "device": model.where,
               "kernel takes the layers": taken, "launches a step": launches,
               "same greedy tokens": same,
               **{f"{k} ms": statistics.median(v) for k, v in ms.items()},
               **{f"{k} runs ms": v for k, v in ms.items()}}
        print(f"{row['model']}: kernel {'takes' if taken else 'does not take'} the layers; "
              f"launches {launches}; same tokens {same}; {per_token_summary(ms)}", flush=True)
        out.append(row)
    if a.json:
        write_json(a.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
