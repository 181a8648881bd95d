"""Array layer, Tensor: device memory from the pool plus shape, strides, offset, dtype and
device. Operations record lazy graph nodes; values are computed when needed."""

from __future__ import annotations

import asyncio
import operator
import sys
import weakref
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from .. import _config, runtime
from ..compiler import realize as _realize
from ..graph import dtypes as _dt
from ..graph import ir
from ..graph.dtypes import DType
from ..graph.ir import Node, View, prod
from ..kernels import gather as _gather
from ..runtime import plan as _plan
from ._ops import OPS

# Graph depth past which an op realizes its result at once (bounds kernel size and memory).
MAX_DEPTH = 256

# Tensors whose value is still a lazy graph, by id, each held weakly (its entry leaves with it);
# consulted before a buffer is written in place, so that pending readers of the old contents are
# computed first.
# PERF: a dict of weak references, not a WeakValueDictionary (whose entries are made and
# dropped in Python): 1.0 -> 0.3 us a pending tensor, and every op makes one
_PENDING: dict[int, weakref.ref[Tensor]] = {}


def _forget(key: int, pop: Any = _PENDING.pop) -> Any:
    """The callback that drops ``_PENDING``'s entry ``key`` when its tensor goes."""
    return lambda _: pop(key, None)


def pending_tensors() -> list[Tensor]:
    """The tensors alive whose value is still a lazy graph."""
    return [t for r in list(_PENDING.values()) if (t := r()) is not None]


def _reads_buffer(node: Node, buf: Any, seen: set[int] | None = None) -> bool:
    seen = set() if seen is None else seen
    stack = [node]
    while stack:
        n = stack.pop().resolve()
        if n.id in seen:
            continue
        seen.add(n.id)
        if n.op == "load":
            if n.arg[0] is buf:
                return True
        else:
            stack.extend(n.srcs)
    return False


# numpy's limit on a dimension and on an element count (its intp); past it no buffer exists.
MAX_SIZE = 2**63 - 1
# The most dimensions a tensor may have: numpy's own limit (NPY_MAXDIMS), so every tensor has a
# host copy; ``__array_namespace_info__().capabilities()["max dimensions"]`` reports it.
MAX_DIMS = 64


def check_rank(ndim: int, what: str) -> None:
    """ValueError naming ``what`` and the limit when a result would have more than
    ``MAX_DIMS`` dimensions."""
    if ndim > MAX_DIMS:
        raise ValueError(f"{what}: the result would have {ndim} dimensions; clops tensors have "
                         f"at most {MAX_DIMS} (the namespace's 'max dimensions'): merge "
                         "dimensions with reshape")


def as_shape(shape: Any, what: str, arg: str = "shape", unknown: bool = False
             ) -> tuple[int, ...]:
    """``shape`` (an int or a sequence of ints) as a tuple of Python ints, checked where it
    comes in: TypeError for an entry that is not an integer, ValueError for a negative one
    (with ``unknown``, one -1 may stand for the size reshape works out) or for a size past
    int64. ``what`` and ``arg`` name the function and the argument in the message.

    >>> as_shape(3, "zeros")
    (3,)
    """
    if type(shape) is tuple and len(shape) <= MAX_DIMS:
        # PERF: a tuple of Python ints in range (most calls) returns as it is: 2.0 -> 0.5 us
        total = 1
        for n in shape:
            if type(n) is not int or not 0 <= n <= MAX_SIZE:
                break
            if n:
                total *= n
        else:
            if total <= MAX_SIZE:
                return shape
    entries = (shape,) if not isinstance(shape, Sequence) and hasattr(shape, "__index__") \
        else shape
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence | np.ndarray):
        raise TypeError(f"{what}: {arg} must be an int or a sequence of ints, not "
                        f"{type(shape).__name__}")
    out = []
    for n in entries:
        try:
            out.append(operator.index(n))
        except TypeError:
            raise TypeError(f"{what}: {arg} {tuple(entries)!r} has an entry that is not an "
                            f"integer: {n!r} ({type(n).__name__})") from None
    shp = tuple(out)
    check_rank(len(shp), what)
    lowest = -1 if unknown else 0
    if any(n < lowest for n in shp):
        why = "only -1 may stand for an unknown size" if unknown else \
            "negative dimensions are not allowed"
        raise ValueError(f"{what}: {arg} {shp} has a negative entry; {why}")
    if unknown and shp.count(-1) > 1:
        raise ValueError(f"{what}: {arg} {shp} has more than one -1; only one dimension can "
                         "be unknown")
    if any(n > MAX_SIZE for n in shp) or prod(tuple(n for n in shp if n > 0)) > MAX_SIZE:
        raise ValueError(f"{what}: {arg} {shp} is too big: a dimension or the number of "
                         f"elements exceeds {MAX_SIZE} (int64)")
    return shp


AXIS_TYPES = "axis must be an int or a tuple of ints"


def axis_int(axis: Any) -> int:
    """``axis`` as a Python int; TypeError for anything else (a bool too, as numpy says; a
    string would otherwise fail later on a comparison that names no axis).

    >>> axis_int("0")
    Traceback (most recent call last):
    TypeError: axis must be an int or a tuple of ints, not '0' (str)
    """
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"{AXIS_TYPES}, not {axis!r} ({type(axis).__name__})")
    return int(axis.__index__())


def same_device(what: str, *operands: Any) -> runtime.CLDevice | None:
    """The device the Tensors among ``operands`` share (None if there are none); ValueError
    naming both devices where two differ (a kernel given buffers of another device's context
    never completes).

    >>> same_device("take", x, indices)
    <clops.CLDevice 'opencl:cpu:0': ...>
    """
    dev: runtime.CLDevice | None = None
    for t in operands:
        if isinstance(t, Tensor):
            if dev is None:
                dev = t.device
            elif t.device is not dev:
                how = ("they share a context: move one with x.to_device(other), a device-side "
                       "copy" if dev.shares_context(t.device) else
                       "move one with .to_device() (a copy through the host: clops.context "
                       "puts devices of one platform in one context)")
                raise ValueError(f"{what}: operands are on different devices ({dev} and "
                                 f"{t.device}); {how}")
    return dev


def spec_sequence(items: Sequence[Any]) -> Any:
    """``items`` as the sequence type the chosen Array API version returns from meshgrid,
    broadcast_arrays and ``devices()``: a list up to 2024.12, a tuple from 2025.12
    (``CLOPS_ARRAY_API_VERSION``)."""
    return tuple(items) if _config.CONFIG.array_api_version >= "2025.12" else list(items)


class Tensor:
    """An n-dimensional array on an OpenCL device (the Array API's array object).

    >>> x = clops.asarray([[1.0, 2.0], [3.0, 4.0]])
    >>> (x * 2).sum(axis=1)
    Tensor([ 6., 14.], dtype=float32, device=opencl:cpu:0)
    """

    __slots__ = ("_node", "device", "__weakref__")
    __array_priority__ = 100

    def __init__(self, node: Node, device: runtime.CLDevice) -> None:
        # NOTE: every function that makes a tensor passes here, so no rank past the limit
        # reaches the compiler; the functions that take a shape refuse it sooner, by name.
        if len(node.shape) > MAX_DIMS:
            check_rank(len(node.shape), "Tensor")
        self._node = node
        self.device = device
        if node.op != "load":
            _PENDING[id(self)] = weakref.ref(self, _forget(id(self)))
            if node.depth > MAX_DEPTH:
                self.realize()

    # -- construction ------------------------------------------------------------------------------
    @staticmethod
    def _from_buffer(buffer: runtime.Buffer, shape: Sequence[int], dtype: Any,
                     device: runtime.CLDevice, strides: Sequence[int] | None = None,
                     offset: int = 0) -> Tensor:
        """Wrap an existing pooled buffer (strides and offset in elements)."""
        shape = tuple(int(n) for n in shape)
        v = View(shape, tuple(strides) if strides is not None else
                 ir.contiguous_strides(shape), int(offset))
        return Tensor(ir.load(buffer, v, _dt.to_dtype(dtype)), device)

    # -- basic attributes --------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._node.shape

    @property
    def dtype(self) -> DType:
        return self._node.dtype

    @property
    def ndim(self) -> int:
        return len(self._node.shape)

    @property
    def size(self) -> int:
        return prod(self._node.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # -- realization -------------------------------------------------------------------------------
    def realize(self) -> Tensor:
        """Compute the pending graph of this tensor (asynchronously) and return it."""
        realize(self)
        return self

    @property
    def _load(self) -> Node:
        n = self._node.resolve()
        if n.op != "load":
            self.realize()
            n = self._node.resolve()
        return n

    @property
    def buffer(self) -> runtime.Buffer:
        return self._load.arg[0]

    @property
    def offset(self) -> int:
        """Offset of the first element in the buffer, in elements."""
        return self._load.arg[1].offset

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements (may be 0 for broadcast axes and negative for flips)."""
        return self._load.arg[1].strides

    @property
    def is_contiguous(self) -> bool:
        v = self._load.arg[1]
        return v.is_contiguous

    def contiguous(self) -> Tensor:
        """A C-contiguous tensor with the same values (this one, if it already is)."""
        n = self._load
        if n.arg[1].is_contiguous:
            return self
        tiled = self._permuted_copy(n)
        if tiled is not None:
            return tiled
        out = Tensor(ir.ew("identity", [n], n.dtype), self.device)
        return out.realize()

    def _permuted_copy(self, n: Node) -> Tensor | None:
        """The contiguous copy of a permuted view of a dense block through ``permute_tiles``
        on CPU devices (None where the view is not one, or is small). PERF (float32 permuted
        (2, 0, 1), 2 cores, kernel time): the compiler's copy of a work-item an element took
        Intel's runtime 380-400 ms for 256x256x256 against 26-30, 2.2-7 ms for 64x128x64 against
        0.4-0.9; PoCL 3.1 470-500 against 63-85, 2.7-3.5 against 0.6-1.4."""
        if self.device.kind != "cpu":
            return None
        buf, v = n.arg
        plan = _gather.permute_plan(v.shape, v.strides)
        if plan is None or self.dtype.itemsize not in _gather.BITS_TYPES:
            return None
        nq, osq, nj, sj, na, sa, osa, nb, sb, osb = plan
        dev = self.device
        out = dev.alloc(max(self.nbytes, 1))
        _gather.permute_tiles(dev, self.dtype.itemsize, out, buf, v.offset, nq, osq, nj, sj, na,
                              sa, osa, nb, sb, osb)
        return Tensor(ir.load(out, View.contiguous(self.shape), self.dtype), dev)

    # -- host transfer -----------------------------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """Copy to a new numpy array (waits for the device). bfloat16 comes back as float32."""
        _plan.refuse("a read of a tensor to the host")
        t = self.contiguous()
        n = t._load
        buf, v = n.arg
        d = self.dtype
        host = np.empty(self.shape, dtype=d.np)
        if host.size:
            self.device.read(host, buf, v.offset * d.itemsize)
        if d.name == "bfloat16":
            return (host.astype(np.uint32) << 16).view(np.float32)
        if d.kind == "b":
            return host.astype(bool)
        return host

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None,
            ) -> np.ndarray:
        """A numpy copy of this tensor (waits for the device), as CuPy's ``ndarray.get``:
        ``order`` "C", "F" or "A" (Fortran order where this tensor is Fortran-contiguous and
        not C-contiguous); ``out``, a writable numpy array of this shape and of the dtype the
        copy has (bfloat16 comes back as float32), receives the values and is returned.
        ``stream`` must be None: the copy is ordered after every write to this tensor (for a
        copy that does not wait, ``to_host_async``).

        >>> clops.asarray([[1, 2], [3, 4]]).T.get(order="F").flags.f_contiguous
        True
        """
        temporary = sys.getrefcount(self) <= _temporary_refs("get")  # (before self._get)
        return self._get(stream, order, out, temporary)

    def _get(self, stream: Any, order: str, out: np.ndarray | None, temporary: bool
             ) -> np.ndarray:
        """``get``; ``temporary``: nothing else holds this tensor (``_host_result``)."""
        if stream is not None:
            raise ValueError("Tensor.get(stream=...) is not supported: the copy already waits "
                             "for every write to the tensor; use to_host_async() for a copy "
                             "that does not block")
        if order not in ("C", "F", "A"):
            raise ValueError(f"order must be 'C', 'F' or 'A', not {order!r}")
        host_dtype = np.dtype(np.float32) if self.dtype.name == "bfloat16" else \
            np.dtype(bool) if self.dtype.kind == "b" else self.dtype.np
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"out must be a numpy.ndarray, not {type(out).__name__}")
            if out.shape != self.shape:
                raise ValueError(f"out has shape {out.shape}, the tensor {self.shape}")
            if out.dtype != host_dtype:
                raise TypeError(f"out has dtype {out.dtype}, the tensor's host copy "
                                f"{host_dtype} (tensor dtype {self.dtype.name})")
            if not out.flags.writeable:
                raise ValueError("out is read-only")
            out[...] = self.to_numpy()
            return out
        if temporary:
            host = _host_result(self)  # (C-contiguous)
            if host is not None:
                return np.asarray(host, order="F") if order == "F" else host
        host = self.to_numpy()
        if order == "F" or (order == "A" and self.ndim > 1 and not self._c_layout()
                            and self._f_layout()):
            return np.asarray(host, order="F")  # (np.asfortranarray makes 0-d 1-d)
        return host

    def _c_layout(self) -> bool:
        return self._load.arg[1].is_contiguous

    def _f_layout(self) -> bool:
        """Whether this tensor's elements lie in Fortran order (the first axis fastest)."""
        v = self._load.arg[1]
        step = 1
        for n, s in zip(v.shape, v.strides):
            if n != 1 and s != step:
                return False
            step *= n
        return True

    def tolist(self) -> Any:
        """The values as nested Python lists of Python scalars, as numpy's ``tolist`` (a 0-d
        tensor gives one scalar).

        >>> clops.asarray([[1, 2], [3, 4]]).tolist()
        [[1, 2], [3, 4]]
        """
        return self.to_numpy().tolist()

    @property
    def usm_type(self) -> str:
        """The memory kind of this tensor's buffer: ``"device"``, ``"host"`` or ``"shared"``
        (see ``clops.asarray(..., usm_type=)``)."""
        return str(self.buffer.kind)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        temporary = sys.getrefcount(self) <= _temporary_refs("array")  # (before self.to_numpy)
        if temporary and copy is not False:
            a = _host_result(self)  # (before zero_copy, which computes the tensor)
            if a is not None:
                return a if dtype is None else a.astype(dtype, copy=False)
        if copy is not True and OPS.zero_copy(self):
            a = OPS.host_array(self)  # host or shared memory: numpy reads it in place
            return a if dtype is None else a.astype(dtype, copy=copy is not False)
        if copy is False:
            raise ValueError("this tensor's memory is not readable by the host in place: "
                             "np.asarray(t, copy=False) needs usm_type='host' or 'shared' on a "
                             "device that shares the host's memory")
        a = self.to_numpy()
        return a.astype(dtype) if dtype is not None else a

    def item(self) -> Any:
        if self.size != 1:
            raise ValueError(f"only a tensor of one element converts to a Python scalar, "
                             f"this one has shape {self.shape}")
        return self.to_numpy().reshape(()).item()

    def __bool__(self) -> bool:
        return bool(self.item())

    def __int__(self) -> int:
        if self.dtype.kind == "c":
            raise TypeError("int() of a complex tensor")
        return int(self.item())

    def __float__(self) -> float:
        if self.dtype.kind == "c":
            raise TypeError("float() of a complex tensor")
        return float(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    def __index__(self) -> int:
        if not self.dtype.is_int:
            raise TypeError(f"only integer tensors can be used as an index, not {self.dtype}")
        return int(self.item())

    def __repr__(self) -> str:
        body = np.array2string(self.to_numpy(), separator=", ", prefix="Tensor(")
        return f"Tensor({body}, dtype={self.dtype.name}, device={self.device.selector})"

    __str__ = __repr__

    def to_device(self, device: Any, /, *, stream: Any = None) -> Tensor:
        """This tensor on another device: a device-side copy where the two share a context
        (``clops.context``, sub-devices of one split), else a copy through the host."""
        dev = runtime.device(device)
        if dev is self.device:
            return self
        if dev.shares_context(self.device):
            # one context: a device-side copy, ordered by the buffers' events across queues
            src = self.contiguous()
            buf, v = src._load.arg
            out = dev.alloc(max(self.nbytes, 1), buf.kind)
            dev.copy(out, buf, self.nbytes, 0, v.offset * self.dtype.itemsize)
            return Tensor(ir.load(out, View.contiguous(self.shape), self.dtype), dev)
        return OPS.asarray(self.to_numpy(), dtype=self.dtype, device=dev)

    # -- views -------------------------------------------------------------------------------------
    def _move(self, fn: Any) -> Tensor:
        return Tensor(ir.movement(self._node.resolve(), fn), self.device)

    def reshape(self, shape: Sequence[int], /, *, copy: bool | None = None) -> Tensor:
        return OPS.reshape(self, shape, copy=copy)

    def permute_dims(self, axes: Sequence[int]) -> Tensor:
        return OPS.permute_dims(self, axes)

    @property
    def T(self) -> Tensor:
        if self.ndim != 2:
            raise ValueError(f".T needs a 2-d tensor, this one has {self.ndim} dims; use "
                             "permute_dims or matrix_transpose")
        return self._move(lambda v: v.permute((1, 0)))

    @property
    def mT(self) -> Tensor:
        if self.ndim < 2:
            raise ValueError(".mT needs at least 2 dims")
        axes = tuple(range(self.ndim - 2)) + (self.ndim - 1, self.ndim - 2)
        return self._move(lambda v: v.permute(axes))

    def __getitem__(self, key: Any, /) -> Tensor:
        return OPS.getitem(self, key)

    def __setitem__(self, key: Any, value: Any, /) -> None:
        OPS.setitem(self, key, value)

    def _assign(self, value: Tensor) -> None:
        """Write ``value`` (same shape) into this tensor's memory, in place."""
        dst = self._load
        buf, v = dst.arg
        node = value._node.resolve()
        # The right-hand side is computed before any element is written: if it reads this
        # buffer through another view, compute it into a temporary first.
        if node.op != "load" or node.arg[0] is buf:
            if _reads_buffer(node, buf) and not (node.op == "load" and node.arg[1] == v):
                if node.op == "load":
                    node = ir.ew("identity", [node], node.dtype)
                tmp = Tensor(node, self.device).realize()
                node = tmp._node.resolve()
        _flush_readers(buf, exclude=value)
        # (bind=False: the right-hand side's node stays pending, not marked computed in this
        # tensor's memory, which a later write would change under it)
        _realize.realize([(node, buf, v)], self.device, bind=False)

    # -- Array API protocol ------------------------------------------------------------------------
    # -- NumPy's dispatch protocols and pickling (see numpy_protocols) ------------------------
    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return OPS.array_function(func, types, args, kwargs)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return OPS.array_ufunc(ufunc, method, inputs, kwargs)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return OPS.reduce_tensor(self, protocol)

    def __array_namespace__(self, /, *, api_version: str | None = None) -> Any:
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12", "2025.12"):
            raise ValueError(f"api_version {api_version!r} is not supported; use one of "
                             "'2021.12' to '2025.12'")
        import clops

        return clops

    def __dlpack_device__(self) -> tuple[int, int]:
        return OPS.dlpack_device(self)

    def __dlpack__(self, /, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: bool | None = None) -> Any:
        return OPS.dlpack(self, stream=stream, max_version=max_version, dl_device=dl_device,
                          copy=copy)

    def to_pyopencl(self) -> Any:
        """A ``pyopencl.array.Array`` over this tensor's memory (no copy)."""
        return OPS.to_pyopencl(self)

    # -- events and futures ------------------------------------------------------------------------
    def ready(self) -> runtime.Event:
        """An event that completes when this tensor's value is computed."""
        buf = self.buffer
        lw = buf.last_write
        return runtime.Event(lw[0] if lw else None, lw[1] if lw else None)

    def to_host_async(self) -> Any:
        """A ``concurrent.futures.Future`` of the numpy value; awaitable through asyncio with
        ``await asyncio.wrap_future(...)`` or ``await t.numpy_async()``."""
        return OPS.to_host_future(self)

    async def numpy_async(self) -> np.ndarray:
        return await asyncio.wrap_future(self.to_host_async())

    def __await__(self) -> Any:
        return self.numpy_async().__await__()


    # -- operators (the Array API's, each a lazy elementwise node) -------------------------------
    def _ew(self, fn: str, *args: Any) -> Tensor:
        return OPS.apply(fn, *args)

    def __add__(self, other: Any, /) -> Tensor:
        return self._ew("add", self, other)

    def __radd__(self, other: Any, /) -> Tensor:
        return self._ew("add", other, self)

    def __iadd__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("add", self, other), "add")

    def __sub__(self, other: Any, /) -> Tensor:
        return self._ew("subtract", self, other)

    def __rsub__(self, other: Any, /) -> Tensor:
        return self._ew("subtract", other, self)

    def __isub__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("subtract", self, other), "subtract")

    def __mul__(self, other: Any, /) -> Tensor:
        return self._ew("multiply", self, other)

    def __rmul__(self, other: Any, /) -> Tensor:
        return self._ew("multiply", other, self)

    def __imul__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("multiply", self, other), "multiply")

    def __truediv__(self, other: Any, /) -> Tensor:
        return self._ew("divide", self, other)

    def __rtruediv__(self, other: Any, /) -> Tensor:
        return self._ew("divide", other, self)

    def __itruediv__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("divide", self, other), "divide")

    def __floordiv__(self, other: Any, /) -> Tensor:
        return self._ew("floor_divide", self, other)

    def __rfloordiv__(self, other: Any, /) -> Tensor:
        return self._ew("floor_divide", other, self)

    def __ifloordiv__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("floor_divide", self, other), "floor_divide")

    def __mod__(self, other: Any, /) -> Tensor:
        return self._ew("remainder", self, other)

    def __rmod__(self, other: Any, /) -> Tensor:
        return self._ew("remainder", other, self)

    def __imod__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("remainder", self, other), "remainder")

    def __pow__(self, other: Any, /) -> Tensor:
        return self._ew("pow", self, other)

    def __rpow__(self, other: Any, /) -> Tensor:
        return self._ew("pow", other, self)

    def __ipow__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("pow", self, other), "pow")

    def __and__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_and", self, other)

    def __rand__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_and", other, self)

    def __iand__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("bitwise_and", self, other), "bitwise_and")

    def __or__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_or", self, other)

    def __ror__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_or", other, self)

    def __ior__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("bitwise_or", self, other), "bitwise_or")

    def __xor__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_xor", self, other)

    def __rxor__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_xor", other, self)

    def __ixor__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("bitwise_xor", self, other), "bitwise_xor")

    def __lshift__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_left_shift", self, other)

    def __rlshift__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_left_shift", other, self)

    def __ilshift__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("bitwise_left_shift", self, other), "bitwise_left_shift")

    def __rshift__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_right_shift", self, other)

    def __rrshift__(self, other: Any, /) -> Tensor:
        return self._ew("bitwise_right_shift", other, self)

    def __irshift__(self, other: Any, /) -> Tensor:
        return self._inplace(self._ew("bitwise_right_shift", self, other), "bitwise_right_shift")

    def __eq__(self, other: Any, /) -> Tensor:  # type: ignore[override]
        return self._ew("equal", self, other)

    def __ne__(self, other: Any, /) -> Tensor:  # type: ignore[override]
        return self._ew("not_equal", self, other)

    def __lt__(self, other: Any, /) -> Tensor:  # type: ignore[override]
        return self._ew("less", self, other)

    def __le__(self, other: Any, /) -> Tensor:  # type: ignore[override]
        return self._ew("less_equal", self, other)

    def __gt__(self, other: Any, /) -> Tensor:  # type: ignore[override]
        return self._ew("greater", self, other)

    def __ge__(self, other: Any, /) -> Tensor:  # type: ignore[override]
        return self._ew("greater_equal", self, other)

    def __neg__(self, /) -> Tensor:
        return self._ew("negative", self)

    def __pos__(self, /) -> Tensor:
        return self._ew("positive", self)

    def __abs__(self, /) -> Tensor:
        return self._ew("abs", self)

    def __invert__(self, /) -> Tensor:
        return self._ew("bitwise_invert", self)

    def __matmul__(self, other: Any, /) -> Tensor:
        return OPS.matmul(self, other)

    def __rmatmul__(self, other: Any, /) -> Tensor:
        return OPS.matmul(other, self)

    def __imatmul__(self, other: Any, /) -> Tensor:
        return self._inplace(self.__matmul__(other), "matmul")

    def _inplace(self, res: Tensor, fn: str) -> Tensor:
        if res.shape != self.shape:
            raise ValueError(f"in-place {fn} would change the shape {self.shape} to "
                             f"{res.shape}")
        if res.dtype != self.dtype:
            raise TypeError(f"in-place {fn} of {self.dtype} would give {res.dtype}; the "
                            "Array API does not allow an in-place dtype change")
        self._assign(res)
        return self

    # -- convenience methods in the manner of numpy and PyTorch ------------------------------------
    def sum(self, *, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Tensor:
        return OPS.sum(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def prod(self, *, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Tensor:
        return OPS.prod_(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def mean(self, *, axis: Any = None, keepdims: bool = False) -> Tensor:
        return OPS.mean(self, axis=axis, keepdims=keepdims)

    def max(self, *, axis: Any = None, keepdims: bool = False) -> Tensor:
        return OPS.max(self, axis=axis, keepdims=keepdims)

    def min(self, *, axis: Any = None, keepdims: bool = False) -> Tensor:
        return OPS.min(self, axis=axis, keepdims=keepdims)

    def astype(self, dtype: Any, /, *, copy: bool = True) -> Tensor:
        return OPS.astype(self, dtype, copy=copy)

    def squeeze(self, axis: Any = None) -> Tensor:
        """Without the axes of length 1 named (all of them by default), as numpy's."""
        if axis is None:
            axis = tuple(i for i, n in enumerate(self.shape) if n == 1)
        return OPS.squeeze(self, axis=axis)

    __hash__ = None  # type: ignore[assignment]


# PERF (2-core EPYC with AVX2, shared with other work; np.asarray(a + b) of float32, medians
# of calls in turns): computed into a pool buffer and copied, against read in place: Intel's
# CPU runtime 64 KiB 0.101 / 0.089 ms, 2 MiB 0.307 / 0.244, 64 MiB 24.2 / 12.8 (numpy 17.1);
# PoCL 3.1 0.158 / 0.105, 0.338 / 0.263, 21.5 / 10.3 (numpy 10.9). Smaller results are copied.
DIRECT_MIN = 1 << 16


def _host_result(t: Tensor) -> np.ndarray | None:
    """A numpy array of ``t``, a tensor that nothing else holds, without a copy where one
    of ``_compute_to_host`` (pending) and ``_hand_over`` (computed) applies, else None."""
    if t._node.resolve().op != "load":
        return _compute_to_host(t)
    return _hand_over(t)


def _compute_to_host(t: Tensor) -> np.ndarray | None:
    """The values of ``t``, a pending tensor that nothing else holds, in a numpy array over the
    memory its kernels write, on a device whose memory the host addresses (no copy); ``t``
    stays pending, since that memory is the array's alone now (nothing can use ``t`` after
    this). None where that does not apply: computed already, a device of its own memory, a
    dtype the host stores otherwise, a small result (a copy costs less than the map)."""
    _plan.refuse("a read of a tensor to the host")
    node = t._node.resolve()
    if node.op == "load" or not _host_shares(t):
        return None
    dev = t.device
    buf = dev.alloc(t.size * t.dtype.itemsize)
    _realize.realize([(node, buf, View.contiguous(t.shape))], dev, bind=False)
    return OPS.buffer_array(buf, t.shape, t.dtype)


def _hand_over(t: Tensor) -> np.ndarray | None:
    """The values of ``t``, a computed tensor that nothing else holds, as a numpy array over
    its own memory (no copy), where that memory is a whole pool buffer that nothing else
    refers to (no other tensor or view of it, no pending work that reads it: every reference
    to its node and its buffer counted) on a device whose memory the host addresses. None
    where that does not apply (as ``_compute_to_host``'s, and any other reference)."""
    _plan.refuse("a read of a tensor to the host")
    node = t._node
    if node.op != "load" or not _host_shares(t):
        return None
    buf, v = node.arg
    if buf.kind != "device" or buf.pool is None or not v.is_contiguous or v.offset:
        return None
    node_refs, buf_refs = _refs(node, buf)
    sole_node, sole_buf = _sole_refs()
    if node_refs > sole_node or buf_refs > sole_buf:
        return None
    return OPS.buffer_array(buf, t.shape, t.dtype)


def _host_shares(t: Tensor) -> bool:
    """Whether ``t``'s values may reach the host in memory it shares with the device: a device
    whose memory the host addresses, a dtype the host stores as the device does (not bool,
    not bfloat16), a result of ``DIRECT_MIN`` bytes or more (a copy costs less below)."""
    d = t.dtype
    return d.kind != "b" and d.name != "bfloat16" and t.size * d.itemsize >= DIRECT_MIN and \
        t.device.caps.unified_memory


def _refs(node: Node, buf: Any) -> tuple[int, int]:
    """The references to a tensor's load node and to its buffer (``_hand_over``'s)."""
    return sys.getrefcount(node), sys.getrefcount(buf)


_SOLE: list[tuple[int, int]] = []


def _sole_refs() -> tuple[int, int]:
    """``_refs`` of a load node that one tensor holds and of a buffer that only it refers to,
    as counted on such a node of a stand-in buffer."""
    if not _SOLE:
        t = Tensor.__new__(Tensor)  # (the same locals as _hand_over's)
        t._node = ir.load(object(), View.contiguous((1,)), _dt.to_dtype(np.float32))
        node = t._node
        buf, v = node.arg
        _SOLE.append(_refs(node, buf))
    return _SOLE[0]


_TEMP_REFS: dict[str, int] = {}


def _temporary_refs(path: str) -> int:
    """The references a tensor that nothing else holds has when ``np.asarray`` (``path``
    "array"), ``Tensor.get`` ("get") or ``asnumpy`` ("asnumpy") reads it, as measured on an
    object passed through calls of the same shape."""
    n = _TEMP_REFS.get(path)
    if n is None:
        class Probe:
            def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
                _TEMP_REFS["array"] = sys.getrefcount(self)
                return np.zeros(0)

            def get(self) -> None:
                _TEMP_REFS["get"] = sys.getrefcount(self)

        def asnumpy(a: Any) -> None:
            _TEMP_REFS["asnumpy"] = sys.getrefcount(a)

        np.asarray(Probe())
        Probe().get()
        asnumpy(Probe())
        n = _TEMP_REFS[path]
    return n


def _flush_readers(buf: Any, exclude: Tensor | None = None) -> None:
    """Compute every pending tensor that reads ``buf`` (before it is overwritten)."""
    pend = [t for t in pending_tensors()
            if t is not exclude and t._node.resolve().op != "load"]
    todo = [t for t in pend if _reads_buffer(t._node, buf)]
    if todo:
        realize(*todo)


def realize(*tensors: Tensor) -> None:
    """Compute the pending graphs of ``tensors`` together (shared work once, kernels fused
    across outputs where they have one shape)."""
    by_dev: dict[int, list[Tensor]] = {}
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"realize takes tensors, not {type(t).__name__}")
        if t._node.resolve().op != "load":
            by_dev.setdefault(id(t.device), []).append(t)
    for ts in by_dev.values():
        dev = ts[0].device
        targets: list[tuple[Node, Any, View | None]] = []
        finish: list[tuple[Tensor, Node, tuple[int, ...] | None]] = []
        for t in ts:
            # A pure reshape of a computed node: compute the node, reshape its buffer.
            src, shape = _realize.target(t._node.resolve())
            targets.append((src, None, None))
            finish.append((t, src, shape))
        _realize.realize(targets, dev)
        for t, src, shape in finish:
            done = src.resolve()
            if shape is not None:
                buf, v = done.arg
                nv = v.reshape(shape)
                assert nv is not None
                done = ir.load(buf, nv, done.dtype)
                t._node.realized = done
            t._node = done
            _PENDING.pop(id(t), None)


def asnumpy(a: Any, stream: Any = None, order: Literal["C", "F", "A", "K"] = "C",
            out: np.ndarray | None = None) -> np.ndarray:
    """A numpy array of ``a``, as ``cupy.asnumpy``: a tensor is copied to the host
    (``Tensor.get``, with its ``stream``, ``order`` and ``out``); anything else (a numpy array,
    a scalar, nested lists) goes through ``numpy.asarray`` in ``order``, then into ``out``
    where one is given.

    >>> clops.asnumpy(clops.arange(3))
    array([0, 1, 2])
    """
    if isinstance(a, Tensor):
        temporary = sys.getrefcount(a) <= _temporary_refs("asnumpy")  # (before a._get)
        return a._get(stream, order, out, temporary)
    if stream is not None:
        raise ValueError("asnumpy(stream=...) applies to tensors only")
    if order not in ("C", "F", "A", "K"):
        raise ValueError(f"order must be 'C', 'F', 'A' or 'K', not {order!r}")
    host = np.asarray(a, order=order)
    if out is None:
        return host
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, not {type(out).__name__}")
    if out.shape != host.shape:
        raise ValueError(f"out has shape {out.shape}, the array {host.shape}")
    if out.dtype != host.dtype:
        raise TypeError(f"out has dtype {out.dtype}, the array {host.dtype}")
    out[...] = host
    return out
