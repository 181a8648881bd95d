"""Array layer, ``clops.linalg``: the Array API linear algebra extension. Products, norms,
diagonals, traces, outer and cross products and matrix powers are computed on the device
(fused kernels); so are cholesky, qr, solve, inv, det and slogdet for real floating-point
matrices (Householder, LU and Cholesky kernels, ``kernels/linalg.cl``). The iterative
decompositions svd, svdvals, eigh, eigvalsh (and pinv, matrix_rank built on svd) run on the
device as Jacobi methods, except for a few large matrices on a GPU. Complex inputs, and
those large matrices, copy the operand to the host, compute with numpy (LAPACK) and copy the
results back: one transfer each way; results are device tensors of the input's dtype."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .array import elementwise as _ew
from .array.arguments import check_namespace
from .array.creation import asarray, eye
from .array.elementwise import apply
from .array.linalg_core import matmul, tensordot, vecdot
from .array.manipulation import broadcast_to, matrix_transpose, reshape, stack
from .array.statistics import max as _max
from .array.statistics import min as _min
from .array.statistics import prod_ as _prod
from .array.statistics import sum as _sum
from .array.tensor import Tensor, axis_int, same_device
from .graph import dtypes as _dt
from .graph import ir
from .graph.ir import View
from .kernels import linalg as linalg_kernels

__all__ = [
    "cholesky", "cross", "det", "diagonal", "eig", "eigh", "eigvals", "eigvalsh", "inv",
    "matmul", "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv",
    "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace", "vecdot", "vector_norm",
]


class EighResult(NamedTuple):
    eigenvalues: Tensor
    eigenvectors: Tensor


class EigResult(NamedTuple):
    eigenvalues: Tensor
    eigenvectors: Tensor


class QRResult(NamedTuple):
    Q: Tensor
    R: Tensor


class SlogdetResult(NamedTuple):
    sign: Tensor
    logabsdet: Tensor


class SVDResult(NamedTuple):
    U: Tensor
    S: Tensor
    Vh: Tensor


def _float_input(x: Tensor, fn: str, square: bool = False) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"linalg.{fn} takes a clops Tensor")
    if x.dtype.kind not in "fc":
        raise TypeError(f"linalg.{fn} needs a floating-point tensor, not {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"linalg.{fn} needs a (stack of) matrices, not shape {x.shape}")
    if square and x.shape[-1] != x.shape[-2]:
        raise ValueError(f"linalg.{fn} needs square matrices, not {x.shape[-2:]}")


def _host(x: Tensor) -> np.ndarray:
    """The operand on the host (the documented transfer of the host-computed functions)."""
    return x.to_numpy()


def _dev(a: Any, like: Tensor, dtype: _dt.DType | None = None) -> Tensor:
    return asarray(np.asarray(a), dtype=dtype or like.dtype, device=like.device)


# -- on the device --------------------------------------------------------------------------------
def diagonal(x: Tensor, /, *, offset: int = 0) -> Tensor:
    """The ``offset``-th diagonal of each matrix in ``x`` (a strided view, no copy).

    >>> clops.linalg.diagonal(clops.eye(3))
    Tensor([1., 1., 1.], dtype=float32, device=opencl:cpu:0)
    """
    if x.ndim < 2:
        raise ValueError("diagonal needs at least 2 dims")
    m, n = x.shape[-2:]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    k = max(0, min(m - r0, n - c0))

    def fn(v: View) -> View:
        s2, s1 = v.strides[-2:]
        start = v.offset + (r0 * s2 + c0 * s1 if k else 0)
        return View(v.shape[:-2] + (k,), v.strides[:-2] + (s2 + s1,), start)

    return x._move(fn)


def trace(x: Tensor, /, *, offset: int = 0, dtype: Any = None) -> Tensor:
    """Sum of the ``offset``-th diagonal of each matrix.

    >>> clops.linalg.trace(clops.eye(3)).item()
    3.0
    """
    if x.dtype.kind not in "iufc":
        raise TypeError(f"trace needs a numeric tensor, not {x.dtype}")
    return _sum(diagonal(x, offset=offset), axis=-1, dtype=dtype)


def outer(x1: Tensor, x2: Tensor, /) -> Tensor:
    """Outer product of two 1-d tensors.

    >>> clops.linalg.outer(clops.asarray([1, 2]), clops.asarray([3, 4])).shape
    (2, 2)
    """
    same_device("outer", x1, x2)
    if x1.ndim != 1 or x2.ndim != 1:
        raise ValueError("outer takes two 1-d tensors")
    return apply("multiply", reshape(x1, (-1, 1)), reshape(x2, (1, -1)))


def cross(x1: Tensor, x2: Tensor, /, *, axis: int = -1) -> Tensor:
    """Cross product of 3-element vectors along ``axis`` (other dims broadcast).

    >>> clops.linalg.cross(clops.asarray([1.0, 0, 0]), clops.asarray([0.0, 1, 0]))
    Tensor([0., 0., 1.], dtype=float32, device=opencl:cpu:0)
    """
    same_device("cross", x1, x2)
    axis = axis_int(axis)
    if axis >= 0:
        raise ValueError("cross: axis must be negative (counted from the end)")
    if x1.ndim < -axis or x2.ndim < -axis:
        raise ValueError(f"cross: axis {axis} is out of range")
    if x1.shape[axis] != 3 or x2.shape[axis] != 3:
        raise ValueError("cross: the vectors along axis must have 3 elements")
    shape = _ew.broadcast_shapes(x1.shape, x2.shape)
    a, b = broadcast_to(x1, shape), broadcast_to(x2, shape)
    ax = len(shape) + axis
    pre = (slice(None),) * ax

    def c(t: Tensor, i: int) -> Tensor:
        return t[pre + (i,)]

    comps = [apply("subtract", apply("multiply", c(a, (i + 1) % 3), c(b, (i + 2) % 3)),
                   apply("multiply", c(a, (i + 2) % 3), c(b, (i + 1) % 3))) for i in range(3)]
    return stack(comps, axis=ax)


def matrix_power(x: Tensor, n: int, /) -> Tensor:
    """``x`` to the integer power ``n`` by repeated squaring (device matmuls; a negative ``n``
    inverts first, on the host).

    >>> clops.linalg.matrix_power(clops.eye(2) * 2, 3)[0, 0].item()
    8.0
    """
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError("matrix_power needs square matrices")
    if n == 0:
        return broadcast_to(eye(x.shape[-1], dtype=x.dtype, device=x.device), x.shape)
    if n < 0:
        x, n = inv(x), -n
    result: Tensor | None = None
    base = x
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    assert result is not None
    return result


def vector_norm(x: Tensor, /, *, axis: int | tuple[int, ...] | None = None,
                keepdims: bool = False, ord: int | float = 2) -> Tensor:
    """The ``ord``-norm of vectors along ``axis`` (all elements when None); one fused
    reduction, in the real dtype of ``x``.

    >>> clops.linalg.vector_norm(clops.asarray([3.0, 4.0])).item()
    5.0
    """
    if x.dtype.kind not in "fc":
        raise TypeError(f"vector_norm needs a floating-point tensor, not {x.dtype}")
    a = apply("abs", x)
    axes: Any = axis
    if isinstance(axis, tuple) and len(axis) == 0:
        axes = ()
    if ord == float("inf"):
        return _max(a, axis=axes, keepdims=keepdims) if a.size else _sum(a, axis=axes,
                                                                         keepdims=keepdims)
    if ord == float("-inf"):
        return _min(a, axis=axes, keepdims=keepdims)
    if ord == 0:
        nz = apply("not_equal", a, 0)
        return _sum(Tensor(ir.cast(nz._node.resolve(), a.dtype), x.device), axis=axes,
                    keepdims=keepdims)
    if ord == 1:
        return _sum(a, axis=axes, keepdims=keepdims)
    if ord == 2:
        return apply("sqrt", _sum(apply("multiply", a, a), axis=axes, keepdims=keepdims))
    p = float(ord)
    s = _sum(apply("pow", a, p), axis=axes, keepdims=keepdims)
    return apply("pow", s, 1.0 / p)


def matrix_norm(x: Tensor, /, *, keepdims: bool = False,
                ord: int | float | str | None = "fro") -> Tensor:
    """Matrix norms: "fro", "nuc", 1, -1, 2, -2, inf, -inf (2, -2 and "nuc" take singular
    values, computed on the host).

    >>> clops.linalg.matrix_norm(clops.eye(2) * 3, ord=1).item()
    3.0
    """
    _float_input(x, "matrix_norm")
    a = apply("abs", x)
    if ord == "fro" or ord is None:
        out = apply("sqrt", _sum(apply("multiply", a, a), axis=(-2, -1)))
    elif ord in (1, -1):
        col = _sum(a, axis=-2)
        out = _max(col, axis=-1) if ord == 1 else _min(col, axis=-1)
    elif ord in (float("inf"), float("-inf")):
        row = _sum(a, axis=-1)
        out = _max(row, axis=-1) if ord > 0 else _min(row, axis=-1)  # type: ignore[operator]
    elif ord in (2, -2, "nuc"):
        s = svdvals(x)
        out = _sum(s, axis=-1) if ord == "nuc" else _max(s, axis=-1) if ord == 2 else \
            _min(s, axis=-1)
    else:
        raise ValueError(f"matrix_norm: unsupported ord {ord!r}")
    if keepdims:
        out = reshape(out, out.shape + (1, 1))
    return out


# -- factorizations on the device (real floating point) -------------------------------------------
def _on_device(x: Tensor) -> bool:
    return x.dtype.name in ("float32", "float64")


def _lu(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(LU factors in a new contiguous tensor, pivots, row-swap counts) of square ``x``."""
    from .array.kernel_ops import contiguous, new
    n = x.shape[-1]
    batch = int(np.prod(x.shape[:-2]))
    lu = new(x.shape, x.dtype, x.device)
    lu._assign(contiguous(x))
    piv, swaps = linalg_kernels.lu_factor(x.device, x.dtype, lu.buffer, lu.offset, batch, n)
    return (lu, Tensor._from_buffer(piv, x.shape[:-1], _dt.int64, x.device),
            Tensor._from_buffer(swaps, x.shape[:-2], _dt.int32, x.device))


def _lu_solve(lu: Tensor, piv: Tensor, b: Tensor) -> Tensor:
    """Solve with LU factors for a right-hand side ``b`` of lu's batch shape (copied)."""
    from .array.kernel_ops import contiguous, new
    out = new(b.shape, lu.dtype, lu.device)
    out._assign(contiguous(b, lu.dtype))
    n, r = b.shape[-2:]
    batch = int(np.prod(b.shape[:-2]))
    linalg_kernels.lu_solve(lu.device, lu.dtype, lu.buffer, lu.offset, piv.buffer, out.buffer,
                            out.offset, batch, n, r)
    return out


def cholesky(x: Tensor, /, *, upper: bool = False) -> Tensor:
    """Cholesky factor (lower, or upper with ``upper=True``) of Hermitian positive-definite
    matrices (only their lower triangle is read). Real inputs on the device (a matrix that is
    not positive definite gives NaN rather than an error); complex ones on the host (numpy).

    >>> clops.linalg.cholesky(clops.eye(2) * 4)[1, 1].item()
    2.0
    """
    _float_input(x, "cholesky", square=True)
    if not _on_device(x):
        L = np.linalg.cholesky(_host(x))
        if upper:
            L = np.conj(np.swapaxes(L, -1, -2))
        return _dev(L, x)
    from .array.kernel_ops import contiguous, new
    src = contiguous(x)
    out = new(x.shape, x.dtype, x.device)
    linalg_kernels.cholesky(x.device, x.dtype, src.buffer, src.offset, out.buffer,
                            int(np.prod(x.shape[:-2])), x.shape[-1])
    return matrix_transpose(out) if upper else out


def solve(x1: Tensor, x2: Tensor, /) -> Tensor:
    """Solution of ``x1 @ out = x2`` (``x2`` 1-d: one vector; else a stack of matrices,
    batch dims broadcast). Real inputs on the device (LU with partial pivoting; a singular
    ``x1`` gives inf/NaN rather than an error); complex ones on the host.

    >>> clops.linalg.solve(clops.eye(2) * 2, clops.asarray([2.0, 4.0]))
    Tensor([1., 2.], dtype=float32, device=opencl:cpu:0)
    """
    same_device("solve", x1, x2)
    _float_input(x1, "solve", square=True)
    d = _dt.promote_types(x1.dtype, x2.dtype)
    if d.name not in ("float32", "float64"):
        ha, hb = _host(x1).astype(d.np), _host(x2).astype(d.np)
        if hb.ndim == 1:
            hx = np.linalg.solve(ha, hb[..., None])[..., 0]
        else:
            hx = np.linalg.solve(ha, hb)
        return _dev(hx, x1, d)
    vec = x2.ndim == 1
    b = reshape(x2, x2.shape + (1,)) if vec else x2
    if b.shape[-2] != x1.shape[-1]:
        raise ValueError(f"solve: x1 {x1.shape} and x2 {x2.shape} do not align")
    batch = _ew.broadcast_shapes(x1.shape[:-2], b.shape[:-2])
    a = broadcast_to(x1, batch + x1.shape[-2:])
    if a.dtype != d:
        a = Tensor(ir.cast(a._node.resolve(), d), a.device)
    lu, piv, _ = _lu(a)
    out = _lu_solve(lu, piv, broadcast_to(b, batch + b.shape[-2:]))
    return reshape(out, out.shape[:-1]) if vec else out


def inv(x: Tensor, /) -> Tensor:
    """Inverse of square matrices (real: LU on the device; complex: host numpy).

    >>> clops.linalg.inv(clops.eye(2) * 2)[0, 0].item()
    0.5
    """
    _float_input(x, "inv", square=True)
    if not _on_device(x):
        return _dev(np.linalg.inv(_host(x)), x)
    lu, piv, _ = _lu(x)
    ident = broadcast_to(eye(x.shape[-1], dtype=x.dtype, device=x.device), x.shape)
    return _lu_solve(lu, piv, ident)


def slogdet(x: Tensor, /) -> SlogdetResult:
    """Sign and natural log of the absolute determinant (real: LU on the device, then one
    fused reduction each; complex: host numpy). A singular matrix gives sign 0, -inf.

    >>> clops.linalg.slogdet(clops.eye(2) * 2).sign.item()
    1.0
    """
    _float_input(x, "slogdet", square=True)
    if not _on_device(x):
        s, ld = np.linalg.slogdet(_host(x))
        return SlogdetResult(_dev(s, x), _dev(ld, x, _dt.real_of(x.dtype)))
    lu, _, swaps = _lu(x)
    diag = diagonal(lu)
    sign = apply("multiply", _prod(apply("sign", diag), axis=-1), _parity(swaps, x.dtype))
    logabs = _sum(apply("log", apply("abs", diag)), axis=-1)
    return SlogdetResult(sign, logabs)


def _parity(swaps: Tensor, dtype: _dt.DType) -> Tensor:
    """(-1) ** swaps in ``dtype``."""
    par = apply("subtract", 1, apply("multiply", 2, apply("remainder", swaps, 2)))
    return Tensor(ir.cast(par._node.resolve(), dtype), swaps.device)


def det(x: Tensor, /) -> Tensor:
    """Determinant of square matrices (real: LU on the device; complex: host numpy).

    >>> clops.linalg.det(clops.eye(2) * 2).item()
    4.0
    """
    _float_input(x, "det", square=True)
    if not _on_device(x):
        return _dev(np.linalg.det(_host(x)), x)
    lu, _, swaps = _lu(x)
    return apply("multiply", _prod(diagonal(lu), axis=-1), _parity(swaps, x.dtype))


# -- on the host (numpy/LAPACK), results back on the device ---------------------------------------


def qr(x: Tensor, /, *, mode: str = "reduced") -> QRResult:
    """QR decomposition, ``mode`` "reduced" or "complete". Real inputs on the device
    (Householder reflections as LAPACK's geqr2, so signs match numpy); complex ones on the
    host.

    >>> clops.linalg.qr(clops.eye(2)).R.shape
    (2, 2)
    """
    _float_input(x, "qr")
    if mode not in ("reduced", "complete"):
        raise ValueError("qr: mode must be 'reduced' or 'complete'")
    if not _on_device(x):
        q, r = np.linalg.qr(_host(x), mode=mode)  # type: ignore[call-overload]
        return QRResult(_dev(q, x), _dev(r, x))
    from .array.creation import triu
    from .array.kernel_ops import contiguous, new
    m, n = x.shape[-2:]
    k = min(m, n)
    qc = m if mode == "complete" else k
    batch = x.shape[:-2]
    fact = new(x.shape, x.dtype, x.device)
    fact._assign(contiguous(x))
    qt = new(batch + (m, qc), x.dtype, x.device)
    linalg_kernels.qr(x.device, x.dtype, fact.buffer, fact.offset, int(np.prod(batch)), m, n,
                      qt.buffer, qc)
    r = triu(fact if mode == "complete" else fact[..., :k, :])
    return QRResult(qt, r)


# Jacobi eigh/svd use one work-group per matrix: on GPUs a few large matrices go to LAPACK on
# the host instead (PERF: 512 x 512 eigh took 4 s as one work-group on an H100).
JACOBI_MAX_GPU = 256


def _jacobi(x: Tensor) -> bool:
    """Compute eigh/svd of ``x`` on the device?"""
    if not _on_device(x) or 0 in x.shape[-2:]:
        return False
    n = min(x.shape[-2:])
    batch = int(np.prod(x.shape[:-2]))
    return x.device.kind == "cpu" or n <= JACOBI_MAX_GPU or \
        batch >= x.device.caps.compute_units


def _eps(d: _dt.DType) -> float:
    return float(np.finfo(d.np).eps)


def _eigh_device(x: Tensor) -> tuple[Tensor, Tensor]:
    from .array.advanced_indexing import take_along_axis
    from .array.kernel_ops import contiguous, new
    from .array.sorting import argsort
    n = x.shape[-1]
    src = contiguous(x)
    w = new(x.shape, x.dtype, x.device)
    v = new(x.shape, x.dtype, x.device)
    linalg_kernels.eigh_jacobi(x.device, x.dtype, src.buffer, src.offset,
                               int(np.prod(x.shape[:-2])), n, w.buffer, v.buffer,
                               8 * _eps(x.dtype))
    vals = diagonal(w)
    if n == 0:
        return vals, v
    order = argsort(vals, axis=-1)
    vals = take_along_axis(vals, order, axis=-1)
    vecs = take_along_axis(v, broadcast_to(reshape(order, order.shape[:-1] + (1, n)), x.shape),
                           axis=-1)
    return vals, vecs


def eigh(x: Tensor, /) -> EighResult:
    """Eigenvalues (ascending) and eigenvectors (columns) of symmetric/Hermitian matrices, from
    their lower triangle. Real inputs on the device (cyclic Jacobi, one work-group per matrix:
    eigenvectors may differ from LAPACK's by sign); complex ones, and on GPUs a few matrices
    larger than ``JACOBI_MAX_GPU``, on the host.

    >>> clops.linalg.eigh(clops.eye(2)).eigenvalues
    Tensor([1., 1.], dtype=float32, device=opencl:cpu:0)
    """
    _float_input(x, "eigh", square=True)
    if not _jacobi(x):
        w, v = np.linalg.eigh(_host(x))
        return EighResult(_dev(w, x, _dt.real_of(x.dtype)), _dev(v, x))
    return EighResult(*_eigh_device(x))


def eigvalsh(x: Tensor, /) -> Tensor:
    """Eigenvalues of symmetric/Hermitian matrices, ascending (real: device; complex: host).

    >>> clops.linalg.eigvalsh(clops.eye(2) * 3)
    Tensor([3., 3.], dtype=float32, device=opencl:cpu:0)
    """
    _float_input(x, "eigvalsh", square=True)
    if not _jacobi(x):
        return _dev(np.linalg.eigvalsh(_host(x)), x, _dt.real_of(x.dtype))
    return _eigh_device(x)[0]


def _eig_host(x: Tensor, fn: str, want_vectors: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Eigenvalues (and right eigenvectors) of general square matrices, by LAPACK on the host,
    in the complex dtype of ``x``'s precision."""
    _float_input(x, fn, square=True)
    d = _dt.complex_of(x.dtype)
    a = _host(x)
    if a.dtype == np.float16:  # LAPACK has no half precision (bfloat16 comes back as float32)
        a = a.astype(np.float32)
    if want_vectors:
        w, v = np.linalg.eig(a)
        return w.astype(d.np), v.astype(d.np)
    return np.linalg.eigvals(a).astype(d.np), None


def eig(x: Tensor, /) -> EigResult:
    """Eigenvalues and right eigenvectors (columns, unit length) of general square matrices,
    both complex of ``x``'s precision (float32 -> complex64); computed on the host (LAPACK
    geev), the results copied to ``x``'s device. The order of the eigenvalues is unspecified.

    >>> w, v = clops.linalg.eig(clops.asarray([[0.0, -1.0], [1.0, 0.0]]))
    >>> sorted(w.to_numpy().imag)
    [-1.0, 1.0]
    """
    w, v = _eig_host(x, "eig", True)
    d = _dt.complex_of(x.dtype)
    return EigResult(_dev(w, x, d), _dev(v, x, d))


def eigvals(x: Tensor, /) -> Tensor:
    """Eigenvalues of general square matrices, complex of ``x``'s precision (host LAPACK).

    >>> clops.linalg.eigvals(clops.asarray([[2.0, 1.0], [0.0, 3.0]])).dtype
    clops.complex64
    """
    w, _ = _eig_host(x, "eigvals", False)
    return _dev(w, x, _dt.complex_of(x.dtype))


def _svd_device(x: Tensor, want_uv: bool, full: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(U, S, Vh) of real ``x`` by one-sided Jacobi (U and Vh None-like when not wanted)."""
    from .array.advanced_indexing import take_along_axis
    from .array.kernel_ops import contiguous, new
    from .array.sorting import argsort
    M, N = x.shape[-2:]
    batch = x.shape[:-2]
    wide = M < N
    m, n = (N, M) if wide else (M, N)  # work on the tall one (x^T when x is wide)
    src = contiguous(x)
    u = new(batch + (m, n), x.dtype, x.device)
    v = new(batch + (n, n), x.dtype, x.device)
    rs, cs = (1, N) if wide else (N, 1)
    linalg_kernels.svd_jacobi(x.device, x.dtype, src.buffer, src.offset, rs, cs,
                              int(np.prod(batch)), m, n, u.buffer, v.buffer,
                              2 * _eps(x.dtype))
    s = vector_norm(u, axis=-2)
    order = argsort(s, axis=-1, descending=True)
    s = take_along_axis(s, order, axis=-1)
    if not want_uv:
        return s, s, s
    cols = reshape(order, order.shape[:-1] + (1, n))
    u = take_along_axis(u, broadcast_to(cols, u.shape), axis=-1)
    v = take_along_axis(v, broadcast_to(cols, v.shape), axis=-1)
    safe = _ew.where(apply("greater", s, 0), s, 1)
    u = apply("divide", u, reshape(safe, safe.shape[:-1] + (1, n)))
    # Orthonormal left vectors, completed where singular values vanish (and to m x m for
    # full_matrices): Q of u's QR, each column signed as u's.
    q, r = qr(u, mode="complete" if full else "reduced")
    sign = _ew.where(apply("less", diagonal(r), 0), -1.0, 1.0)
    if full and m > n:
        from .array.manipulation import concat

        ones = broadcast_to(asarray(1.0, dtype=x.dtype, device=x.device), batch + (m - n,))
        sign = concat([sign, ones], axis=-1)
    left = apply("multiply", q, reshape(sign, sign.shape[:-1] + (1, sign.shape[-1])))
    right = matrix_transpose(v)
    if wide:  # x = (x^T)^T = V S U^T
        return matrix_transpose(right), s, matrix_transpose(left)
    return left, s, right


def svd(x: Tensor, /, *, full_matrices: bool = True) -> SVDResult:
    """Singular value decomposition ``x = U @ diag(S) @ Vh``, S descending. Real inputs on
    the device (one-sided Jacobi, one work-group per matrix; singular vectors may differ from
    LAPACK's by sign); complex ones, and on GPUs a few matrices larger than
    ``JACOBI_MAX_GPU``, on the host.

    >>> clops.linalg.svd(clops.eye(2)).S
    Tensor([1., 1.], dtype=float32, device=opencl:cpu:0)
    """
    _float_input(x, "svd")
    if not _jacobi(x):
        u, s, vh = np.linalg.svd(_host(x), full_matrices=full_matrices)
        return SVDResult(_dev(u, x), _dev(s, x, _dt.real_of(x.dtype)), _dev(vh, x))
    return SVDResult(*_svd_device(x, True, full_matrices))


def svdvals(x: Tensor, /) -> Tensor:
    """Singular values, descending (real: device; complex: host).

    >>> clops.linalg.svdvals(clops.eye(2) * 2)
    Tensor([2., 2.], dtype=float32, device=opencl:cpu:0)
    """
    _float_input(x, "svdvals")
    if not _jacobi(x):
        return _dev(np.linalg.svd(_host(x), compute_uv=False), x, _dt.real_of(x.dtype))
    return _svd_device(x, False, False)[1]


def pinv(x: Tensor, /, *, rtol: float | Tensor | None = None) -> Tensor:
    """Moore-Penrose pseudo-inverse: singular values above ``rtol`` times the largest are
    inverted (``rtol`` defaults to ``max(M, N) * eps``). Real: device; complex: host.

    >>> clops.linalg.pinv(clops.eye(2) * 2)[0, 0].item()
    0.5
    """
    same_device("pinv", x, rtol)
    _float_input(x, "pinv")
    if not _jacobi(x):
        a = _host(x)
        tol: Any = rtol
        if rtol is None:
            tol = max(x.shape[-2:]) * np.finfo(a.dtype).eps
        elif isinstance(rtol, Tensor):
            tol = rtol.to_numpy()  # numpy adds the trailing axis itself
        return _dev(np.linalg.pinv(a, rtol=tol), x)
    u, s, vh = _svd_device(x, True, False)
    cut = apply("multiply", _max(s, axis=-1, keepdims=True), _rtol(x, rtol))
    keep = apply("greater", s, cut)
    inv_s = _ew.where(keep, apply("divide", 1.0, _ew.where(keep, s, 1.0)), 0.0)
    k = inv_s.shape[-1]
    scaled = apply("multiply", matrix_transpose(vh), reshape(inv_s, inv_s.shape[:-1] + (1, k)))
    return matmul(scaled, matrix_transpose(u))


def _rtol(x: Tensor, rtol: float | Tensor | None) -> Any:
    if rtol is None:
        return max(x.shape[-2:]) * _eps(x.dtype)
    if isinstance(rtol, Tensor):
        return reshape(rtol, rtol.shape + (1,))
    return float(rtol)


def matrix_rank(x: Tensor, /, *, rtol: float | Tensor | None = None) -> Tensor:
    """Rank of matrices: the number of singular values above ``rtol`` times the largest
    (int64). Real: device; complex: host.

    >>> clops.linalg.matrix_rank(clops.eye(3)).item()
    3
    """
    same_device("matrix_rank", x, rtol)
    _float_input(x, "matrix_rank")
    if not _jacobi(x):
        s_h = np.linalg.svd(_host(x), compute_uv=False)
        if rtol is None:
            tol = s_h.max(axis=-1, keepdims=True, initial=0) * max(x.shape[-2:]) * \
                np.finfo(s_h.dtype).eps
        else:
            r = rtol.to_numpy() if isinstance(rtol, Tensor) else rtol
            tol = s_h.max(axis=-1, keepdims=True, initial=0) * np.asarray(r)[..., None]
        return _dev(np.count_nonzero(s_h > tol, axis=-1), x, _dt.int64)
    s = svdvals(x)
    cut = apply("multiply", _max(s, axis=-1, keepdims=True), _rtol(x, rtol))
    from .array.searching import count_nonzero

    return count_nonzero(apply("greater", s, cut), axis=-1)


# Every function here that takes arrays refuses anything else by name (see array/arguments.py).
check_namespace(globals(), __all__)
