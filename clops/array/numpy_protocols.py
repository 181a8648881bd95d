"""array, NumPy protocols: ``Tensor.__array_function__``, ``__array_ufunc__`` and pickling, so
that NumPy's functions called on tensors (as Dask calls them on its chunks) run on the device.

A NumPy function or ufunc with a clops counterpart runs as that counterpart on the device of
the tensors involved (NumPy arrays and scalars among the arguments are moved there) and gives
a tensor. Arguments clops does not take (``out=``, ``where=``, an order) and functions without a
counterpart run in NumPy on host copies of the tensors, as calling NumPy on a tensor did before
(the result is then a NumPy array): nothing that worked stops working, and no result is
silently different.

A tensor pickles as its host bytes with its dtype, shape and memory kind, and unpickles onto
the default device of the receiving process (``CLOPS_DEVICE``).
"""

from __future__ import annotations

import math
import pickle
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _config
from ._ops import register
from .tensor import Tensor

_FALLBACK = object()


def _xp() -> Any:
    import clops

    return clops


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _device(args: Any) -> Any:
    for a in args:
        if _is_tensor(a):
            return a.device
        if isinstance(a, (list, tuple)):
            d = _device(a)
            if d is not None:
                return d
    return None


def _on(x: Any, dev: Any) -> Any:
    """``x`` as a tensor on ``dev`` (tensors of another device are moved)."""
    if _is_tensor(x):
        return x if x.device is dev else x.to_device(dev)
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        return _xp().asarray(np.asarray(x), device=dev)
    return x


def _host(x: Any) -> Any:
    if _is_tensor(x):
        return np.asarray(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_host(v) for v in x)
    return x


def _fallback(func: Callable, args: Any, kwargs: dict) -> Any:
    if _config.debug_level():
        print(f"clops: numpy.{getattr(func, '__name__', func)} runs on the host (no clops "
              "counterpart for these arguments: "
              f"{[type(a).__name__ for a in args]}, {sorted(kwargs)})", file=sys.stderr)
    impl = getattr(func, "_implementation", func)
    return impl(*_host(args), **{k: _host(v) for k, v in kwargs.items()})


def _axis(a: Any) -> Any:
    return tuple(a) if isinstance(a, list) else a


# -- functions: numpy name -> (clops function, the keyword arguments it takes) ------------------
def _reduction(name: str, extra: tuple[str, ...] = ()) -> Callable:
    def run(x: Any, axis: Any = None, dtype: Any = None, out: Any = None,
            keepdims: bool = False, **kw: Any) -> Any:
        if out is not None or any(k not in extra for k in kw) or kw.get("where", True) \
                is not True:
            return _FALLBACK
        opts: dict[str, Any] = {"axis": _axis(axis), "keepdims": bool(keepdims)}
        if dtype is not None:
            if name in ("sum", "prod"):
                opts["dtype"] = dtype
            else:
                x = _xp().astype(x, dtype)
        if "ddof" in kw and kw["ddof"]:
            opts["correction"] = kw["ddof"]
        return getattr(_xp(), name)(x, **opts)

    return run


def _arg(name: str) -> Callable:
    def run(x: Any, axis: Any = None, out: Any = None, keepdims: bool = False) -> Any:
        if out is not None:
            return _FALLBACK
        return getattr(_xp(), name)(x, axis=axis, keepdims=bool(keepdims))

    return run


def _concatenate(arrays: Any, axis: Any = 0, out: Any = None, dtype: Any = None,
                 casting: str = "same_kind") -> Any:
    if out is not None or casting != "same_kind":
        return _FALLBACK
    xp = _xp()
    dev = _device(arrays)
    arrs = [_on(a, dev) for a in arrays]
    if axis is None:
        arrs, axis = [xp.reshape(a, (-1,)) for a in arrs], 0
    r = xp.concat(arrs, axis=axis)
    return xp.astype(r, dtype) if dtype is not None else r


def _stack(arrays: Any, axis: int = 0, out: Any = None, **kw: Any) -> Any:
    if out is not None or kw:
        return _FALLBACK
    dev = _device(arrays)
    return _xp().stack([_on(a, dev) for a in arrays], axis=axis)


def _tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    dev = _device((a, b))
    if isinstance(axes, (list, tuple)):
        axes = tuple(tuple(v) if isinstance(v, (list, tuple)) else (v,) for v in axes)
    return _xp().tensordot(_on(a, dev), _on(b, dev), axes=axes)


def _matmul(a: Any, b: Any, out: Any = None, **kw: Any) -> Any:
    if out is not None or kw:
        return _FALLBACK
    dev = _device((a, b))
    return _xp().matmul(_on(a, dev), _on(b, dev))


def _dot(a: Any, b: Any, out: Any = None) -> Any:
    if out is not None or np.ndim(a) == 0 or np.ndim(b) == 0 or np.ndim(b) > 2:
        return _FALLBACK
    return _matmul(a, b)


def _transpose(a: Any, axes: Any = None) -> Any:
    axes = tuple(range(a.ndim))[::-1] if axes is None else tuple(axes)
    return _xp().permute_dims(a, axes)


def _reshape(a: Any, shape: Any = None, order: str = "C", **kw: Any) -> Any:
    shape = kw.pop("newshape", shape)
    if order != "C" or kw:
        return _FALLBACK
    return _xp().reshape(a, tuple(shape) if isinstance(shape, (list, tuple)) else (shape,))


def _like(name: str) -> Callable:
    def run(a: Any, *args: Any, dtype: Any = None, order: str = "K", subok: bool = True,
            shape: Any = None, **kw: Any) -> Any:
        if kw or order not in ("K", "C"):
            return _FALLBACK
        xp = _xp()
        shp = a.shape if shape is None else (tuple(shape) if isinstance(shape, (list, tuple))
                                             else (shape,))
        dt = dtype if dtype is not None else a.dtype
        if name == "full_like":
            return xp.full(shp, args[0] if args else kw["fill_value"], dtype=dt,
                           device=a.device)
        return getattr(xp, name.replace("_like", ""))(shp, dtype=dt, device=a.device)

    return run


def _where(cond: Any, x: Any = None, y: Any = None) -> Any:
    if x is None or y is None:
        return _FALLBACK
    dev = _device((cond, x, y))
    return _xp().where(_on(cond, dev), _on(x, dev), _on(y, dev))


def _clip(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, **kw: Any) -> Any:
    a_min, a_max = kw.pop("min", a_min), kw.pop("max", a_max)
    if out is not None or kw or _is_tensor(a_min) or _is_tensor(a_max):
        return _FALLBACK
    return _xp().clip(a, min=a_min, max=a_max)


def _simple(name: str, *keys: str) -> Callable:
    def run(a: Any, *args: Any, **kw: Any) -> Any:
        if any(k not in keys for k in kw):
            return _FALLBACK
        return getattr(_xp(), name)(a, *args, **kw)

    return run


def _einsum(subscripts: str, *operands: Any, dtype: Any = None, optimize: Any = False,
            casting: str = "safe", order: str = "K", **kw: Any) -> Any:
    # on the device (clops.einsum); a diagonal (a label repeated in one operand), an out= or
    # another casting runs on the host
    if kw or casting not in ("safe", "same_kind") or order not in ("K", "C", "A"):
        return _FALLBACK
    try:
        out = _xp().einsum(subscripts, *operands)
    except NotImplementedError:
        # (a diagonal) the host's, with the result back on the operands' device
        if _config.debug_level():
            print(f"clops: numpy.einsum({subscripts!r}) runs on the host (a label repeats "
                  "within one operand)", file=sys.stderr)
        host = np.einsum(subscripts, *_host(operands), dtype=dtype)
        return _xp().asarray(host, device=_device(operands))
    return out if dtype is None else _xp().astype(out, dtype)


def _asarray_like(obj: Any, dtype: Any = None, *args: Any, ndmin: int = 0, **kw: Any) -> Any:
    # np.array(..., like=tensor) (Dask makes its metadata so): a tensor on the default device
    if args or any(v not in (None, "K", "C", True, False) for v in kw.values()):
        return _FALLBACK
    if _is_tensor(obj) and not ndmin:
        return obj if dtype is None else _xp().astype(obj, dtype)
    return _xp().asarray(np.array(_host(obj), dtype=dtype, ndmin=ndmin), device=_device((obj,)))


def _qr(a: Any, mode: str = "reduced") -> Any:
    if mode not in ("reduced", "complete"):
        return _FALLBACK
    return tuple(_xp().linalg.qr(a, mode=mode))


def _svd(a: Any, full_matrices: bool = True, compute_uv: bool = True,
         hermitian: bool = False) -> Any:
    if hermitian:
        return _FALLBACK
    la = _xp().linalg
    if not compute_uv:
        return la.svdvals(a)
    return tuple(la.svd(a, full_matrices=full_matrices))


FUNCTIONS: dict[Any, Callable] = {
    np.linalg.qr: _qr, np.linalg.svd: _svd,
    np.asarray: _asarray_like, np.array: _asarray_like,
    np.sum: _reduction("sum"), np.prod: _reduction("prod"), np.mean: _reduction("mean"),
    np.std: _reduction("std", ("ddof",)), np.var: _reduction("var", ("ddof",)),
    np.max: _reduction("max"), np.min: _reduction("min"), np.amax: _reduction("max"),
    np.amin: _reduction("min"), np.any: _reduction("any"), np.all: _reduction("all"),
    np.argmax: _arg("argmax"), np.argmin: _arg("argmin"),
    np.concatenate: _concatenate, np.stack: _stack, np.tensordot: _tensordot,
    np.matmul: _matmul, np.dot: _dot, np.transpose: _transpose, np.reshape: _reshape,
    np.ones_like: _like("ones_like"), np.zeros_like: _like("zeros_like"),
    np.empty_like: _like("empty_like"), np.full_like: _like("full_like"),
    np.where: _where, np.clip: _clip, np.einsum: _einsum,
    np.squeeze: _simple("squeeze", "axis"), np.expand_dims: _simple("expand_dims", "axis"),
    np.broadcast_to: _simple("broadcast_to"),
}


@register
def array_function(func: Any, types: Any, args: Any, kwargs: dict) -> Any:
    impl = FUNCTIONS.get(func)
    if impl is not None:
        try:
            out = impl(*args, **kwargs)
        except TypeError as e:
            out = _FALLBACK  # a signature clops does not take
            if _config.debug_level():
                print(f"clops: numpy.{func.__name__} on tensors: {e}", file=sys.stderr)
        if out is not _FALLBACK:
            return out
    return _fallback(func, args, kwargs)


# -- ufuncs ---------------------------------------------------------------------------------------
UFUNCS = {
    "add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide",
    "true_divide": "divide", "floor_divide": "floor_divide", "remainder": "remainder",
    "power": "pow", "negative": "negative", "positive": "positive", "absolute": "abs",
    "exp": "exp", "expm1": "expm1", "log": "log", "log1p": "log1p", "log2": "log2",
    "log10": "log10", "sqrt": "sqrt", "square": "square", "sin": "sin", "cos": "cos",
    "tan": "tan", "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arctan2": "atan2",
    "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "arcsinh": "asinh", "arccosh": "acosh",
    "arctanh": "atanh", "maximum": "maximum", "minimum": "minimum", "equal": "equal",
    "not_equal": "not_equal", "less": "less", "less_equal": "less_equal",
    "greater": "greater", "greater_equal": "greater_equal", "logical_and": "logical_and",
    "logical_or": "logical_or", "logical_xor": "logical_xor", "logical_not": "logical_not",
    "isnan": "isnan", "isinf": "isinf", "isfinite": "isfinite", "sign": "sign",
    "floor": "floor", "ceil": "ceil", "trunc": "trunc", "rint": "round",
    "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor",
    "invert": "bitwise_invert", "matmul": "matmul",
}
REDUCE = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min",
          "logical_and": "all", "logical_or": "any"}


@register
def array_ufunc(ufunc: Any, method: str, inputs: Any, kwargs: dict) -> Any:
    xp = _xp()
    plain = not kwargs or set(kwargs) <= {"dtype"} and kwargs.get("dtype") is None
    fn = getattr(xp, UFUNCS.get(ufunc.__name__, ""), None)
    cast = kwargs.get("dtype") if set(kwargs) == {"dtype"} else None
    if method == "__call__" and fn is not None and (plain or cast is not None):
        dev = _device(inputs)
        # tensors of another device move; host arrays combine as the elementwise functions
        # take them (a lower kind adopts the tensors' dtype)
        args = [_on(a, dev) if _is_tensor(a) else a for a in inputs]
        if cast is not None:
            args = [xp.astype(a, cast) if _is_tensor(a) else
                    np.asarray(a, dtype=cast) if isinstance(a, np.ndarray) else a
                    for a in args]
        try:
            return fn(*args)
        except TypeError:
            pass  # operands the Array API function does not take: the host's ufunc
    if method == "reduce" and ufunc.__name__ in REDUCE and len(inputs) == 1:
        run = _reduction(REDUCE[ufunc.__name__])
        out = run(inputs[0], **{k: v for k, v in kwargs.items() if k != "initial"}) \
            if "initial" not in kwargs else _FALLBACK
        if out is not _FALLBACK:
            return out
    # the host's ufunc on host copies, as before
    if _config.debug_level():
        print(f"clops: numpy.{ufunc.__name__}.{method} runs on the host ({sorted(kwargs)})",
              file=sys.stderr)
    host = [_host(a) for a in inputs]
    kw = {k: _host(v) for k, v in kwargs.items()}
    return getattr(ufunc, method)(*host, **kw)


# -- pickling -------------------------------------------------------------------------------------
@register
def reduce_tensor(t: Any, protocol: int = 5) -> tuple:
    """(rebuild, (bytes, dtype name, shape, memory kind)): one copy from the device into host
    memory, which pickle protocol 5 hands on as an out-of-band buffer (Dask sends it as a
    frame, not copied again)."""
    host = np.ascontiguousarray(np.asarray(t))
    data: Any = pickle.PickleBuffer(host.data) if protocol >= 5 else host.tobytes()
    return (rebuild_tensor, (data, t.dtype.name, tuple(t.shape), t.usm_type))


def rebuild_tensor(data: Any, dtype: str, shape: tuple, kind: str) -> Any:
    xp = _xp()
    dt = getattr(xp, dtype)
    npdt = np.float32 if dtype == "bfloat16" else dt.np if hasattr(dt, "np") else dtype
    arr = np.frombuffer(data, dtype=npdt, count=math.prod(shape)).reshape(shape) \
        if math.prod(shape) else np.empty(shape, npdt)
    return xp.asarray(arr, dtype=dt, usm_type=kind)
