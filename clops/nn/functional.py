"""nn, functional ops on clops Tensors: each realizes its inputs, launches one hand-written kernel
(``clops/kernels``) and returns a new float32 Tensor. Quantized weights are ``DeviceWeight``s
(``clops.nn.quantized``) and stay quantized on the device."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import array as _array  # noqa: F401 - makes sure the Tensor layer is loaded
from ..array.tensor import Tensor, same_device
from ..graph import ir
from ..kernels import activation, attention, matmul, norm
from ..runtime import CLDevice, probes
from ..runtime import plan as _plan
from . import rotary
from .quant import DeviceWeight, PackedWeight, pack_float, pack_ggml


def _api() -> Any:
    import clops

    return clops


def _f32(x: Tensor) -> Tensor:
    """Realized, C-contiguous, float32."""
    xp = _api()
    if x.dtype.name != "float32":
        x = xp.astype(x, xp.float32)
    return x.contiguous().realize()


def _empty(shape: tuple[int, ...], device: CLDevice, dtype: Any = None) -> Tensor:
    xp = _api()
    return xp.empty(shape, dtype=dtype or xp.float32, device=device)


def _one_device(what: str, *operands: Any) -> CLDevice:
    """The one device of ``operands`` (Tensors, ``DeviceWeight``s, None), or a ValueError
    naming both where two differ: a kernel given another context's buffers does not fail
    cleanly (a crash in the runtime, or a launch that never completes)."""
    dev = same_device(what, *operands)
    for w in operands:
        if isinstance(w, DeviceWeight):
            if dev is None:
                dev = w.device
            elif w.device is not dev:
                raise ValueError(f"{what}: operands are on different devices (the weight on "
                                 f"{w.device}, the tensors on {dev}); make the weight on the "
                                 "tensors' device (quantized(..., device=...)) or move the "
                                 "tensors with .to_device()")
    assert dev is not None
    return dev


def _rows(x: Tensor) -> tuple[int, int]:
    k = x.shape[-1] if x.ndim else 1
    return (x.size // k if k else 0), k


def quantized(weight: np.ndarray | Tensor, fmt: str = "f32", device: CLDevice | None = None,
              ggml_type: int | None = None, shape: tuple[int, int] | None = None
              ) -> DeviceWeight:
    """A weight for ``linear``/``embedding`` on the device: a float matrix ``[n, k]`` stored as
    ``fmt`` ("f32", "f16", "bf16"), or the raw bytes of a GGML tensor (``ggml_type``, with
    ``shape=(n, k)``), kept quantized.

    >>> w = clops.nn.quantized(raw_bytes, ggml_type=8, shape=(576, 576))   # Q8_0
    """
    import clops

    dev = clops.device(device if device is not None else getattr(weight, "device", None))
    arr = np.asarray(weight)
    packed: PackedWeight
    if ggml_type is not None:
        if shape is None:
            raise ValueError("a GGML tensor needs shape=(n, k)")
        packed = pack_ggml(arr, ggml_type, *shape)
    else:
        packed = pack_float(arr, fmt)
    return DeviceWeight(dev, packed)


def linear(x: Tensor, weight: DeviceWeight | Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` over the last axis of ``x``; ``weight`` is ``[out, in]`` (a Tensor
    of float32/float16/bfloat16, or a quantized ``DeviceWeight``).

    On GPUs with tensor cores (NVIDIA, found by the PTX probe), 16 or more rows times a weight
    not in float32 run as a float16 product with float32 sums, as a float16 matmul in PyTorch
    does: x is rounded to float16 first. Elsewhere x stays float32. A Tensor weight is read
    where it is, on the device: ``x @ weight.T`` through ``clops.matmul`` (any sizes), or the
    tensor-core product above.

    >>> y = clops.nn.linear(x, w)          # x [..., 576], w [1536, 576] -> y [..., 1536]
    """
    if isinstance(weight, Tensor):
        fmt = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(weight.dtype.name)
        if fmt is None:
            raise TypeError(f"linear weight of dtype {weight.dtype.name}: use float32, float16 "
                            "or bfloat16, or a quantized weight")
        if weight.ndim != 2:
            raise ValueError(f"linear: the weight must be [out, in], got shape {weight.shape}")
        x = _f32(x)
        n, k = weight.shape
        if (x.shape[-1] if x.ndim else 1) != k:
            raise ValueError(f"linear: x has {x.shape[-1] if x.ndim else 1} features, weight "
                             f"[{n}, {k}] expects {k}")
        dw = None
        if fmt != "f32" and k % 32 == 0:
            w = weight.contiguous().realize()
            if w.offset == 0:
                dw = DeviceWeight.from_buffer(w.device, w.buffer, fmt, n, k, keep=w)
        if dw is None or not matmul.tensor_core_rows(x.device, _rows(x)[0], dw):
            xp = _api()
            y = xp.matmul(x, xp.astype(weight, xp.float32).mT)
            if bias is not None:
                bv = _f32(bias)
                if bv.size != n:
                    raise ValueError(f"linear: bias of {bv.size} values for {n} outputs")
                y = y + xp.reshape(bv, (n,))
            return y.realize()
        weight = dw
    _one_device("linear", x, weight, bias)
    x = _f32(x)
    m, k = _rows(x)
    if k != weight.k:
        raise ValueError(f"linear: x has {k} features, weight [{weight.n}, {weight.k}] "
                         f"expects {weight.k}")
    dev = x.device
    out = _empty((*x.shape[:-1], weight.n), dev)
    b = None
    if bias is not None:
        b = _f32(bias)
        if b.size != weight.n:
            raise ValueError(f"linear: bias of {b.size} values for {weight.n} outputs")
    if m:
        if b is not None and b.offset:
            raise ValueError("linear: bias must start at its buffer's beginning")
        for ln in matmul.linear(dev, out.buffer, out.offset, weight.n, x.buffer, x.offset, k,
                                weight, m, bias=None if b is None else b.buffer):
            ln.run_once(dev)
    return out


def embedding(ids: Tensor, weight: DeviceWeight) -> Tensor:
    """Rows ``weight[ids]`` as float32 ``[*ids.shape, k]`` (quantized tables dequantized)."""
    xp = _api()
    dev = _one_device("embedding", ids, weight)
    flat = xp.astype(ids, xp.int32).contiguous().realize() if ids.dtype.name != "int32" \
        else ids.contiguous().realize()
    m = flat.size
    out = _empty((*ids.shape, weight.k), dev)
    if m:
        # NOTE: the kernel reads ids[state[0] + i]; state carries the tensor's offset
        state = xp.asarray(np.array([flat.offset, 0], np.int32), device=dev).realize()
        matmul.embedding(dev, out.buffer, flat.buffer, state.buffer, weight, m).run_once(dev)
    return out


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight``."""
    _one_device("rms_norm", x, weight)
    x, w = _f32(x), _f32(weight)
    m, k = _rows(x)
    _check_norm_params("rms_norm", k, weight=w)
    out = _empty(x.shape, x.device)
    norm.rmsnorm(x.device, out.buffer, x.buffer, x.offset, k, _at0(w).buffer, m=m, k=k,
                 eps=eps).run_once(x.device)
    return out


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis."""
    _one_device("layer_norm", x, weight, bias)
    x, w, b = _f32(x), _f32(weight), _f32(bias)
    m, k = _rows(x)
    _check_norm_params("layer_norm", k, weight=w, bias=b)
    out = _empty(x.shape, x.device)
    norm.layernorm(x.device, out.buffer, x.buffer, x.offset, k, _at0(w).buffer, _at0(b).buffer,
                   m=m, k=k, eps=eps).run_once(x.device)
    return out


def _check_norm_params(fn: str, k: int, **params: Tensor) -> None:
    for what, t in params.items():
        if t.shape != (k,):
            raise ValueError(f"{fn}: x has {k} features on its last axis, {what} has shape "
                             f"{t.shape}; it must be ({k},)")


def _at0(t: Tensor) -> Tensor:
    """``t`` (realized, contiguous) at the start of its own buffer: a device copy if not."""
    if t.offset:
        t = Tensor(ir.ew("identity", [t._load], t.dtype), t.device).realize()
    return t


def _unary(x: Tensor, act: str) -> Tensor:
    x = _f32(x)
    out = _empty(x.shape, x.device)
    if x.size:
        activation.unary(x.device, out.buffer, x.buffer, x.offset, n=x.size,
                         act=act).run_once(x.device)
    return out


def silu(x: Tensor) -> Tensor:
    """``x * sigmoid(x)``."""
    return _unary(x, "silu")


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU, exact (erf) or ``approximate="tanh"``."""
    return _unary(x, "gelu_tanh" if approximate == "tanh" else "gelu")


# a CPU softmax over a leading axis walks columns when at least this many sit side by side
# (fewer fill too little of a vector: those are moved to the last axis instead)
_COLUMN_SOFTMAX_MIN = 8


def _hand_kernels_pay(dev: CLDevice) -> bool:
    """Whether softmax takes its hand kernels (a work-item a row; a column walked in place) on
    ``dev``: CPUs, but not PoCL 3.1, which runs a kernel's work-items one after another around
    the whole body, so that each walks its row or column alone; there (and on GPUs) the
    compiler's fused expression serves.
    PERF (PoCL 3.1, 2-core EPYC, float32, read to the host, medians of 7): hand kernels against
    the compiler's: 1024x512 over axis 0 11.6 -> 3.84 ms, 4096x4096 over axis 0 576 -> 258,
    over axis 1 192 -> 56, 64x128x64 over axis 2 4.2 -> 1.5, 256^3 over axis 2 183 -> 53
    (numpy 3.7 / 103 / 103 / 2.1 / 107). On Intel's runtime the hand kernels are as fast or
    faster (256^3 over axis 2 49 ms against 98)."""
    return dev.kind == "cpu" and "portable computing" not in str(dev.caps.platform).lower()


def _vector_kernels(dev: CLDevice) -> bool:
    """Whether softmax takes its hand kernels on float16 vectors (a row in 16-wide loads; 64
    or 16 adjacent columns a work-item) on ``dev``: CPUs whose vector exp gives the scalar one's
    values (``probes.vector_math_agrees``), both CPU runtimes here. PERF (2-core EPYC with
    AVX-512, float32, wall ms a call with the read): 4096x4096 over axis 1 on Intel's runtime,
    scalar row kernel (a work-item a row, vectorized by the runtime across rows) 59.5 -> 4.2
    (numpy 30.0), over axis 0 24.5 -> 7.9; on PoCL 3.1, the compiler's expression 12.9 -> 8.2
    and 73.0 -> 14.1 (RESULTS.md, "softmax, row sorts and logsumexp on a CPU with AVX-512")."""
    return dev.kind == "cpu" and probes.vector_math_agrees(dev, "exp")


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Softmax over ``axis`` (computed over the last axis; others are moved there)."""
    xp = _api()
    nd = x.ndim
    axis = axis % nd
    vectors = _vector_kernels(x.device)
    if not vectors and not _hand_kernels_pay(x.device):
        # GPUs (and a CPU with neither hand form, e.g. PoCL whose vector exp disagreed): the
        # compiler's softmax, one fused kernel of a work-group a row (or a column layout) and
        # split rows where they are few. PERF (H200, float32, device time):
        # the row kernel below (a work-item a row) 3.16 ms for 4096x4096 against PyTorch's 0.064
        xf = x if x.dtype.name == "float32" else xp.astype(x, xp.float32)
        e = xp.exp(xf - xp.max(xf, axis=axis, keepdims=True))
        return e / xp.sum(e, axis=axis, keepdims=True)
    inner = int(np.prod(x.shape[axis + 1:]))
    cols16 = vectors and inner % 16 == 0
    if axis != nd - 1 and (cols16 or inner >= _COLUMN_SOFTMAX_MIN and
                           _hand_kernels_pay(x.device)):
        # PERF: over a leading axis, one kernel down the columns instead of a transpose, the
        # row kernel and a transpose back (Intel's CPU runtime, axis 0 of 1024x512 float32:
        # kernels 1.3 + 2 x 1.06 ms -> 0.53 ms; wall 3.9 -> 1.4 ms)
        x = _f32(x)
        out = _empty(x.shape, x.device)
        if x.size:
            activation.softmax_cols(x.device, out.buffer, x.buffer, x.offset,
                                    outer=int(np.prod(x.shape[:axis])), k=x.shape[axis],
                                    inner=inner, vectors=cols16).run_once(x.device)
        return out
    if axis != nd - 1:
        perm = [i for i in range(nd) if i != axis] + [axis]
        inv = list(np.argsort(perm))
        return xp.permute_dims(softmax(xp.permute_dims(x, perm)), inv)
    x = _f32(x)
    m, k = _rows(x)
    out = _empty(x.shape, x.device)
    if m:
        activation.softmax(x.device, out.buffer, x.buffer, x.offset, m=m, k=k,
                           vectors=vectors).run_once(x.device)
    return out


def rope_frequencies(head_dim: int, theta: float = 10000.0,
                     scaling: dict[str, Any] | None = None) -> np.ndarray:
    """Rotary inverse frequencies ``[head_dim/2]`` (float32), with ``scaling`` as in a Hugging
    Face config (``{"rope_type": "llama3", "factor": 8.0, ...}`` or ``"linear"``)."""
    return rotary.inv_freq(head_dim, theta, scaling)


def rope(x: Tensor, positions: Tensor | np.ndarray | list[int], theta: float = 10000.0,
         layout: str = "split", scaling: dict[str, Any] | None = None) -> Tensor:
    """Rotary position embedding of ``x [tokens, heads, head_dim]`` at ``positions [tokens]``.
    ``layout="split"`` rotates halves (i, i + D/2), Hugging Face style; ``"adjacent"`` rotates
    pairs (2i, 2i + 1)."""
    if layout not in ("split", "adjacent"):
        raise ValueError(f"rope layout {layout!r}: 'split' or 'adjacent'")
    xp = _api()
    dev = _one_device("rope", x, positions)
    m, heads, d = x.shape
    # a fresh copy: the kernel rotates in place
    out = _at0(xp.astype(x, xp.float32, copy=True).contiguous().realize())
    if isinstance(positions, Tensor):  # read where it is (no trip to the host)
        pos = _at0(xp.astype(xp.reshape(positions, (m,)), xp.int32).contiguous().realize())
    else:
        pos = xp.asarray(np.asarray(positions, dtype=np.int32).reshape(m), device=dev)
    freq = xp.asarray(rope_frequencies(d, theta, scaling), device=dev).realize()
    attention.rope(dev, out.buffer, 0, heads * d, pos.buffer, freq.buffer, m=m, heads=heads,
                   head_dim=d, neox=layout == "split").run_once(dev)
    return out


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True,
                                 scale: float | None = None) -> Tensor:
    """Attention of ``q [Lq, H, D]`` over ``k, v [Lk, KV, D]`` (grouped-query when KV < H).
    Causal masking aligns the last query with the last key."""
    xp = _api()
    lq, h, d = q.shape
    lk, kv, _ = k.shape
    if h % kv:
        raise ValueError(f"{h} query heads do not group over {kv} key/value heads")
    dev = _one_device("scaled_dot_product_attention", q, k, v)
    qf = _f32(q)
    kt = _f32(xp.permute_dims(k, (1, 0, 2)))  # the kernel walks [KV][Lk][D]
    vt = _f32(xp.permute_dims(v, (1, 0, 2)))
    out = _empty((lq, h, d), dev)
    state = xp.asarray(np.zeros(2, np.int32), device=dev).realize()
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    attention.attn_prefill(dev, out.buffer, qf.buffer, qf.offset, h * d, kt.buffer, vt.buffer,
                           kt.offset, vt.offset, lk * d, state.buffer, pos_add=lk - lq,
                           causal=causal, n_keys=lk, m=lq, n_heads=h, n_kv=kv, head_dim=d,
                           scale=sc).run_once(dev)
    return out


class KVCache:
    """Preallocated keys and values of one attention layer: ``[kv_heads, max_seq, head_dim]``
    each, float32, filled by ``append`` and read by ``attend``.

    >>> cache = clops.nn.KVCache(kv_heads=3, head_dim=64, max_seq=2048)
    >>> out = cache.attend(q, k, v)     # appends k, v at the current length, then attends
    """

    def __init__(self, kv_heads: int, head_dim: int, max_seq: int,
                 device: CLDevice | str | None = None) -> None:
        import clops

        self.device = dev = clops.device(device)
        self.kv_heads, self.head_dim, self.max_seq = kv_heads, head_dim, max_seq
        self.k = _empty((kv_heads, max_seq, head_dim), dev)
        self.v = _empty((kv_heads, max_seq, head_dim), dev)
        self.length = 0
        self._part = dev.alloc(attention.part_nbytes(dev, max_seq, 1, head_dim) * 64)
        self._parts_for: dict[int, Any] = {}

    def append(self, k: Tensor, v: Tensor) -> None:
        """Store ``k, v [M, kv_heads, head_dim]`` at positions ``length .. length + M - 1``."""
        _plan.refuse("KVCache.append (its length is Python state that a replay would not "
                     "advance; clops.llm's decode plans replay a cache)")
        m = k.shape[0]
        if self.length + m > self.max_seq:
            raise ValueError(f"KV cache full: {self.length} + {m} > {self.max_seq}")
        dev = self.device
        if _one_device("KVCache.append", k, v) is not dev:
            raise ValueError(f"KVCache.append: operands are on different devices (k and v on "
                             f"{k.device}, the cache on {dev})")
        kf, vf = _f32(k), _f32(v)
        attention.kv_store(dev, self.k.buffer, self.v.buffer, kf.buffer, kf.offset, vf.buffer,
                           vf.offset, pos=self.length, m=m, n_kv=self.kv_heads,
                           head_dim=self.head_dim, max_seq=self.max_seq).run_once(dev)
        self.length += m

    def attend(self, q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
        """Append ``k, v`` then attend causally with ``q [M, H, D]``: one row takes the
        split-KV decode path, several the prefill path."""
        xp = _api()
        if q.device is not self.device:
            raise ValueError(f"KVCache.attend: operands are on different devices (q on "
                             f"{q.device}, the cache on {self.device})")
        self.append(k, v)
        dev = self.device
        m, h, d = q.shape
        qf = _f32(q)
        out = _empty((m, h, d), dev)
        sc = 1.0 / math.sqrt(d) if scale is None else scale
        pos0 = self.length - m
        state = xp.asarray(np.array([pos0, 0], np.int32), device=dev).realize()
        if m == 1:
            qf = _at0(qf)
            need = attention.part_nbytes(dev, self.max_seq, h, d)
            if self._part.nbytes < need:
                self._part = dev.alloc(need)
            for ln in attention.attn_decode(dev, out.buffer, self._part, qf.buffer,
                                            self.k.buffer, self.v.buffer, state.buffer,
                                            n_heads=h, n_kv=self.kv_heads, head_dim=d,
                                            max_seq=self.max_seq, scale=sc):
                ln.run_once(dev)
        else:
            attention.attn_prefill(dev, out.buffer, qf.buffer, qf.offset, h * d, self.k.buffer,
                                   self.v.buffer, 0, 0, self.max_seq * d, state.buffer,
                                   pos_add=0, causal=True, n_keys=self.max_seq, m=m,
                                   n_heads=h, n_kv=self.kv_heads, head_dim=d,
                                   scale=sc).run_once(dev)
        return out
