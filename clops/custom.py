"""Custom kernels: OpenCL C from Python, launched on clops tensors with dependency tracking,
and builders of elementwise, reduction and scan kernels from C expressions.

Argument convention of ``clops.kernel``: every ``Tensor`` argument fills TWO kernel
parameters, its buffer and its element offset: ``__global T *x, long x_off`` (the offset's type
is whatever integer type the kernel declares). Strides are the kernel's business; pass
``t.strides`` as scalars if it needs them. A ``Buffer`` or pyopencl buffer fills one pointer
parameter, ``clops.local_memory(nbytes)`` one ``__local`` parameter, and a Python or numpy
scalar one scalar parameter, converted to the type the kernel declares.

Tracking: a tensor passed to a ``__global const`` parameter counts as read, any other as read
and written; ``reads=``/``writes=`` override that (arguments named in neither count as read).
``#include "clops/philox.cl"`` pulls in the Philox counter-based RNG (see ``clops.random``).

Bounds: ``per_work_item={"x": 1}`` (to ``clops.kernel`` or a launch) declares how many elements
of an argument each work-item reaches; clops then refuses a global size that would reach past
the argument's end, before enqueueing (see ``kernel``)."""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import runtime
from .array.tensor import Tensor, _flush_readers
from .graph import dtypes as _dt
from .graph import ir
from .graph.ir import View
from .kernels.launch import expand_includes
from .runtime import cltypes, interop, streams

# OpenCL C scalar types -> numpy.
_SCALARS = {
    "char": np.int8, "uchar": np.uint8, "unsigned char": np.uint8, "short": np.int16,
    "ushort": np.uint16, "unsigned short": np.uint16, "int": np.int32, "uint": np.uint32,
    "unsigned int": np.uint32, "unsigned": np.uint32, "long": np.int64, "ulong": np.uint64,
    "unsigned long": np.uint64, "size_t": np.uint64, "ptrdiff_t": np.int64,
    "float": np.float32, "double": np.float64, "half": np.float16,
}
_QUALIFIERS = {"__global", "global", "__local", "local", "__constant", "constant", "__private",
               "private", "const", "restrict", "__restrict", "volatile", "__read_only",
               "__write_only", "read_only", "write_only"}


@dataclass(frozen=True)
class Param:
    """One kernel parameter as declared."""

    name: str
    type: str  # base type, qualifiers removed ("float", "uint")
    pointer: bool
    space: str  # "global" | "local" | "constant" | "private"
    const: bool

    @property
    def np_type(self) -> Any:
        return _SCALARS.get(self.type)


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)




def parse_params(decl: str) -> list[Param]:
    """Parameters of a C parameter list.

    >>> [p.name for p in parse_params("__global const float *x, float a")]
    ['x', 'a']
    """
    out = []
    depth, cur, parts = 0, "", []
    for ch in decl:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    for part in parts:
        text = part.strip()
        if not text or text == "void":
            continue
        m = re.match(r"(.*?)([A-Za-z_]\w*)\s*(\[\s*\])?$", text, re.S)
        if m is None:
            raise ValueError(f"cannot read kernel parameter {text!r}")
        head, name = m.group(1), m.group(2)
        pointer = "*" in head or m.group(3) is not None
        words = re.findall(r"[A-Za-z_]\w*", head)
        space = "private"
        for w in words:
            if w.lstrip("_") in ("global", "local", "constant"):
                space = w.lstrip("_")
        if "*" in head:  # ``const float *p`` points at constant data; ``float *const p`` not
            const = "const" in words and head.find("const") < head.find("*")
        else:
            const = "const" in words
        base = " ".join(w for w in words if w not in _QUALIFIERS)
        out.append(Param(name, base, pointer, space, bool(const)))
    return out


def kernel_params(source: str, name: str) -> list[Param]:
    """The parameters of kernel ``name`` in ``source``."""
    src = _strip_comments(source)
    m = re.search(r"(?:__kernel|\bkernel)\s+(?:__attribute__\s*\(\(.*?\)\)\s*)?void\s+"
                  + re.escape(name) + r"\s*\(", src, re.S)
    if m is None:
        raise ValueError(f"no kernel named {name!r} in the source")
    i, depth = m.end(), 1
    j = i
    while depth and j < len(src):
        depth += {"(": 1, ")": -1}.get(src[j], 0)
        j += 1
    return parse_params(src[i:j - 1])


def element_bytes(c_type: str) -> int | None:
    """Bytes of one element of OpenCL C type ``c_type`` ("float", "uint4"; a 3-vector takes
    the room of a 4-vector); None for a type clops cannot size (a struct, an image).

    >>> element_bytes("float4"), element_bytes("uchar")
    (16, 1)
    """
    m = re.fullmatch(r"([a-z ]+?)(2|3|4|8|16)?", c_type)
    scalar = _SCALARS.get(m.group(1)) if m else None
    if m is None or scalar is None:
        return None
    lanes = int(m.group(2) or 1)
    return int(np.dtype(scalar).itemsize) * (4 if lanes == 3 else lanes)


def _scalar(value: Any, p: Param) -> Any:
    t = p.np_type
    if t is None:
        if isinstance(value, np.generic | np.ndarray):
            return value  # a vector or struct type: the caller gives the exact bytes
        raise TypeError(f"parameter {p.name} has type {p.type}: pass a numpy value of that "
                        "layout (clops converts only scalar types)")
    if isinstance(value, Tensor):
        raise TypeError(f"parameter {p.name} is a scalar {p.type}, got a Tensor")
    return t(value)


class CustomKernel:
    """An OpenCL C kernel launched on clops tensors (see the module docstring for the argument
    convention). Built once per device, on first launch.

    >>> k = clops.kernel('''
    ... __kernel void axpy(float a, __global const float *x, long xo, __global float *y, long yo)
    ... { size_t i = get_global_id(0); y[yo + i] += a * x[xo + i]; }''', "axpy")
    >>> ev = k(x.size, None, 2.0, x, y)       # y += 2 x, after whatever last wrote x and y
    """

    def __init__(self, source: str, name: str, options: Sequence[str] = (), *,
                 per_work_item: Mapping[str, int] | None = None) -> None:
        self.source = expand_includes(source)
        self.name = name
        self.options = tuple(options)
        self.params = kernel_params(self.source, name)
        self.per_work_item = self._checked_extents(per_work_item or {})

    def _checked_extents(self, per_work_item: Mapping[str, int]) -> dict[str, int]:
        """``per_work_item`` checked against the parameters: global pointers, whole counts."""
        by_name = {p.name: p for p in self.params}
        out = {}
        for pname, k in per_work_item.items():
            p = by_name.get(pname)
            if p is None or not p.pointer or p.space not in ("global", "constant"):
                pointers = [q.name for q in self.params
                            if q.pointer and q.space in ("global", "constant")]
                raise ValueError(f"{self.name}: per_work_item names {pname!r}, which is not a "
                                 f"__global pointer parameter of the kernel ({pointers})")
            if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
                raise ValueError(f"{self.name}: per_work_item[{pname!r}] = {k!r}, expected a "
                                 "whole number >= 1 of elements each work-item reaches")
            if element_bytes(p.type) is None:
                raise ValueError(f"{self.name}: per_work_item[{pname!r}]: the size of "
                                 f"{p.type} is unknown, so its extent cannot be checked")
            out[pname] = int(k)
        return out

    def _extent(self, p: Param, a: Any) -> tuple[int, str] | None:
        """(elements, how counted) that argument ``a`` of pointer parameter ``p`` holds from
        where the kernel's index starts, or None where clops cannot tell (an object without
        a byte size)."""
        if isinstance(a, Tensor):
            return a.size, f"a Tensor of {a.size} elements"
        if a is None:
            return 0, "a null pointer"
        nbytes = a.nbytes if isinstance(a, runtime.Buffer) else getattr(a, "size", None)
        eb = element_bytes(p.type)
        if not isinstance(nbytes, int) or eb is None:
            return None
        return nbytes // eb, f"a buffer of {nbytes} bytes, {nbytes // eb} {p.type}s"

    def _check_extents(self, args: Sequence[Any], global_size: tuple[int, ...],
                       declared: Mapping[str, int]) -> None:
        """ValueError before enqueueing when a declared argument is smaller than the launch
        reaches: past a buffer's end a kernel reads garbage, corrupts other memory, or takes
        the driver down with the process (Intel's CPU runtime)."""
        items = 1
        for g in global_size:
            items *= g
        pi = 0
        for a in args:
            p = self.params[pi]
            k = declared.get(p.name)
            if k is not None:
                have = self._extent(p, a)
                if have is not None and items * k > have[0]:
                    most = have[0] // k
                    raise ValueError(
                        f"{self.name}: argument {p.name} is {have[1]}, but global size "
                        f"{global_size} ({items} work-items, {k} element{'s' * (k > 1)} "
                        f"each, as per_work_item declares) reaches {items * k}; launch at "
                        f"most {most} work-items or pass a larger {p.name}")
            pi += 2 if isinstance(a, Tensor) else 1

    def _bind(self, args: Sequence[Any]) -> tuple[list[Any], list[tuple[Any, bool]], list[Any]]:
        """Kernel arguments, tracked (buffer, const) pairs, and the tensors among the args."""
        params = self.params
        out: list[Any] = []
        tracked: list[tuple[Any, bool]] = []
        tensors: list[Any] = []
        pi = 0
        for ai, a in enumerate(args):
            if pi >= len(params):
                raise TypeError(self._arity_error(args, f"argument {ai} has no parameter left"))
            p = params[pi]
            if isinstance(a, Tensor):
                if not p.pointer or p.space not in ("global", "constant"):
                    raise TypeError(f"{self.name}: a Tensor (argument {ai}) goes to a __global "
                                    f"pointer and an offset, but parameter {p.name} is "
                                    f"{p.type}{' *' if p.pointer else ''}")
                if pi + 1 >= len(params) or params[pi + 1].pointer or \
                        params[pi + 1].np_type is None or params[pi + 1].type in ("float",
                                                                                  "double",
                                                                                  "half"):
                    raise TypeError(f"{self.name}: Tensor argument {ai} needs an integer offset "
                                    f"parameter after {p.name} (e.g. 'long {p.name}_off')")
                buf = a.buffer
                out += [buf, params[pi + 1].np_type(a.offset)]
                tracked.append((buf, p.const or p.space == "constant"))
                tensors.append(a)
                pi += 2
                continue
            if isinstance(a, runtime.Buffer):
                if not p.pointer:
                    raise TypeError(f"{self.name}: a Buffer goes to a pointer parameter, "
                                    f"{p.name} is {p.type}")
                out.append(a)
                tracked.append((a, p.const or p.space == "constant"))
            elif interop.is_local_memory(a) or interop.is_cl_buffer(a) or a is None:
                out.append(a)
            else:
                if p.pointer:
                    raise TypeError(f"{self.name}: parameter {p.name} is a pointer; pass a "
                                    f"Tensor or Buffer, not {type(a).__name__}")
                out.append(_scalar(a, p))
            pi += 1
        if pi != len(params):
            raise TypeError(self._arity_error(args, f"parameters from {params[pi].name} on "
                                                    "were not given"))
        return out, tracked, tensors

    def _arity_error(self, args: Sequence[Any], why: str) -> str:
        sig = ", ".join(f"{p.type}{' *' if p.pointer else ''} {p.name}" for p in self.params)
        return (f"{self.name}({sig}): {why}; got {len(args)} arguments (each Tensor fills two "
                "parameters: the pointer and its offset)")

    def __call__(self, global_size: int | Sequence[int], local_size: int | Sequence[int] | None,
                 *args: Any, wait_for: Sequence[Any] = (), depends: Sequence[Any] = (),
                 reads: Sequence[Any] | None = None, writes: Sequence[Any] | None = None,
                 queue: runtime.CLQueue | None = None, device: Any = None,
                 name: str | None = None, per_work_item: Mapping[str, int] | None = None
                 ) -> runtime.Event:
        """Enqueue the kernel; returns its event (``depends`` is an alias of ``wait_for``).
        ``per_work_item`` declares, for this launch, what the kernel's own declaration does
        (see :func:`kernel`); the arguments it names are checked before anything is enqueued.
        """
        cl_args, tracked, tensors = self._bind(args)
        gsize = (global_size,) if isinstance(global_size, int | np.integer) else global_size
        gsize = tuple(int(g) for g in gsize)
        declared = self.per_work_item if per_work_item is None else \
            {**self.per_work_item, **self._checked_extents(per_work_item)}
        if declared:
            self._check_extents(args, gsize, declared)
        dev = _device_of(tensors, device, queue, self.name)
        q = queue or streams.current_queue(dev)
        if reads is None and writes is None:
            r_bufs = [b for b, const in tracked if const]
            w_bufs = [b for b, const in tracked if not const]
        else:
            w_bufs = [_as_buffer(x) for x in (writes or ())]
            r_bufs = [_as_buffer(x) for x in (reads or ())]
            named = {id(b) for b in w_bufs + r_bufs}
            r_bufs += [b for b, _ in tracked if id(b) not in named]
        w_bufs = _unique(w_bufs)
        wids = {id(b) for b in w_bufs}
        r_bufs = [b for b in _unique(r_bufs) if id(b) not in wids]
        for b in w_bufs:
            _flush_readers(b)  # lazy tensors that read the old contents are computed first
        lsize = (local_size,) if isinstance(local_size, int | np.integer) else local_size
        k = dev.kernel(self.source, self.name, self.options)
        return dev.launch(k, gsize,
                          tuple(int(x) for x in lsize) if lsize is not None else None,
                          cl_args, reads=r_bufs, writes=w_bufs, queue=q,
                          wait_for=interop.wait_list([*wait_for, *depends]),
                          name=name or self.name)

    def __repr__(self) -> str:
        return f"<clops.CustomKernel {self.name} ({len(self.params)} parameters)>"


def _as_buffer(x: Any) -> runtime.Buffer:
    if isinstance(x, Tensor):
        return x.buffer
    if isinstance(x, runtime.Buffer):
        return x
    raise TypeError(f"reads/writes take Tensors or Buffers, not {type(x).__name__}")


def _unique(bufs: list[Any]) -> list[Any]:
    seen: set[int] = set()
    out = []
    for b in bufs:
        if id(b) not in seen:
            seen.add(id(b))
            out.append(b)
    return out


def _device_of(tensors: Sequence[Tensor], device: Any, queue: Any, what: str) -> Any:
    dev = None
    if tensors:
        dev = tensors[0].device
        for t in tensors[1:]:
            if t.device is not dev:
                raise ValueError(f"{what}: tensors are on different devices ({dev} and "
                                 f"{t.device}); move one with .to_device()")
    for other in (runtime.device(device) if device is not None else None,
                  queue.device if queue is not None else None):
        if other is not None:
            if dev is not None and other is not dev:
                raise ValueError(f"{what}: tensors are on {dev}, but {other} was asked for")
            dev = other
    return dev if dev is not None else runtime.device()


def kernel(source: str, name: str, options: Sequence[str] = (), *,
           per_work_item: Mapping[str, int] | None = None) -> CustomKernel:
    """A custom kernel from OpenCL C (built per device on first launch).

    clops cannot see which elements a kernel indexes, so a launch whose global size reaches
    past an argument's end is enqueued as given (and can crash the driver). ``per_work_item``
    declares the access pattern so that clops checks it: ``{"x": k}`` says each work-item
    reaches ``k`` elements of pointer parameter ``x`` from its offset on (``x[xo + i]`` is
    ``k = 1``; ``x[xo + 4*i + j]``, ``j < 4``, is ``k = 4``), so the argument must hold at
    least ``k`` x (the product of the global size) elements: a Tensor its ``size`` (from its
    offset on), a Buffer or pyopencl buffer its bytes over the size of the pointer's type
    (from its start: an offset given as a separate scalar is the kernel's business). A launch
    that asks for more raises ``ValueError`` naming the argument, its size and the global
    size, before anything is enqueued. Parameters not named are not checked; a launch may also
    pass ``per_work_item=`` for itself.

    >>> k = clops.kernel("__kernel void fill(__global float *x, long o, float v)"
    ...                  "{ x[o + get_global_id(0)] = v; }", "fill", per_work_item={"x": 1})
    >>> x = clops.empty(8); k(8, None, x, 3.0).wait()
    >>> k(9, None, x, 3.0)
    Traceback (most recent call last):
    ValueError: fill: argument x is a Tensor of 8 elements, but global size (9,) ...
    """
    return CustomKernel(source, name, options, per_work_item=per_work_item)


# -- builders --------------------------------------------------------------------------------------
def _expand_pointer_params(arguments: str) -> tuple[list[Param], str, str]:
    """User parameters -> (params, parameter list with base+offset per pointer, prologue that
    makes each pointer name point at its first element)."""
    params = parse_params(arguments)
    decl, prologue = [], []
    for p in params:
        if p.name == "n" or p.name == "i":
            raise ValueError("'n' and 'i' are reserved in generated kernels (length, index)")
        if p.pointer:
            if p.space != "global":
                raise ValueError(f"builder argument {p.name}: only __global pointers")
            c = "const " if p.const else ""
            decl.append(f"__global {c}{p.type} *{p.name}__base, long {p.name}__off")
            prologue.append(f"    __global {c}{p.type} *{p.name} = {p.name}__base + "
                            f"{p.name}__off;")
        else:
            decl.append(f"{p.type} {p.name}")
    return params, ", ".join(decl), "\n".join(prologue)


def _work_size(dev: Any, n: int) -> tuple[int, int | None]:
    """Global size (grid-stride loops cover the rest) and local size for ``n`` items."""
    cu = dev.caps.compute_units
    if dev.kind == "cpu":
        return max(1, min(n, cu * 64)), None
    L = min(256, dev.caps.max_work_group)
    groups = max(1, min(-(-n // L), cu * 16))
    return groups * L, L


def _bind(params: Any, args: Sequence[Any], n: int | None, device: Any,
          queue: runtime.CLQueue | None, name: str) -> tuple[list[Any], int, Any]:
    """A builder call's arguments checked against its parameters, the element count and the
    device they run on."""
    targs = _tensor_args(params, args, name)
    count = _length(params, targs, n, name)
    tensors = [a for a in targs if isinstance(a, Tensor)]
    return targs, count, _device_of(tensors, device, queue, name)


def _tensor_args(params: list[Param], args: Sequence[Any], what: str) -> list[Any]:
    if len(args) != len(params):
        names = ", ".join(p.name for p in params)
        raise TypeError(f"{what} takes {len(params)} arguments ({names}), got {len(args)}")
    out = []
    for p, a in zip(params, args):
        if p.pointer:
            if not isinstance(a, Tensor):
                raise TypeError(f"{what}: argument {p.name} must be a Tensor")
            if not a.is_contiguous:
                if not p.const:
                    raise ValueError(f"{what}: {p.name} is written and must be contiguous")
                a = a.contiguous()
        out.append(a)
    return out


def _length(params: list[Param], args: Sequence[Any], n: int | None, what: str) -> int:
    sizes = {p.name: int(a.size) for p, a in zip(params, args) if p.pointer}
    if n is None:
        if sizes:
            # NOTE: the largest, so that 0-d scalars on the device may come first
            return max(sizes.values())
        raise TypeError(f"{what}: no tensor argument to take the length from; pass n=")
    try:
        count = operator.index(n)
    except TypeError:
        raise TypeError(f"{what}: n must be an integer, not {type(n).__name__}") from None
    if count < 0:
        raise ValueError(f"{what}: n must be >= 0, got {count}")
    # The kernel indexes its tensors with i < n: past the largest one it reads and writes
    # outside every buffer (a crash, or garbage results).
    if sizes and count > max(sizes.values()):
        listed = ", ".join(f"{k} has {v}" for k, v in sizes.items())
        raise ValueError(f"{what}: n={count} is larger than its tensor arguments ({listed} "
                         "elements); n may not exceed the largest")
    if count > 2**63 - 1:
        raise ValueError(f"{what}: n={count} does not fit the kernel's long n")
    return count


class ElementwiseKernel:
    """A kernel that runs a C statement for every index ``i`` < ``n`` (``n`` is the size of the
    largest tensor argument unless given). Pointer arguments are contiguous tensors, indexed
    from their first element.

    >>> lin = clops.ElementwiseKernel("float a, __global const float *x, __global float *y",
    ...                               "y[i] = a * x[i] + y[i]", "axpy")
    >>> ev = lin(2.0, x, y)
    """

    def __init__(self, arguments: str, operation: str, name: str = "elementwise",
                 preamble: str = "", options: Sequence[str] = ()) -> None:
        self.params, decl, prologue = _expand_pointer_params(arguments)
        self.name = name
        src = (f"{preamble}\n__kernel void {name}({decl}, long n) {{\n{prologue}\n"
               f"    for (long i = get_global_id(0); i < n; i += get_global_size(0)) {{\n"
               f"        {operation};\n    }}\n}}\n")
        self.kernel = CustomKernel(src, name, options)

    def __call__(self, *args: Any, n: int | None = None, wait_for: Sequence[Any] = (),
                 depends: Sequence[Any] = (), queue: runtime.CLQueue | None = None,
                 device: Any = None) -> runtime.Event:
        targs, count, dev = _bind(self.params, args, n, device, queue, self.name)
        if count == 0:
            return runtime.Event(None, queue)
        g, local = _work_size(dev, count)
        return self.kernel(g, local, *targs, np.int64(count), wait_for=[*wait_for, *depends],
                           queue=queue, device=dev)


def _c_type(dtype: Any) -> _dt.DType:
    d = _dt.BY_NAME.get(dtype) if isinstance(dtype, str) and dtype in _dt.BY_NAME else None
    if d is None and isinstance(dtype, str):
        inv = {v: k for k, v in _SCALARS.items()}
        if dtype in _SCALARS:
            d = _dt.to_dtype(np.dtype(_SCALARS[dtype]))
        elif dtype in inv:
            d = _dt.to_dtype(np.dtype(dtype))
    if d is None:
        d = _dt.to_dtype(dtype)
    if cltypes.storage(d) != cltypes.math(d) or d.kind in "cb":
        raise TypeError(f"builders compute in {d}'s storage type; use a type OpenCL C computes "
                        "in directly (int32, int64, uint32, float32, float64, ...)")
    return d


class ReductionKernel:
    """Reduce ``map_expr`` (a C expression of ``i`` and the arguments) over ``i`` < ``n`` with
    ``reduce_expr`` (of ``a`` and ``b``, associative, with ``neutral``) into a 0-d tensor.

    >>> dot = clops.ReductionKernel("float", "0", "a + b", "x[i] * y[i]",
    ...                             "__global const float *x, __global const float *y")
    >>> dot(x, y)          # a 0-d Tensor, computed on the device
    """

    def __init__(self, dtype_out: Any, neutral: str, reduce_expr: str, map_expr: str,
                 arguments: str, name: str = "reduce", preamble: str = "",
                 options: Sequence[str] = ()) -> None:
        self.dtype = _c_type(dtype_out)
        self.params, decl, prologue = _expand_pointer_params(arguments)
        self.name = name
        T = cltypes.storage(self.dtype)
        common = (f"{preamble}\n"
                  f"inline {T} {name}__reduce({T} a, {T} b) {{ return ({reduce_expr}); }}\n")
        tree = (f"    __local {T} scratch__[GROUP_SIZE];\n"
                "    int lid = get_local_id(0);\n"
                "    scratch__[lid] = acc;\n    barrier(CLK_LOCAL_MEM_FENCE);\n"
                "    for (int s = GROUP_SIZE / 2; s > 0; s >>= 1) {\n"
                f"        if (lid < s) scratch__[lid] = {name}__reduce(scratch__[lid], "
                "scratch__[lid + s]);\n"
                "        barrier(CLK_LOCAL_MEM_FENCE);\n    }\n")
        loop = ("#if CHUNKED\n"
                "    long chunk = (n + get_global_size(0) - 1) / get_global_size(0);\n"
                "    long lo = get_global_id(0) * chunk, hi = min(n, lo + chunk);\n"
                "    for (long i = lo; i < hi; i++) {\n"
                "#else\n"
                "    for (long i = get_global_id(0); i < n; i += get_global_size(0)) {\n"
                "#endif\n")
        self.source = (
            common
            + f"__kernel void {name}_stage1({decl}, long n, __global {T} *partial__, "
              "long partial_off__) {\n"
            + prologue + f"\n    {T} acc = ({T})({neutral});\n" + loop
            + f"        acc = {name}__reduce(acc, ({T})({map_expr}));\n    }}\n" + tree
            + "    if (lid == 0) partial__[partial_off__ + get_group_id(0)] = scratch__[0];\n}\n"
            + f"__kernel void {name}_stage2(__global const {T} *x, long x_off, long n, "
              f"__global {T} *out__, long out_off__) {{\n"
            + f"    x += x_off;\n    {T} acc = ({T})({neutral});\n" + loop
            + f"        acc = {name}__reduce(acc, x[i]);\n    }}\n" + tree
            + "    if (lid == 0) out__[out_off__] = scratch__[0];\n}\n")
        self.options = tuple(options)
        self._by_options: dict[tuple[str, ...], tuple[CustomKernel, CustomKernel]] = {}

    def _stages(self, opts: tuple[str, ...]) -> tuple[CustomKernel, CustomKernel]:
        ks = self._by_options.get(opts)
        if ks is None:
            ks = self._by_options[opts] = (
                CustomKernel(self.source, f"{self.name}_stage1", opts),
                CustomKernel(self.source, f"{self.name}_stage2", opts))
        return ks

    def __call__(self, *args: Any, n: int | None = None, wait_for: Sequence[Any] = (),
                 depends: Sequence[Any] = (), queue: runtime.CLQueue | None = None,
                 device: Any = None, return_event: bool = False) -> Any:
        targs, count, dev = _bind(self.params, args, n, device, queue, self.name)
        cpu = dev.kind == "cpu"
        L = 1 if cpu else 1 << (min(256, dev.caps.max_work_group).bit_length() - 1)
        opts = (*self.options, f"-DGROUP_SIZE={L}", f"-DCHUNKED={int(cpu)}")
        groups = max(1, min(-(-count // L), dev.caps.compute_units * (8 if cpu else 16)))
        d = self.dtype
        partial = _new_tensor(dev, (groups,), d)
        out = _new_tensor(dev, (), d)
        s1, s2 = self._stages(opts)
        s1(groups * L, L, *targs, np.int64(count), partial, wait_for=[*wait_for, *depends],
           queue=queue, device=dev)
        ev = s2(L, L, partial, np.int64(groups), out, queue=queue, device=dev)
        return (out, ev) if return_event else out


def _new_tensor(dev: Any, shape: tuple[int, ...], d: _dt.DType) -> Tensor:
    buf = dev.alloc(max(1, ir.prod(shape)) * d.itemsize)
    return Tensor(ir.load(buf, View.contiguous(shape), d), dev)


class ScanKernel:
    """A prefix scan: ``item`` is ``scan_expr`` (of ``a`` and ``b``, associative, with
    ``neutral``) over ``input_expr`` for indices 0..``i`` inclusive, ``prev_item`` the same
    exclusive; ``output_statement`` stores them (in the spirit of PyOpenCL's
    ``GenericScanKernel``).

    >>> cumsum = clops.ScanKernel("float", "__global const float *x, __global float *y",
    ...                           "x[i]", "a + b", "y[i] = item", "0")
    >>> ev = cumsum(x, y)
    """

    def __init__(self, dtype: Any, arguments: str, input_expr: str, scan_expr: str,
                 output_statement: str, neutral: str, name: str = "scan", preamble: str = "",
                 options: Sequence[str] = ()) -> None:
        self.dtype = _c_type(dtype)
        self.params, decl, prologue = _expand_pointer_params(arguments)
        self.name = name
        T = cltypes.storage(self.dtype)
        # PERF: each work-item scans one contiguous chunk serially (three passes: chunk totals,
        # a serial scan of the totals, the chunks again from their offsets). Simple and exact
        # on every device; a work-group scan would be faster on GPUs.
        chunk = ("    long chunk = (n + get_global_size(0) - 1) / get_global_size(0);\n"
                 "    long lo = get_global_id(0) * chunk, hi = min(n, lo + chunk);\n")
        self.source = (
            f"{preamble}\n"
            f"inline {T} {name}__scan({T} a, {T} b) {{ return ({scan_expr}); }}\n"
            f"__kernel void {name}_totals({decl}, long n, __global {T} *totals__, long t_off) {{\n"
            f"{prologue}\n{chunk}    {T} acc = ({T})({neutral});\n"
            f"    for (long i = lo; i < hi; i++) acc = {name}__scan(acc, ({T})({input_expr}));\n"
            "    totals__[t_off + get_global_id(0)] = acc;\n}\n"
            f"__kernel void {name}_offsets(__global {T} *totals__, long t_off, long m) {{\n"
            f"    totals__ += t_off;\n    {T} run = ({T})({neutral});\n"
            f"    for (long g = 0; g < m; g++) {{ {T} t = totals__[g]; totals__[g] = run; "
            f"run = {name}__scan(run, t); }}\n}}\n"
            f"__kernel void {name}_final({decl}, long n, __global const {T} *totals__, "
            "long t_off) {\n"
            f"{prologue}\n{chunk}    {T} prev_item = totals__[t_off + get_global_id(0)];\n"
            f"    for (long i = lo; i < hi; i++) {{\n"
            f"        {T} item = {name}__scan(prev_item, ({T})({input_expr}));\n"
            f"        {output_statement};\n        prev_item = item;\n    }}\n}}\n")
        self.kernels = tuple(CustomKernel(self.source, f"{name}_{part}", options)
                             for part in ("totals", "offsets", "final"))

    def __call__(self, *args: Any, n: int | None = None, wait_for: Sequence[Any] = (),
                 depends: Sequence[Any] = (), queue: runtime.CLQueue | None = None,
                 device: Any = None) -> runtime.Event:
        targs, count, dev = _bind(self.params, args, n, device, queue, self.name)
        if count == 0:
            return runtime.Event(None, queue)
        cu = dev.caps.compute_units
        groups = max(1, min(count, cu * 4 if dev.kind == "cpu" else cu * 64))
        totals = _new_tensor(dev, (groups,), self.dtype)
        k1, k2, k3 = self.kernels
        k1(groups, None, *targs, np.int64(count), totals, wait_for=[*wait_for, *depends],
           reads=[a for a in targs if isinstance(a, Tensor)], writes=[totals], queue=queue,
           device=dev)
        k2(1, None, totals, np.int64(groups), queue=queue, device=dev)
        return k3(groups, None, *targs, np.int64(count), totals, queue=queue, device=dev)
