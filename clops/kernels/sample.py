"""Kernels, sampling: the launches of ``sample.cl`` (temperature, top-k, top-p, min-p, the
repetition penalty and the draw of the next token, on the device) and of ``argmax.cl`` (the
greedy choice over several work-groups, the float16 LM head that makes it too, and a batch's
rows' argmax and log-sum-exp)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _config
from ..runtime import CLDevice
from ..runtime.pool import Buffer
from . import launch
from .launch import Launch, f32, i32, kernel, pow2_at_most

# The positions of the sampler's settings in the launch's arguments (``sample``; ``greedy``
# takes the penalty alone), where a recorded plan changes them between replays.
SETTING_ARGS = {"temperature": 8, "top_k": 9, "top_p": 10, "min_p": 11, "penalty": 12,
                "seed": 13}
GREEDY_ARGS = {"penalty": 8}
# (``head_greedy`` takes the penalty at the same place)


def is_greedy(temperature: float) -> bool:
    """Whether ``sample`` at ``temperature`` launches the greedy kernel (argmax)."""
    return temperature <= 0.0


def setting_args(ln: Launch) -> dict[str, int]:
    """The positions of the settings a ``sample`` launch takes."""
    return GREEDY_ARGS if ln.name in ("greedy", "head_greedy") else SETTING_ARGS


def sample_lsize(dev: CLDevice) -> int:
    return 16 if launch.is_cpu(dev) else min(512, pow2_at_most(dev.caps.max_work_group))


def sample(dev: CLDevice, tokens: Buffer, state: Buffer, seen: Buffer, logits: Buffer,
           l_off: int, z: Buffer, *, vocab: int, advance: int, temperature: float, top_k: int,
           top_p: float, min_p: float, penalty: float, seed: int) -> Launch:
    """The next token from the ``vocab`` logits at ``l_off`` (repetition penalty over ``seen``,
    temperature, min-p, top-k, top-p and a draw seeded by ``seed``; argmax at temperature <= 0),
    written to tokens[state[0] + advance]; state[0] moves on by ``advance``. ``z``: ``vocab``
    floats of scratch. At temperature <= 0, where the vocabulary is large enough, the argmax
    runs over several work-groups (the ``greedy`` kernel, whose settings are the penalty alone:
    a temperature > 0 needs a new launch) and state[3] must be zero (it is left zero)."""
    nt = sample_lsize(dev)
    # (greedy: work-groups of nt for 4 logits each at least, two at least)
    groups = min(dev.caps.compute_units, 128, vocab // (4 * nt))
    if is_greedy(temperature) and groups >= 2:
        ptx = not launch.is_cpu(dev) and dev.probe("nvidia_ptx")
        knl = kernel(dev, "argmax", "greedy", NT=nt, PTX_FENCE=int(ptx))
        args = [tokens, state, seen, logits, i32(l_off), z, i32(vocab), i32(advance),
                f32(penalty)]
        return Launch(knl, (groups * nt,), (nt,), args, [logits, state, seen],
                      [tokens, state, seen, z], "greedy")
    knl = kernel(dev, "sample", "sample", NT=nt)
    args = [tokens, state, seen, logits, i32(l_off), z, i32(vocab), i32(advance),
            f32(temperature), i32(top_k), f32(top_p), f32(min_p), f32(penalty),
            np.uint32(seed & 0xFFFFFFFF)]
    return Launch(knl, (nt,), (nt,), args, [logits, state, seen], [tokens, state, seen, z],
                  "sample")


def row_stats(dev: CLDevice, stats: Buffer, logits: Buffer, *, rows: int, vocab: int) -> Launch:
    """Per row of ``logits`` [rows][vocab]: (argmax as float bits, max, log-sum-exp) into
    ``stats`` [rows][3] (``argmax.cl`` row_stats)."""
    nt = sample_lsize(dev)
    knl = kernel(dev, "argmax", "row_stats", NT=nt)
    return Launch(knl, (nt, rows), (nt, 1), [stats, logits, i32(vocab)], [logits], [stats],
                  "row_stats")


# work-groups of the LM head's kernel a compute unit, rows a warp loads at a time where rows
# are 2048 values long (fewer where longer: a lane holds as many registers of weights), and the
# longest rows it takes in a model (the PERF note at argmax.cl's head_greedy)
HEAD_GROUPS_PER_CU = 1
HEAD_ROWS = 2
HEAD_MAX_K = 4096


def _head_local_nbytes(k: int, nt: int) -> int:
    return 4 * k + 8 * nt + 16  # (x's normed values, the reductions' floats and ints)


def takes_head(dev: CLDevice, w: Any) -> bool:
    """Whether ``head_greedy`` makes a decode row's logits and greedy token from the weight
    ``w`` on ``dev`` (where it was measured faster than the product and ``greedy``: NVIDIA,
    float16 row-major weights, rows of a multiple of 256 values up to HEAD_MAX_K);
    ``CLOPS_HEAD_GREEDY=0`` keeps the product and ``greedy``."""
    if not _config.head_greedy() or launch.is_cpu(dev):
        return False
    return (w.fmt == "f16" and w.layout == "rows" and w.k % 256 == 0 and w.k <= HEAD_MAX_K
            and w.n >= 2 * dev.caps.compute_units
            and _head_local_nbytes(w.k, 256) <= dev.caps.local_mem and dev.probe("nvidia_ptx"))


def head_greedy(dev: CLDevice, tokens: Buffer, state: Buffer, seen: Buffer, logits: Buffer,
                l_off: int, z: Buffer, x: Buffer, x_off: int, w: Any,
                norm: tuple[Buffer, float] | None, *, advance: int, penalty: float,
                groups: int | None = None, ptx: bool | None = None) -> Launch:
    """The LM head of one row (``x`` at ``x_off``, through RMSNorm with ``norm`` = (weight,
    eps) where given) with float16 row-major weights ``w`` [vocab, k], its logits into
    ``logits`` at ``l_off``, and the greedy token (the penalized argmax, as ``sample`` at
    temperature 0 chooses it) into tokens[state[0] + advance]; state[0] moves on by
    ``advance``. ``z``: two floats a work-group of scratch; state[3] must be zero (it is left
    zero). ``groups`` (default: HEAD_GROUPS_PER_CU a compute unit) and ``ptx`` (warp shuffles,
    default where the probe finds them) are for tests and benchmarks."""
    if w.fmt != "f16" or w.layout != "rows" or w.k % 256:
        raise ValueError(f"head_greedy takes float16 row-major weights of rows of a multiple of "
                         f"256 values, not {w.fmt} {w.layout} rows of {w.k}")
    nt = min(256, pow2_at_most(dev.caps.max_work_group))
    if nt < 32:
        raise ValueError(f"head_greedy needs work-groups of 32 work-items at least; "
                         f"{dev.name} takes {dev.caps.max_work_group}")
    if _head_local_nbytes(w.k, nt) > dev.caps.local_mem:
        raise ValueError(f"head_greedy: rows of {w.k} values need "
                         f"{_head_local_nbytes(w.k, nt)} bytes of local memory; {dev.name} has "
                         f"{dev.caps.local_mem}")
    ng = max(1, min(groups or HEAD_GROUPS_PER_CU * dev.caps.compute_units, w.n // 2))
    if z.nbytes < 8 * ng:
        raise ValueError(f"head_greedy: z holds {z.nbytes} bytes, {8 * ng} needed")
    if ptx is None:
        ptx = not launch.is_cpu(dev) and dev.probe("nvidia_ptx")
    knl = kernel(dev, "argmax", "head_greedy", NT=nt, HK=w.k, NORM=int(norm is not None),
                 HPTX=int(ptx), PTX_FENCE=int(ptx), HRB=max(1, HEAD_ROWS * 2048 // w.k))
    nw = norm[0] if norm is not None else x
    args = [tokens, state, seen, logits, i32(l_off), z, i32(w.n), i32(advance), f32(penalty),
            x, i32(x_off), nw, f32(norm[1] if norm is not None else 0.0), w.data]
    reads = [state, seen, x, w.data] + ([norm[0]] if norm is not None else [])
    return Launch(knl, (ng * nt,), (nt,), args, reads, [tokens, state, seen, logits, z],
                  "head_greedy")
