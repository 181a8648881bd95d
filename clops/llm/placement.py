"""llm, placement: which layers of a model go to which device when it is split over several
(``clops.llm.load(path, device="gpu:0,gpu:1")``).

Each device takes a contiguous run of layers, the first the token embedding too and the last
the final norm and the output head; each layer's KV cache stays beside it. The runs follow each
device's share: the memory it has free, or ``split=`` given by the user (as llama.cpp's
``--tensor-split``). Before any weight is uploaded the bytes each device needs (weights in
their device formats, KV cache, the activations of a prompt chunk) are set against the bytes it
has; a model that does not fit is refused with both, per device.

Sub-devices of one CPU share its memory: their needs are summed against it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels import attention
from ..nn import quant
from ..runtime import CLDevice, meminfo, staging
from ..runtime.device import device as _one_device
from ..runtime.pool import Buffer
from .config import ModelConfig
from .weights import WeightSource


class DoesNotFitError(ValueError):
    """A model needs more memory than the devices given have."""


@dataclass(frozen=True)
class Stage:
    """A device's part of a split model: layers ``first`` to ``stop - 1``, the embedding with
    the first stage and the head with the last, and the bytes it is expected to take."""

    device: CLDevice
    first: int
    stop: int
    nbytes: int

    def describe(self, n_layers: int, free: int | None = None) -> str:
        """``gpu:0 (NAME): layers 0-15 + embedding, 7.20 GiB`` (with ``free``: ``needs 7.20
        GiB, 5.00 GiB free``)."""
        what = f"layers {self.first}-{self.stop - 1}" if self.stop - self.first > 1 else \
            f"layer {self.first}"
        extra = (["embedding"] if self.first == 0 else []) + (
            ["head"] if self.stop == n_layers else [])
        size = _gib(self.nbytes) if free is None else \
            f"needs {_gib(self.nbytes)}, {_gib(free)} free"
        return (f"{shown(self.device)} ({self.device.name}): {what}"
                f"{' + ' + ' + '.join(extra) if extra else ''}, {size}")


def shown(dev: CLDevice) -> str:
    """``dev``'s selector as the user gave it (without the ``@ctx`` of a shared context)."""
    return dev.selector.split("@", 1)[0]


def devices(device: CLDevice | str | Sequence[CLDevice | str] | None) -> list[CLDevice]:
    """The devices a model is loaded on: one device (a selector, a device, None for the
    default), or several: a comma-separated selector list such as ``"gpu:0,gpu:1"`` or
    ``"gpu,cpu"`` (each device in a context of its own: the parts meet through the host), or
    a list of devices (``clops.context``'s and a device's ``create_sub_devices`` share a
    context, where the rows move device to device; devices of different contexts meet through
    the host)."""
    if isinstance(device, str) and "," in device:
        from ..runtime import discovery

        device = discovery.split_selectors(device, "device list")
    if device is None or isinstance(device, (str, CLDevice)):
        return [_one_device(device)]
    items = list(device)
    if not items:
        raise ValueError("device: the list of devices is empty")
    if len(items) == 1:
        return [_one_device(items[0])]
    # PERF (two H200s, NVIDIA's driver 580): selectors give each device a context of its own,
    # the parts meeting through the host. Two GPUs of one context ran each launch slower
    # whenever both were in use (an 8B body's split decode 5.26 ms a token, the host
    # enqueueing for 5.2 of them, against 3.15 in two contexts and 2.75 on one GPU; a 70B body
    # Q8_0 36.8 -> 50.6 tok/s).
    out = [d if isinstance(d, CLDevice) else _one_device(d) for d in items]
    if len({d.cl_device.int_ptr for d in out}) != len(out):
        raise ValueError(f"device: a device is named twice in {[d.selector for d in out]}")
    return out


def _memory_of(dev: CLDevice) -> int:
    """The identity of the memory ``dev`` allocates from (a sub-device shares its parent's)."""
    parent = getattr(dev, "parent", None)
    while parent is not None and getattr(parent, "parent", None) is not None:
        parent = parent.parent
    return int((parent or dev).cl_device.int_ptr)


def free_bytes(dev: CLDevice) -> int:
    """The bytes ``dev`` has for a model: what its driver says is free where it says (NVIDIA's
    through the CUDA driver, AMD's ``GLOBAL_FREE_MEMORY_AMD``: other programs' memory counted),
    else its global memory less what clops holds there; within the pool's limit where one is set
    (``CLOPS_MEMORY_LIMIT``)."""
    st = dev.memory_stats()
    in_use = int(st["in_use"])
    free = max(0, dev.caps.global_mem - in_use)
    told = meminfo.free_bytes(dev)
    if told is not None:
        # (memory the pool keeps for reuse is free to the model)
        free = min(free, told + int(st["cached"]))
    if st["limit"] is not None:
        free = min(free, max(0, int(st["limit"]) - in_use))
    return free


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def layer_nbytes(cfg: ModelConfig, src: WeightSource, max_seq: int,
                 kv_half: bool, layout: str = "rb16") -> list[int]:
    """The device bytes of each layer: its weights (in ``layout``) and its key and value
    caches."""
    kv = 2 * attention.kv_nbytes(cfg.n_kv_heads, max_seq, cfg.head_dim, kv_half)
    keys = cfg.layer_keys()
    return [sum(src.device_nbytes(f"blk.{i}.{k}", layout) for k in keys) + kv
            for i in range(cfg.n_layers)]


def scratch_nbytes(cfg: ModelConfig, chunk: int, head: bool) -> int:
    """The activations of a prompt chunk of ``chunk`` rows (and the logits, for the stage
    with the head)."""
    H, KV, D, F, dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.dim
    per_row = 3 * dim + (H + 2 * KV) * D + 2 * H * D + 3 * F
    return 4 * chunk * (per_row + (cfg.vocab_size if head else 0))


def place(cfg: ModelConfig, src: WeightSource, devs: Sequence[CLDevice], max_seq: int,
          kv_half: bool, chunk: Sequence[int], split: Sequence[float] | None = None
          ) -> list[Stage]:
    """The stages of ``cfg``'s model over ``devs`` (see the module's text): ``split`` gives
    each device's share of the layers (as llama.cpp's ``--tensor-split``), else each takes a
    share of all the bytes in proportion to the memory it has free. Raises
    ``DoesNotFitError`` where a device (or a memory its sub-devices share) lacks the bytes."""
    n, L = len(devs), cfg.n_layers
    if n > L:
        raise ValueError(f"{n} devices for {L} layers: each device takes at least one layer")
    free = [free_bytes(d) for d in devs]
    # (the weights' layout: the CPU layout's larger forms where any device takes it)
    layout = "rows" if all(quant.layout_for(d) == "rows" for d in devs) else "rb16"
    layers = layer_nbytes(cfg, src, max_seq, kv_half, layout)
    head_bytes = src.device_nbytes("out_norm") + (
        src.device_nbytes("output", layout) if src.has("output")
        else src.device_nbytes("embed", layout))
    fixed = [(src.device_nbytes("embed", layout) if k == 0 else 0)
             + (head_bytes if k == n - 1 else 0)
             + scratch_nbytes(cfg, chunk[k], k == n - 1) for k in range(n)]
    if split is not None:
        shares = [float(s) for s in split]
        if len(shares) != n or not all(s > 0 for s in shares):
            raise ValueError(f"split {list(split)}: give {n} positive shares, one a device")
        # layer boundaries at each device's share of the layers
        edges = [round(L * sum(shares[:k + 1]) / sum(shares)) for k in range(n - 1)]
    else:
        users: dict[int, int] = {}
        for d in devs:
            users[_memory_of(d)] = users.get(_memory_of(d), 0) + 1
        # a device's share of a memory that several of them use is its part of it
        shares = [f / users[_memory_of(d)] for d, f in zip(devs, free)]
        everything = sum(layers) + sum(fixed)
        edges, i, acc, target = [], 0, float(fixed[0]), 0.0
        for k in range(n - 1):
            target += everything * shares[k] / (sum(shares) or 1)
            # (a layer goes where its middle falls)
            while i < L and acc + layers[i] / 2 <= target:
                acc += layers[i]
                i += 1
            edges.append(i)
            acc += fixed[k + 1]
    # at least one layer each, in order
    stops: list[int] = []
    for k, e in enumerate(edges):
        stops.append(min(max(e, (stops[-1] if stops else 0) + 1), L - (n - 1 - k)))
    stops.append(L)
    stages, first = [], 0
    for k, d in enumerate(devs):
        stages.append(Stage(d, first, stops[k], fixed[k] + sum(layers[first:stops[k]])))
        first = stops[k]
    check(stages, free, L)
    return stages


def check(stages: Sequence[Stage], free: Sequence[int], n_layers: int) -> None:
    """Raise ``DoesNotFitError`` unless every memory holds what its stages need."""
    need: dict[int, int] = {}
    have: dict[int, int] = {}
    for st, f in zip(stages, free):
        key = _memory_of(st.device)
        need[key] = need.get(key, 0) + st.nbytes
        have[key] = f
    short = [k for k in need if need[k] > have[k]]
    if not short:
        return
    rows = "; ".join(st.describe(n_layers, free[j]) for j, st in enumerate(stages))
    shared = len(need) < len(stages)
    many = len(stages) > 1
    raise DoesNotFitError(
        f"the model does not fit {'these devices' if many else 'the device'}: {rows}"
        + (f" (of one memory: needs {_gib(sum(need.values()))} in all)" if shared else "")
        + ". Give " + ("more devices" if many else "several devices to split it over")
        + " (--device gpu:0,gpu:1; device= in Python), a smaller context (-c; max_seq_len), "
        "a float16 KV cache (--kv-cache float16) or a smaller quantization")


@dataclass(frozen=True)
class Copies:
    """The last part's token ids and positions (``tokens``, ``state``), and each other OpenCL
    context's copies of them (a device of that context and its two buffers)."""

    tokens: Buffer
    state: Buffer
    others: list[tuple[CLDevice, Buffer, Buffer]]


class Chain:
    """A step of a model split over devices: each part's plan (anything with ``replay()``) on
    its device's default queue, in turn, each after the one before, with the rows of the
    residual stream (``nbytes`` from the start of each part's ``x``) moved from part to part.

    Parts in one OpenCL context: the next one's queue waits on a marker of the one before
    (a barrier), then copies the rows device to device; nothing waits on the host. The first
    part waits for the last part's queue too: the host's copies for a step, and the step before,
    go there. Parts in different contexts (devices named by selectors, or of different
    platforms: a GPU and a CPU runtime) meet through the host: the rows are read into pinned
    memory once the part before is done and written to the next (a few KiB a row), and
    ``copies`` (``Copies``: the positions, and the token ids of the step's ``rows`` from the
    position on) are brought to the other contexts before the step; None where the host has
    written them to every part (a prompt's chunks: nothing then waits for the last part, so
    the first part takes the next chunk while the later ones finish this one)."""

    def __init__(self, parts: list[tuple[CLDevice, Buffer, Any]], nbytes: int,
                 copies: Copies | None = None, rows: int = 0) -> None:
        self.parts, self.nbytes, self.copies, self.rows = parts, nbytes, copies, rows

    def replay(self) -> None:
        parts = self.parts
        last = parts[-1][0]
        c = self.copies
        if c is not None:
            state = np.empty(4, np.int32)
            last.read(state, c.state, queue=last.queue)  # (after every command before it)
            pos = int(state[0])
            ids = np.empty(max(0, min(self.rows, c.tokens.nbytes // 4 - pos)), np.int32)
            last.read(ids, c.tokens, pos * 4, queue=last.queue)
            for dev, tokens, st in c.others:
                dev.write(st, state, queue=dev.queue, blocking=True)
                dev.write(tokens, ids, pos * 4, queue=dev.queue, blocking=True)
        done = last.queue.marker()
        for k, (dev, x, plan) in enumerate(parts):
            q = dev.queue
            before = parts[k - 1][0] if k else last
            if dev.shares_context(before):
                # PERF (two H200s in one context, NVIDIA's driver 580): the host waiting for
                # ``done`` in place of this barrier made an 8B body's split decode slower
                # (6.39 ms a token against 5.26); selectors put GPUs in contexts of their own
                # (``devices``), which took 3.15
                q.barrier([done])
                if k and self.nbytes:
                    dev.copy(x, parts[k - 1][1], self.nbytes, queue=q)
            elif k and self.nbytes:
                # (through pinned memory of the part before: its copy a DMA, not a bounce; the
                # write is not waited for, so that the host goes on to the next step's first
                # part while this one works: the block is kept until the write is done)
                ev, blk = staging.download(before, parts[k - 1][1], self.nbytes,
                                           queue=before.queue)
                ev.wait()
                wrote = dev.write(x, blk.host[:self.nbytes], queue=q)
                staging.staging_pool(before).release(blk, wrote)
            plan.replay()
            if k + 1 < len(parts):
                done = q.marker()
            q.flush()  # (the next part's queue waits on this one's work)
