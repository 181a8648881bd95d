"""Compiler, kernel description: what the scheduler, lowering and the renderer share. A scheduled
``KernelItem`` (nodes and buffers), the structural ``KernelKey`` lowering makes of it (the
program-cache key: everything that shapes the source, no sizes, no buffers) and the named
instructions, leaves and outputs inside that key."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..graph import dtypes
from ..graph.ir import Node, Shape, View


class Temp:
    """A buffer the schedule allocates when it runs (``nbytes`` from the device's pool); until then
    it stands in for the buffer in the graph and in lowered kernels. ``counter``: the device's
    work-group counter of one-kernel split reductions instead of a new buffer."""

    def __init__(self, nbytes: int, label: str, counter: bool = False) -> None:
        self.nbytes = nbytes
        self.label = label
        self.counter = counter

    def __repr__(self) -> str:
        return f"<Temp {self.label} {self.nbytes} bytes>"


@dataclass
class Output:
    node: Node
    buffer: Any  # runtime Buffer, or a Temp of the schedule
    view: View  # where in the buffer (elements), shape == node.shape


@dataclass
class KernelItem:
    """One kernel: iterate ``full`` (rows = index over non-``raxes`` axes), compute the fused
    reductions of each row, then write ``outputs`` (all of one shape: ``full``, or ``full``
    with ``raxes`` set to 1)."""

    full: Shape
    raxes: tuple[int, ...]
    outputs: list[Output]
    # Outputs hold one value per row (decided by the graph's structure, not by sizes).
    reduced_out: bool = False
    # Split reduction: the single fused reduction is computed in ``chunks`` parts per row.
    chunks: int = 1
    # Split reduction of one row into this output, finished in the same kernel: the last
    # work-group to store its part (counted in ``counter``) adds up the parts.
    combine: Output | None = None
    counter: Any = None


def is_expand_back(v: View, src: Node, full: Shape, raxes: tuple[int, ...]) -> bool:
    """Is view ``v`` (over ``src``'s row-major space) the broadcast of a row-level value (shape
    ``full`` with ``raxes`` set to 1) back over the rows of a kernel of shape ``full``?"""
    if v.shape != full or v.offset != 0 or len(src.shape) != len(full):
        return False
    cs = View.contiguous(src.shape).strides
    for a, (n, st) in enumerate(zip(v.shape, v.strides)):
        if a in raxes:
            if src.shape[a] != 1 or (st != 0 and n != 1):
                return False
        elif src.shape[a] != n or (n != 1 and st != cs[a]):
            return False
    return True


def storage_dtype(d: dtypes.DType) -> dtypes.DType:
    """The dtype partial results are kept in (the math type of half and bfloat16)."""
    return dtypes.float32 if d.name in ("float16", "bfloat16") else d


# -- the structural key ---------------------------------------------------------------------------
class Instr(NamedTuple):
    """One SSA instruction of a region. ``out`` is the value it defines (-1 for ``ctx`` and
    ``rowctx``, which open an index context instead). Fields an op does not use keep their
    defaults, so equal instructions are equal tuples (the key hashes them).

    ========  ==============================================================================
    load      ``slot`` (leaf) read at the indices of context ``ctx``, of ``dtype``
    const     constant argument ``slot``, of ``dtype``
    iota      the index of ``axis`` in context ``ctx``, as ``dtype``
    ew        elementwise ``fn`` of values ``srcs`` (their dtypes ``kinds``), to ``dtype``
    cast      value ``srcs[0]`` of dtype ``kinds[0]`` to ``dtype``
    red       the result of reduction ``slot`` (the row's value)
    rowctx    context ``ctx``: the kernel's indices with the reduced axes at 0
    ctx       context ``ctx``: the indices of view ``slot`` (rank ``srank``) at the indices of
              context ``parent`` (rank ``vrank``)
    ========  ==============================================================================
    """

    out: int
    op: str
    dtype: str = ""
    slot: int = -1
    ctx: int = 0
    fn: str = ""
    srcs: tuple[int, ...] = ()
    kinds: tuple[str, ...] = ()
    axis: int = 0
    parent: int = 0
    vrank: int = 0
    srank: int = 0


class Reduction(NamedTuple):
    """A fused reduction: ``op`` over the values ``body`` of ``instrs`` (of dtype ``src``),
    accumulated in dtype ``acc``."""

    op: str
    acc: str
    src: str
    body: int
    instrs: tuple[Instr, ...]


class Leaf(NamedTuple):
    """An input buffer: its dtype, the rank of its view, unit stride on its last axis."""

    dtype: str
    rank: int
    unit_last: bool


class ViewArg(NamedTuple):
    """A non-broadcast view inside the kernel: its rank and its source's rank."""

    rank: int
    src_rank: int


class KernelOutput(NamedTuple):
    """An output: the value stored, its dtype, the rank of its view, unit stride last."""

    value: int
    dtype: str
    rank: int
    unit_last: bool


class Param(NamedTuple):
    """One parameter of a generated kernel: its ``name`` in the source and the ``role`` that
    says what a launch passes (``KernelKey.params``): the buffer or the offset of output or
    leaf ``slot``, its stride along ``axis``, and so on."""

    name: str
    role: str
    slot: int = 0
    axis: int = 0


# Roles of parameters that are buffers; every other role but ``const`` is an index (``int``, or
# ``long`` in ``wide`` kernels)
BUFFER_ROLES = frozenset({"out", "leaf", "count", "fin"})


@dataclass(frozen=True)
class KernelKey:
    """Everything that shapes a generated kernel's source: the program-cache key. Sizes,
    strides, offsets and constant values are launch arguments, so a new shape reuses it."""

    rank: int
    raxes: tuple[int, ...]
    chunked: bool  # stage 1 of a split reduction (a row in ``nchunks`` parts)
    combine: str | None  # the final dtype where the last work-group finishes the row
    reduced_out: bool
    flat: int  # 0: index math; 1: one element per work-item; n: n-wide vectors
    wide: bool  # 64-bit indices
    leaves: tuple[Leaf, ...]
    views: tuple[ViewArg, ...]
    consts: tuple[str, ...]  # dtype names of the constant arguments
    reductions: tuple[Reduction, ...]
    instrs: tuple[Instr, ...]  # the output region
    outputs: tuple[KernelOutput, ...]
    guard: bool  # bounds check on the index (GPUs launch whole work-groups past the end)
    vrow: int  # row kernels: n-wide vector loads along contiguous, aligned rows
    cache: int  # register cache steps per work-item (rows read more than once)
    shfl: bool  # warp shuffles finish the work-group reductions
    col: bool  # a reduction over leading axes, a work-item per output
    # flat kernels: the instructions on n-wide vectors (OpenCL's vector math) instead of per
    # component (see ``vector_math``)
    vmath: bool = False
    # vmath kernels: the functions computed by clops' own vector forms (``OWN_VECTOR_MATH``,
    # ``cl/trig.cl``), not the runtime's
    own_math: tuple[str, ...] = ()
    # CPUs: a column layout's outputs per work-item, a strip along the last axis in float8
    # vectors (0: one output per work-item; see ``lower.column_strip``)
    strip: int = 0
    # CPUs: a serial row over several reduced axes walks its last axis in runs (one unravel
    # per run, not per element)
    runs: bool = False
    # CPUs: serial rows read along their contiguous last axis in n-wide vectors, several
    # vector accumulators (0: scalar accumulators; see ``lower.serial_vector``)
    vser: int = 0
    # CPUs: a work-item reduces a run of adjacent rows, as many as the launch gives it (the rows
    # over the global size; a serial row kernel, not split and not a column layout)
    batch: bool = False

    def params(self) -> tuple[Param, ...]:
        """The kernel's parameters in order: the one place it is written; the renderer declares
        them and a launch passes their values (``realize.launch_args``).

        ===========  ==========================================================================
        out          output ``slot``'s buffer, ``out_offset`` its offset and, unless ``flat``,
                     ``out_stride`` its stride along ``axis``
        leaf         input ``slot``'s buffer, ``leaf_offset``, ``leaf_stride`` (as outputs)
        view_*       view ``slot``: its ``offset``, ``stride`` along ``axis``, its source's
                     ``shape`` and row-major ``pitch`` (the strides that unravel an index)
        const        constant ``slot``
        size         the kernel's size along ``axis`` (unless ``flat``)
        total        the rows of a row kernel, else the work-items
        rn           a row's length (row kernels)
        nchunks      the parts of a split row, ``chunk`` the length of one
        count        the work-group counter, ``fin`` the final buffer and ``fin_offset`` its
                     offset (a split row finished in the same kernel)
        ===========  ==========================================================================
        """
        out: list[Param] = []
        for k, o in enumerate(self.outputs):
            out += [Param(f"out{k}", "out", k), Param(f"oo{k}", "out_offset", k)]
            if not self.flat:
                out += [Param(f"os{k}_{j}", "out_stride", k, j) for j in range(o.rank)]
        for k, leaf in enumerate(self.leaves):
            out += [Param(f"b{k}", "leaf", k), Param(f"o{k}", "leaf_offset", k)]
            if not self.flat:
                out += [Param(f"s{k}_{j}", "leaf_stride", k, j) for j in range(leaf.rank)]
        for v, view in enumerate(self.views):
            out.append(Param(f"vo{v}", "view_offset", v))
            out += [Param(f"vs{v}_{j}", "view_stride", v, j) for j in range(view.rank)]
            out += [Param(f"vq{v}_{d}", "view_shape", v, d) for d in range(view.src_rank)]
            out += [Param(f"vp{v}_{d}", "view_pitch", v, d) for d in range(view.src_rank)]
        out += [Param(f"c{k}", "const", k) for k in range(len(self.consts))]
        if not self.flat:
            out += [Param(f"n{j}", "size", 0, j) for j in range(self.rank)]
        out.append(Param("total", "total"))
        if self.raxes:
            out.append(Param("rn", "rn"))
        if self.chunked:
            out += [Param("nchunks", "nchunks"), Param("chunk", "chunk")]
        if self.combine is not None:
            out += [Param("count", "count"), Param("fin", "fin"), Param("fo", "fin_offset")]
        return tuple(out)

    def dtype_names(self) -> set[str]:
        """Every dtype the kernel touches (a float64 one needs the fp64 extension)."""
        names = {x.dtype for x in self.leaves} | set(self.consts)
        names |= {o.dtype for o in self.outputs}
        if self.combine is not None:
            names.add(self.combine)
        for r in self.reductions:
            names |= {r.acc, r.src}
        for ins in (*self.instrs, *(i for r in self.reductions for i in r.instrs)):
            names.add(ins.dtype)
            names.update(ins.kinds)
        return names


@dataclass
class Lowered:
    """A lowered kernel: its ``key`` (everything that shapes the source) and the runtime values
    of its launch, in argument order (buffers may be the schedule's ``Temp``s)."""

    key: KernelKey
    leaf_buffers: list[Any] = field(default_factory=list)
    leaf_views: list[View] = field(default_factory=list)
    view_args: list[tuple[View, tuple[int, ...]]] = field(default_factory=list)
    const_values: list[tuple[Any, dtypes.DType]] = field(default_factory=list)
    out_buffers: list[Any] = field(default_factory=list)
    out_views: list[View] = field(default_factory=list)
    full: tuple[int, ...] = ()
    raxes: tuple[int, ...] = ()
    chunks: int = 1
    flat: int = 0  # 0: index math; 1: one element per work-item; n: n-wide vectors
    vrow: int = 0  # row kernels: n-wide vector loads along contiguous, aligned rows
    wide: bool = False
    names: list[str] = field(default_factory=list)
    # one-kernel split reductions: (counter, final buffer, final view)
    combine: tuple[Any, Any, View] | None = None
    col: bool = False  # a reduction over leading axes, a work-item per output
    strip: int = 0  # CPUs' column layout: outputs per work-item (0: one)
    batch: bool = False  # CPUs' serial rows: a run of rows per work-item (``KernelKey.batch``)

    @property
    def reads(self) -> list[Any]:
        return list(self.leaf_buffers)

    @property
    def writes(self) -> list[Any]:
        extra = [self.combine[0], self.combine[1]] if self.combine is not None else []
        return list(self.out_buffers) + extra


# Float operations that are exact on n-wide vectors as on scalars (IEEE arithmetic, no
# contraction), and float functions a CPU runtime may compute faster on vectors, used so only
# where the runtime's vector form agrees with its scalar form (``runtime.probes``).
# PERF (PoCL 3.1, 2-core EPYC, 4M float32): scalar sin 29 ms, log 23 ms (one call per element,
# not vectorized); on float16 vectors log 0.9 ms. Exp and arithmetic are vectorized either way.
VECTOR_ARITHMETIC = frozenset({"add", "subtract", "multiply", "negative", "positive", "abs",
                               "square"})
VECTOR_MATH = frozenset({"sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                         "asinh", "acosh", "atanh", "expm1", "log", "log1p", "log2", "log10",
                         "atan2", "pow", "hypot"})
# Functions clops computes on vectors itself (``cl/trig.cl``: range reduction and polynomials,
# right for every float32), used where the runtime's vector form disagrees with its scalar one.
# PERF (sin of 4M float32, 2-core EPYC, AVX2): PoCL 3.1 scalar 76 ms a call, clops' own on
# float8 vectors 1.6 ms a kernel; Intel's runtime: its own vector sin 1.2-1.3 ms, clops' 1.4
# (cos and tan alike), so it keeps its own.
# And pow (``cl/pow.cl``: in float64), where faster than the runtime's (``geometry.OWN_FASTER``).
OWN_VECTOR_MATH = frozenset({"sin", "cos", "tan", "pow"})


def vector_math(instrs: tuple[Instr, ...], leaves: tuple[Leaf, ...],
                outputs: tuple[KernelOutput, ...], agrees: Callable[[str], bool]) -> bool:
    """Whether a flat kernel is float32 loads, constants, ``VECTOR_ARITHMETIC`` and
    ``VECTOR_MATH`` functions alone, at least one of the latter, each of which ``agrees``
    (so that it can run on n-wide vectors, the runtime's or clops' own, with right values)."""
    fns = set()
    for ins in instrs:
        if ins.op in ("load", "const"):
            if ins.dtype != "float32" or (ins.op == "load" and ins.ctx != 0):
                return False
        elif ins.op == "ew":
            if ins.dtype != "float32" or any(k != "float32" for k in ins.kinds):
                return False
            if ins.fn in VECTOR_MATH:
                fns.add(ins.fn)
            elif ins.fn not in VECTOR_ARITHMETIC:
                return False
        else:
            return False
    return bool(fns) and all(x.dtype == "float32" for x in leaves) and \
        all(o.dtype == "float32" for o in outputs) and all(agrees(f) for f in sorted(fns))
