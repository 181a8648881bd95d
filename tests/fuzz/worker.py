"""Fuzz tests, the child process: loads the model files it is sent, one a line on stdin, and
answers each with one line on stdout (``@@case`` and a JSON outcome): rejected with a clean
error, loaded (finite logits that agree with the numpy reference, a short generation), or what
went wrong. Runs under an address-space limit (``resource.setrlimit``); the parent kills it
when a case takes too long and counts a signal as a crash.

    python -m tests.fuzz.worker --memory-mb 3072 [--device cpu]

A request is ``{"id": 3, "path": "/tmp/.../model.gguf", "reference": true}`` or, to test the
harness itself, ``{"id": 3, "probe": "abort"}`` (abort, segv, hang, alloc, ok).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import resource
import sys
import time
import traceback
from typing import Any

import numpy as np

MARK = "@@case "
N_TOKENS = 12
# A loaded model's logits must agree with the float64 reference to this fraction of their
# largest magnitude (clops computes in float32: the unmutated tiny models agree to 1e-6; a
# weight read from the wrong place is off by far more than this).
REFERENCE_TOLERANCE = 2e-3
# Exceptions that are a clean refusal of a bad file (ModelFileError is a ValueError).
CLEAN = (ValueError, MemoryError)
_LIMIT = {"bytes": 0}


def _source(path: str) -> Any:
    from clops.llm import safetensors_file
    from clops.llm.gguf_file import GGUFFile
    from clops.llm.weights import GGUFSource, SafetensorsSource

    if os.path.isdir(path):
        return SafetensorsSource(path, safetensors_file.open_directory(path)[1])
    return GGUFSource(GGUFFile(path))


def _probe(kind: str) -> dict[str, Any]:
    """Misbehaviour on request, to show that the parent notices it."""
    if kind == "abort":
        os.abort()
    if kind == "hang":
        while True:
            time.sleep(1)
    if kind == "alloc":  # as much address space as the limit: refused only under the limit
        import mmap

        try:
            mmap.mmap(-1, _LIMIT["bytes"]).close()
        except OSError as e:
            return {"outcome": "rejected", "type": "MemoryError", "detail": str(e)}
        return {"outcome": "loaded", "detail": f"mapped {_LIMIT['bytes']} bytes"}
    if kind == "segv":
        import ctypes

        ctypes.string_at(0)
    return {"outcome": "loaded", "detail": "probe ok"}


def run_case(req: dict[str, Any], device: Any) -> dict[str, Any]:
    """One case: load, run, compare; the outcome as a dict."""
    import clops.llm

    if "probe" in req:
        return _probe(req["probe"])
    path = req["path"]
    stage = "load"
    try:
        # float rows: the comparison is with a float reference at a tolerance that int8 rows
        # (native CPU products, dp4a) would pass only by chance
        model = clops.llm.load(path, device=device, max_seq_len=64, progress=False,
                               int8_activations=False)
        stage = "run"
        cfg = model.config
        ids = [(7 * i + 1) % cfg.vocab_size for i in range(min(N_TOKENS, model.max_seq))]
        logits = model.logits(ids)
        if not np.isfinite(logits).all():
            bad = int((~np.isfinite(logits)).sum())
            return {"outcome": "nonfinite",
                    "detail": f"{bad} of {logits.size} logits are NaN or inf"}
        new = list(model.generate_ids(ids, max_new_tokens=2, seed=1))
        if not all(0 <= t < cfg.vocab_size for t in new):
            return {"outcome": "error", "type": "generate",
                    "detail": f"generated ids {new} outside the vocabulary"}
        text = model.tokenizer.decode(model.tokenizer.encode("the rain in spain"))
        if req.get("reference", True):
            stage = "reference"
            want = reference_logits_of(path, cfg, ids)
            err = float(np.abs(logits - want).max())
            scale = max(1.0, float(np.abs(want).max()))
            if not err <= REFERENCE_TOLERANCE * scale:
                return {"outcome": "mismatch",
                        "detail": f"logits off the numpy reference by {err:.3g} (largest "
                                  f"{scale:.3g})"}
        return {"outcome": "loaded", "detail": f"{cfg.arch} {cfg.n_layers} layers; {text!r}"}
    except CLEAN as e:
        if stage == "load" or isinstance(e, MemoryError):
            return {"outcome": "rejected", "type": type(e).__name__, "detail": str(e)[:500]}
        return _error(e, stage)
    except Exception as e:  # noqa: BLE001 - any other exception is the finding
        return _error(e, stage)


def _error(e: BaseException, stage: str) -> dict[str, Any]:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return {"outcome": "error", "type": type(e).__name__,
            "detail": f"during {stage}: {str(e)[:300]}\n{''.join(tb[-3:])[-1200:]}"}


def reference_logits_of(path: str, cfg: Any, ids: list[int]) -> np.ndarray:
    from .reference import reference_logits

    with np.errstate(all="ignore"):
        return reference_logits(_source(path), cfg, ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--memory-mb", type=int, default=3072)
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    limit = _LIMIT["bytes"] = args.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash is reported, not dumped
    faulthandler.enable()
    import clops

    device = clops.device(args.device)
    out = sys.stdout
    out.write(MARK + json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        t0 = time.perf_counter()
        res = run_case(req, device)
        res["id"] = req["id"]
        res["seconds"] = round(time.perf_counter() - t0, 3)
        out.write(MARK + json.dumps(res) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
