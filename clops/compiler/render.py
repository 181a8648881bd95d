"""Compiler, renderer: structural kernels (a ``KernelKey`` from lowering) to OpenCL C source.
The backend seam: the language's spellings are class attributes of ``CLRenderer`` (types, the
elementwise and reduction tables, the prelude file, index and barrier spellings); a renderer
for another language subclasses it and changes those and the few methods that spell loads,
stores and casts. A renderer holds no state: each render is a ``_KernelSource`` of its own, made
for that call, so one renderer serves every thread and a render is a function of its key."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ..graph import dtypes
from ..runtime import cltypes
from . import cl_ops
from .kernel import Instr, KernelKey, KernelOutput, Leaf, Param, Reduction

RENDER_STATS = {"renders": 0}
_STATS_LOCK = threading.Lock()

# NVIDIA warp shuffles (inline PTX), by accumulator type; only rendered for devices whose
# capability probe found inline PTX (the local-memory tree is the portable finish).
SHFL_FUNCS = {"float": "clops_shfl_xor_f", "int": "clops_shfl_xor_i", "uint": "clops_shfl_xor_u"}
SHFL_HELPERS = """
inline uint clops_shfl_xor_u(uint v, int o) {
    uint t;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(t) : "r"(v), "r"(o));
    return t;
}
inline int clops_shfl_xor_i(int v, int o) { return as_int(clops_shfl_xor_u(as_uint(v), o)); }
inline float clops_shfl_xor_f(float v, int o) {
    return as_float(clops_shfl_xor_u(as_uint(v), o));
}
"""


# C scalar type -> numpy dtype of a kernel argument
_C_SCALARS = {"char": "int8", "short": "int16", "int": "int32", "long": "int64",
              "uchar": "uint8", "ushort": "uint16", "uint": "uint32", "ulong": "uint64",
              "float": "float32", "double": "float64"}


class RenderedKernel(NamedTuple):
    """A rendered kernel: its source, the numpy dtypes of its scalar arguments in order (None
    for pointers), which the launch path packs arguments with, and its parameters
    (``KernelKey.params``: what a launch passes, in the order the source declares them)."""

    source: str
    arg_types: list[Any]
    params: tuple[Param, ...]


def _arg_better(table: dict[str, str], b: str, a: str) -> str:
    """The lanes where vector ``b`` replaces the best so far ``a`` of an arg reduction
    (``cl_ops.ARG_REDUCE``): further from the identity, or NaN where ``a`` is not."""
    return f"(~{table['vkeep'].format(a=a, b=b)} & ~isnan({a}))"


@functools.cache
def _package_text(package: str, file: str) -> str:
    """A file of the package (kernels are files), read once."""
    return resources.files(package).joinpath(file).read_text()


class CLRenderer:
    """OpenCL C. Class attributes name the language's spellings, methods spell what a table
    cannot; an instance holds nothing else, and ``render_kernel`` keeps one render's state in
    a ``_KernelSource`` made for that call."""

    __slots__ = ()

    # dtype name -> storage type, and the type arithmetic is done in
    storage_types: ClassVar[dict[str, str]] = cltypes.STORAGE
    math_types: ClassVar[dict[str, str]] = cltypes.MATH
    # elementwise functions and reductions per dtype category (see cl_ops)
    ew_table: ClassVar[dict[str, dict[str, str]]] = cl_ops.EW
    complex_special: ClassVar[dict[str, str]] = cl_ops.COMPLEX_SPECIAL
    reduce_identity: ClassVar[dict[str, dict[str, str]]] = cl_ops.REDUCE_IDENTITY
    reduce_combine: ClassVar[dict[str, dict[str, str]]] = cl_ops.REDUCE_COMBINE
    int_limits: ClassVar[dict[str, tuple[str, str]]] = cl_ops.INT_LIMITS
    arg_reduce: ClassVar[dict[str, dict[str, str]]] = cl_ops.ARG_REDUCE
    vector_extreme: ClassVar[dict[str, str]] = cl_ops.VECTOR_EXTREME
    # helpers included at the top of every program (a file of the package: kernels are files)
    prelude_package = "clops.compiler"
    prelude_file = "cl/prelude.cl"
    # clops' own vector sin, cos and tan (``kernel.OWN_VECTOR_MATH``), included where used,
    # after a line setting their vector width
    own_math_file = "cl/trig.cl"
    own_math_width = "#define CLOPS_TRIG_N {n}\n"
    # (and clops' own vector pow, after it where used)
    own_pow_file = "cl/pow.cl"
    shfl_funcs: ClassVar[dict[str, str]] = SHFL_FUNCS
    shfl_helpers = SHFL_HELPERS
    # scalar argument types (numpy dtypes, so the launch path packs arguments cheaply)
    scalar_args: ClassVar[dict[str, str]] = _C_SCALARS
    kernel_prefix = "__kernel void"
    global_ptr = "__global"
    local_decl = "__local"
    gid = "get_global_id(0)"
    gid1 = "get_global_id(1)"
    global_size = "get_global_size(0)"
    group_id = "get_group_id(0)"
    local_id = "get_local_id(0)"
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    fp64_pragma = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#define CLOPS_FP64 1\n"
    contract_pragma = "#pragma OPENCL FP_CONTRACT OFF\n"
    unroll = 8  # accumulators of a serial (one work-item) reduction
    group_unroll = 4  # accumulators (steps in flight) per work-item of a work-group reduction
    strip_vector = 8  # vector width of a CPU column strip (``lower.CPU_STRIP_WIDTHS`` divide)
    vector_unroll = 4  # vector accumulators of a CPU's serial row on vectors (``vser``)

    def prelude(self) -> str:
        return _package_text(self.prelude_package, self.prelude_file)

    def own_math(self, n: int, fns: tuple[str, ...] = ()) -> str:
        """The source of clops' own vector math on ``n``-wide vectors (the functions ``fns``:
        pow's source only where it is one of them)."""
        src = self.own_math_width.format(n=n) + _package_text(self.prelude_package,
                                                              self.own_math_file)
        if "pow" in fns:
            src += _package_text(self.prelude_package, self.own_pow_file)
        return src

    # -- types -------------------------------------------------------------------------------------
    @staticmethod
    def dt(name: str) -> dtypes.DType:
        return dtypes.BY_NAME[name]

    def math(self, name: str) -> str:
        return self.math_types[name]

    def storage(self, name: str) -> str:
        return self.storage_types[name]

    def load_expr(self, name: str, ptr: str, addr: str) -> str:
        d = self.dt(name)
        if d.name == "float16":
            return f"vload_half({addr}, {ptr})"
        if d.name == "bfloat16":
            return f"clops_bf16_load({ptr}[{addr}])"
        if d.kind == "b":
            return f"(int)({ptr}[{addr}] != 0)"
        return f"{ptr}[{addr}]"

    def store_stmt(self, name: str, ptr: str, addr: str, val: str) -> str:
        d = self.dt(name)
        if d.name == "float16":
            return f"vstore_half_rte({val}, {addr}, {ptr});"
        if d.name == "bfloat16":
            return f"{ptr}[{addr}] = clops_bf16_store({val});"
        if d.kind == "b":
            return f"{ptr}[{addr}] = (uchar)({val} != 0);"
        return f"{ptr}[{addr}] = ({self.storage(name)})({val});"

    def storage_ptr_type(self, name: str) -> str:
        return self.storage(name)

    def cast_expr(self, src: str, frm: str, to: str) -> str:
        a, b = self.dt(frm), self.dt(to)
        if a.kind == "c" and b.kind == "c":
            return f"convert_{self.math(to)}({src})"
        if b.kind == "b":
            return f"(int)({src}.x != 0 || {src}.y != 0)" if a.kind == "c" else \
                f"(int)({src} != 0)"
        if b.kind == "c":
            real = "double" if b.name == "complex128" else "float"
            return f"({self.math(to)})(({real})({src}), ({real})0)"
        if a.kind == "c":
            return f"({self.math(to)})({src}.x)"
        return f"({self.math(to)})({src})"

    # -- n-wide vectors (``flat`` kernels, vector rows) ------------------------------------------
    def vector_type(self, name: str, n: int) -> str:
        """The type ``n`` values of dtype ``name`` are held in, loaded or to be stored."""
        return f"float{n}" if name == "float16" else f"{self.storage(name)}{n}"

    def vector_load(self, name: str, n: int, ptr: str) -> str:
        """``n`` elements of dtype ``name`` from ``ptr`` on (in ``vector_type``)."""
        return f"vload_half{n}(0, {ptr})" if name == "float16" else f"vload{n}(0, {ptr})"

    def vector_component(self, name: str, comp: str) -> str:
        """A loaded vector's component ``comp`` as a value of dtype ``name``'s math type."""
        d = self.dt(name)
        if d.name == "bfloat16":
            return f"clops_bf16_load({comp})"
        if d.kind == "b":
            return f"(int)({comp} != 0)"
        return comp

    def vector_store_component(self, name: str, comp: str, val: str) -> str:
        """Set component ``comp`` of a vector to be stored to value ``val`` (dtype ``name``)."""
        d = self.dt(name)
        if d.name == "bfloat16":
            return f"{comp} = clops_bf16_store({val});"
        if d.kind == "b":
            return f"{comp} = (uchar)({val} != 0);"
        if d.name == "float16":
            return f"{comp} = {val};"
        return f"{comp} = ({self.storage(d.name)})({val});"

    def vector_store(self, name: str, n: int, vec: str, ptr: str) -> str:
        """Store vector ``vec`` of ``n`` elements of dtype ``name`` from ``ptr`` on."""
        if name == "float16":
            return f"vstore_half{n}_rte({vec}, 0, {ptr});"
        return f"vstore{n}({vec}, 0, {ptr});"

    # -- parameters --------------------------------------------------------------------------------
    def param_decl(self, p: Param, key: KernelKey, idx: str) -> str:
        """The declaration of ``key``'s parameter ``p`` (``idx``: the index type)."""
        if p.role == "out":
            return f"{self.global_ptr} {self.storage_ptr_type(key.outputs[p.slot].dtype)} " \
                f"*{p.name}"
        if p.role == "leaf":
            return f"{self.global_ptr} const {self.storage_ptr_type(key.leaves[p.slot].dtype)}" \
                f" *{p.name}"
        if p.role == "count":
            return f"{self.global_ptr} int *{p.name}"
        if p.role == "fin":
            assert key.combine is not None
            return f"{self.global_ptr} {self.storage_ptr_type(key.combine)} *{p.name}"
        if p.role == "const":
            return f"{self.math(key.consts[p.slot])} {p.name}"
        return f"{idx} {p.name}"

    def arg_dtype(self, decl: str) -> Any:
        """numpy dtype of a scalar kernel argument (None for pointers and vector types), so the
        launch path can pack arguments without inspecting them."""
        if "*" in decl:
            return None
        name = self.scalar_args.get(decl.split()[0])
        return np.dtype(name) if name else None

    # -- the kernel --------------------------------------------------------------------------------
    def render(self, key: KernelKey, local_size: int, name: str) -> str:
        """The source of kernel ``name`` for ``key``, built for ``local_size`` work-items per
        row (0: no reduction)."""
        return self.render_kernel(key, local_size, name).source

    def render_kernel(self, key: KernelKey, local_size: int, name: str) -> RenderedKernel:
        """Kernel ``name`` for ``key`` (as ``render``) with its scalar argument types and its
        parameters."""
        with _STATS_LOCK:
            RENDER_STATS["renders"] += 1
        return _KernelSource(self, key, local_size, name).rendered()


class _KernelSource:
    """One render of one key: the state the steps of a render share (value types, index
    contexts, the vector component, the register cache step, ...), made for that render alone
    (renders on several threads once shared one renderer's state, and launched kernels with
    another kernel's argument list). Spellings come from ``lang``."""

    def __init__(self, lang: CLRenderer, key: KernelKey, local_size: int, name: str) -> None:
        self.lang, self.key, self.local_size, self.name = lang, key, local_size, name
        self.idx = "long" if key.wide else "int"
        self.rank, self.leaves, self.flat = key.rank, key.leaves, key.flat
        self.vrow, self.cache, self.col = key.vrow, key.cache, key.col
        self.strip, self.runs, self.vmath = key.strip, key.runs, key.vmath
        self.vser = key.vser
        self.shfl = key.shfl and local_size % 32 == 0 and local_size >= 32
        self._check = ["if (gid >= total) return;"] if key.guard else []
        self._raxes = key.raxes
        self._combine = key.combine
        self._own = frozenset(key.own_math)
        self._types: dict[int, str] = {}
        self._ctx_ranks: dict[int, int] = {0: key.rank}
        self._red_types: dict[int, str] = {}
        self._row_ctx: set[int] = set()
        self._comp: int | None = None  # vector component being rendered (None: scalar)
        self._vec_name: dict[int, str] = {}  # vector (or cached value) of a leaf at this step
        self._cache_k: int | None = None  # register cache step being rendered (None: off)
        self._filled: set[int] = set()  # leaves whose cache holds this step's values
        self._uses_shfl = False

    def rendered(self) -> RenderedKernel:
        """The kernel (called once: the steps fill this render's state as they go)."""
        key, lang, idx, rank = self.key, self.lang, self.idx, self.rank
        flat, raxes, outs = key.flat, key.raxes, key.outputs
        params = key.params()
        args = [lang.param_decl(p, key, idx) for p in params]
        body: list[str] = []
        if flat > 1:
            body += self._vector_body(flat, key.leaves, key.instrs, outs)
        elif not raxes:
            body.append(f"{idx} gid = ({idx}){lang.gid};")
            body += self._check
            if not flat:
                body += self._unravel("gid", list(range(rank)))
            body += self._instrs(key.instrs)
            body += self._stores(outs)
        else:
            body += self._row_kernel(raxes, key.chunked, key.reduced_out, key.reductions,
                                     key.instrs, outs, self.local_size)
        arg_types = [lang.arg_dtype(a) for a in args]
        uses_fp64 = any(n in ("float64", "complex128") for n in key.dtype_names())
        head = lang.fp64_pragma if uses_fp64 else ""
        # NOTE: no contraction of a*b + c into one fma: numpy rounds the product first, and a
        # driver that contracts (NVIDIA's does) gave linspace(-64, 100, 7, int8)[3] 17, not 18
        src = head + lang.contract_pragma + lang.prelude() + "\n"
        if key.own_math:
            src += lang.own_math(flat, key.own_math) + "\n"
        if self._uses_shfl:
            src += lang.shfl_helpers
        src += f"{lang.kernel_prefix} {self.name}(\n    " + ",\n    ".join(args) + ")\n{\n"
        src += "\n".join("    " + line for line in body) + "\n}\n"
        return RenderedKernel(src, arg_types, params)

    def _vector_body(self, n: int, leaves: tuple[Leaf, ...], instrs: tuple[Instr, ...],
                     outs: tuple[KernelOutput, ...]) -> list[str]:
        """Contiguous elementwise kernel: ``n`` elements per work-item through vector loads
        and stores; the scalar expression is repeated per component."""
        idx = self.idx
        lines = [f"{idx} gid = ({idx}){self.lang.gid};", *self._check,
                 f"{idx} base = gid * {n};"]
        used = {ins.slot for ins in instrs if ins.op == "load"}
        for k, (lname, _, _) in enumerate(leaves):
            if k not in used:
                continue
            vt, load = self.lang.vector_type(lname, n), \
                self.lang.vector_load(lname, n, f"b{k} + o{k} + base")
            lines.append(f"{vt} lv{k} = {load};")
        if self.vmath:
            return lines + self._vector_math(n, instrs, outs)
        lines += self._sv_decls(outs, n)
        for c in range(n):
            self._comp = c
            block = self._instrs(instrs) + self._sv_component(outs, c)
            lines.append("{")
            lines += ["    " + b for b in block]
            lines.append("}")
        self._comp = None
        return lines + self._sv_stores(outs, n)

    def _vector_math(self, n: int, instrs: tuple[Instr, ...], outs: tuple[KernelOutput, ...]
                     ) -> list[str]:
        """The instructions of a ``vmath`` kernel on ``n``-wide vectors (float32 loads,
        constants, ``kernel.VECTOR_ARITHMETIC`` and ``VECTOR_MATH`` alone): the OpenCL C
        built-ins and operators apply element by element."""
        vt = f"float{n}"
        lines = []
        for ins in instrs:
            expr = f"lv{ins.slot}" if ins.op == "load" else self._vector_expr(ins, vt)
            lines.append(f"{vt} v{ins.out} = {expr};")
        for k, o in enumerate(outs):
            lines.append(f"vstore{n}(v{o.value}, 0, out{k} + oo{k} + base);")
        return lines

    def _unravel(self, var: str, axes: list[int], prefix: str = "i") -> list[str]:
        """Split ``var`` into the indices of ``axes`` (row-major over n{axis})."""
        if not axes:
            return []
        lines = [f"{self.idx} t_{var} = {var};"]
        for j in reversed(axes[1:]):
            lines.append(f"{self.idx} {prefix}{j} = t_{var} % n{j}; t_{var} /= n{j};")
        lines.append(f"{self.idx} {prefix}{axes[0]} = t_{var};")
        return lines

    def _addr(self, ctx: int, rank: int, offs: str, stride: str, unit_last: bool = False
              ) -> str:
        names = self._ctx_names(ctx, rank)
        terms = [offs]
        for j, n in enumerate(names):
            if n == "0":
                continue
            terms.append(n if unit_last and j == rank - 1 else f"{n}*{stride}{j}")
        return " + ".join(terms)

    def _ctx_names(self, ctx: int, rank: int) -> list[str]:
        if ctx in self._row_ctx:
            return ["0" if j in self._raxes else f"i{j}" for j in range(rank)]
        return [f"i{j}" for j in range(rank)] if ctx == 0 else \
            [f"x{ctx}_{d}" for d in range(rank)]

    def _instrs(self, instrs: tuple[Instr, ...]) -> list[str]:
        out: list[str] = []
        types, ctx_ranks = self._types, self._ctx_ranks
        for ins in instrs:
            v, op = ins.out, ins.op
            if op == "rowctx":
                self._row_ctx.add(ins.ctx)
                ctx_ranks[ins.ctx] = self.rank
                continue
            if op == "ctx":
                nctx, vslot, parent, vrank, srank = ins.ctx, ins.slot, ins.parent, ins.vrank, \
                    ins.srank
                ctx_ranks[nctx] = srank
                pn = self._ctx_names(parent, vrank)
                lin = " + ".join([f"vo{vslot}"] + [f"{n}*vs{vslot}_{j}" for j, n in enumerate(pn)])
                out.append(f"{self.idx} l{nctx} = {lin};")
                for d in range(srank):
                    e = f"l{nctx} / vp{vslot}_{d}" if d < srank - 1 else f"l{nctx}"
                    e = f"({e}) % vq{vslot}_{d}" if d > 0 else e
                    out.append(f"{self.idx} x{nctx}_{d} = {e};")
                continue
            if op == "load":
                slot, ctx, dname = ins.slot, ins.ctx, ins.dtype
                if self._comp is not None and ctx == 0:
                    vec = self._vec_name.get(slot, f"lv{slot}")
                    expr, t = self.lang.vector_component(dname, f"{vec}.s{self._comp:x}"), \
                        self.lang.math(dname)
                    types[v] = t
                    out.append(f"{t} v{v} = {expr};")
                    continue
                if self._cache_k is not None and ctx == 0:
                    t = self.lang.math(dname)
                    cname = f"c{slot}_{self._cache_k}"
                    if slot not in self._filled:
                        lrank, unit = self.leaves[slot].rank, self.leaves[slot].unit_last
                        addr = self._addr(ctx, lrank, f"o{slot}", f"s{slot}_", unit)
                        out.append(f"{cname} = {self.lang.load_expr(dname, f'b{slot}', addr)};")
                    types[v] = t
                    out.append(f"{t} v{v} = {cname};")
                    continue
                if self.flat:
                    addr = f"o{slot} + gid"
                else:
                    lrank, unit = self.leaves[slot].rank, self.leaves[slot].unit_last
                    addr = self._addr(ctx, lrank, f"o{slot}", f"s{slot}_", unit)
                expr = self.lang.load_expr(dname, f"b{slot}", addr)
                t = self.lang.math(dname)
            elif op == "const":
                slot, dname = ins.slot, ins.dtype
                expr, t = f"c{slot}", self.lang.math(dname)
            elif op == "iota":
                axis, ctx, dname = ins.axis, ins.ctx, ins.dtype
                names = self._ctx_names(ctx, ctx_ranks[ctx])
                expr, t = f"({self.lang.math(dname)}){names[axis]}", self.lang.math(dname)
            elif op == "ew":
                dname = ins.dtype
                expr, t = self._ew(ins.fn, ins.srcs, ins.kinds, dname), self.lang.math(dname)
            elif op == "cast":
                expr, t = self.lang.cast_expr(f"v{ins.srcs[0]}", ins.kinds[0], ins.dtype), \
                    self.lang.math(ins.dtype)
            elif op == "red":
                expr, t = f"red{ins.slot}", self._red_types[ins.slot]
            else:
                raise NotImplementedError(op)
            types[v] = t
            out.append(f"{t} v{v} = {expr};")
        return out

    def _ew(self, fn: str, srcs: tuple[int, ...], kinds: tuple[str, ...], dname: str) -> str:
        res = self.lang.dt(dname)
        if fn == "where":
            operand = self.lang.dt(kinds[1])
            names = {"c": f"v{srcs[0]}", "a": f"v{srcs[1]}", "b": f"v{srcs[2]}"}
        else:
            operand = self.lang.dt(kinds[0])
            names = dict(zip("abc", (f"v{s}" for s in srcs)))
        cat = operand.kind
        if cat == "c" and fn in self.lang.complex_special:
            fn = self.lang.complex_special[fn]
        table = self.lang.ew_table.get(fn)
        if table is None or cat not in table:
            raise TypeError(f"{fn} is not defined for {operand.name} in the OpenCL renderer")
        real = "double" if operand.name in ("complex128", "float64") else "float"
        lo, hi = self.lang.int_limits.get(self.lang.math(operand.name), ("0", "0"))
        return table[cat].format(T=self.lang.math(res.name), R=real, BITS=operand.bits, MIN=lo,
                                 MAX=hi, **names)

    def _stores(self, outs: tuple[KernelOutput, ...]) -> list[str]:
        lines = []
        for k, o in enumerate(outs):
            addr = f"oo{k} + gid" if self.flat else self._addr(0, o.rank, f"oo{k}", f"os{k}_",
                                                                o.unit_last)
            lines.append(self.lang.store_stmt(o.dtype, f"out{k}", addr, f"v{o.value}"))
        return lines

    def _row_kernel(self, raxes: tuple[int, ...], chunked: bool, reduced_out: bool,
                    reductions: tuple[Reduction, ...], out_instrs: tuple[Instr, ...],
                    outs: tuple[KernelOutput, ...], L: int) -> list[str]:
        idx = self.idx
        rank = self.rank
        other = [j for j in range(rank) if j not in raxes]
        batch = self.key.batch and L == 1
        head: list[str] = []  # a batch's loop over its rows, around the rest
        lines = []
        if self.col:
            # column layout: a work-item per output element, adjacent work-items on adjacent
            # elements (GPUs round them up to whole groups), the chunks on the second axis.
            # PERF: the output index is the global id itself, which PoCL sees as consecutive
            # across a group's lanes (vector loads; `g % total` made them gathers, 8x slower)
            lines.append(f"{idx} row = ({idx}){self.lang.gid};" if not self.strip else
                         f"{idx} row = ({idx}){self.lang.gid} * {self.strip};")
            if chunked:
                lines.append(f"{idx} ck = ({idx}){self.lang.gid1};")
                lines.append(f"{idx} rbeg = ck * chunk, rend = min(rn, rbeg + chunk);")
            else:
                lines.append(f"{idx} rbeg = 0, rend = rn;")
        elif chunked:
            lines.append(f"{idx} g = ({idx}){self.lang.group_id};")
            lines.append(f"{idx} row = g / nchunks, ck = g % nchunks;")
            lines.append(f"{idx} rbeg = ck * chunk, rend = min(rn, rbeg + chunk);")
        elif batch:
            # CPUs: the rows of a work-item, a run of adjacent ones (the launch's global size
            # decides how many: ``geometry.row_batch``), each reduced as a row of its own
            head = [f"{idx} items = ({idx}){self.lang.global_size}, "
                    "per = (total + items - 1) / items;",
                    f"{idx} row0 = ({idx}){self.lang.gid} * per;",
                    f"{idx} rowend = min(total, row0 + per);",
                    f"for ({idx} row = row0; row < rowend; row++) {{"]
            lines.append(f"{idx} rbeg = 0, rend = rn;")
        else:
            lines.append(f"{idx} row = ({idx}){self.lang.group_id};")
            lines.append(f"{idx} rbeg = 0, rend = rn;")
        lines.append(f"{idx} lid = ({idx}){self.lang.local_id};" if L > 1 else f"{idx} lid = 0;")
        if (self._check or not self.col) and not batch:
            # PERF: no early return in a CPU's column layout (launched exactly): PoCL then
            # runs the work-items of a group as vector lanes
            lines.append("if (row >= total) return;")
        lines += self._unravel("row", other)
        for j in raxes:
            lines.append(f"{idx} i{j} = 0;")
        if self.strip:
            return lines + self._strip_rows(raxes, chunked, reductions, out_instrs, outs)
        if L == 1:
            lines += self._serial_rows(raxes, chunked, reduced_out, reductions, out_instrs,
                                       outs)
            return head + ["    " + x for x in lines] + ["}"] if batch else lines
        return lines + self._group_rows(raxes, chunked, reduced_out, reductions, out_instrs,
                                        outs, L)

    def _serial_rows(self, raxes: tuple[int, ...], chunked: bool, reduced_out: bool,
                     reductions: tuple[Reduction, ...], out_instrs: tuple[Instr, ...],
                     outs: tuple[KernelOutput, ...]) -> list[str]:
        """One work-item per row (CPUs), or per output of a column layout."""
        idx = self.idx
        lines: list[str] = []
        # PERF: PoCL runs a kernel's work-items one after another around the whole body, so a
        # column's loop runs alone, a load per row (a 4096x4096 column sum took 64 ms, numpy
        # 3.4). A barrier in the loop makes it run each step across the group's work-items,
        # adjacent outputs as vector lanes (5.3 ms with 16 work-items a group). The loop
        # bounds are the same for the whole group (a chunk is the launch's second axis).
        lockstep = self.col and not self._check
        sync = ["    " + self.lang.barrier] if lockstep else []
        for slot, (op, acc, _src, body, instrs) in enumerate(reductions):
            if op in self.lang.arg_reduce:
                lines += self._arg_row(slot, op, acc, raxes, instrs, body)
                continue
            at, ident, comb = self._red_setup(slot, op, acc)
            lines.append(f"{at} red{slot};")
            lines.append("{")
            lines.append(f"    {at} acc = ({at})({ident});")
            if lockstep:
                lines.append(f"    for ({idx} r = rbeg; r < rend; r++) {{")
                lines += ["    " + s for s in self._reduce_step(raxes, instrs, body, at, comb,
                                                                 "acc", "r")]
                lines += ["    " + s for s in sync] + ["    }"]
            elif self.vser:
                lines += self._vector_accumulate(raxes, instrs, body, at, ident, comb, op)
            elif self.runs:
                lines += self._run_accumulate(raxes, instrs, body, at, ident, comb)
            else:
                # PERF: independent accumulators over unrolled steps let a CPU compiler
                # vectorize the loads and combines (a single chain of adds cannot be).
                lines += self._unrolled_accumulate(
                    at, ident, comb, self.lang.unroll, "rbeg", 1,
                    lambda a, pos, instrs=instrs, body=body, at=at, comb=comb:
                    self._reduce_step(raxes, instrs, body, at, comb, a, pos))
            lines.append(f"    red{slot} = acc;")
            lines.append("}")
        for j in raxes:
            lines.append(f"i{j} = 0;")
        if chunked:
            lines.append(f"i{raxes[0]} = ck;")
        if reduced_out or chunked:
            lines.append("if (lid == 0) {")
            lines += ["    " + s for s in self._instrs(out_instrs)]
            lines += ["    " + s for s in self._stores(outs)]
            lines.append("}")
        else:
            lines.append(f"for ({idx} r = lid; r < rn; r += 1) {{")
            inner = self._unravel_r(raxes)
            inner += self._instrs(out_instrs)
            inner += self._stores(outs)
            lines += ["    " + s for s in inner] + sync
            lines.append("}")
        return lines

    def _run_accumulate(self, raxes: tuple[int, ...], instrs: tuple[Instr, ...], body: int,
                        at: str, ident: str, comb: str) -> list[str]:
        """Lines folding the elements ``rbeg`` .. ``rend`` of a row over several reduced axes
        into ``acc``, a run of the last reduced axis at a time: the indices are unravelled
        once per run, and within it the last index steps as in a row of one axis.
        PERF (4096x4096 float32 ``sum()``, Intel's runtime, two cores): unravelled per
        element 33 ms (numpy 4.4)."""
        idx, U, last = self.idx, self.lang.unroll, raxes[-1]

        def step(a: str, pos: str) -> list[str]:
            lines = [f"i{last} = {pos} - run;", *self._instrs(instrs)]
            val = f"v{body}" if self._types[body] == at else f"({at})(v{body})"
            return lines + [f"{a} = " + comb.format(a=a, b=val, T=at) + ";"]

        lines = [f"    {at} " + ", ".join(f"acc{u} = ({at})({ident})" for u in range(U)) + ";",
                 f"    {idx} r = rbeg;", "    while (r < rend) {"]
        lines += ["        " + x for x in self._unravel_r(raxes)]
        lines += [f"        {idx} run = r - i{last};  // the flat index of the run's start",
                  f"        {idx} rstop = min(rend, run + n{last});",
                  f"        for (; r + {U} <= rstop; r += {U}) {{"]
        for u in range(U):
            lines.append("            {")
            lines += ["                " + x for x in step(f"acc{u}", f"r + {u}")]
            lines.append("            }")
        lines += ["        }", "        for (; r < rstop; r++) {"]
        lines += ["            " + x for x in step("acc", "r")]
        lines += ["        }", "    }"]
        for u in range(U):
            lines.append("    acc = " + comb.format(a="acc", b=f"acc{u}", T=at) + ";")
        return lines

    def _arg_row(self, slot: int, op: str, acc: str, raxes: tuple[int, ...],
                 instrs: tuple[Instr, ...], body: int) -> list[str]:
        """Arg reduction ``slot`` of a serial row (CPUs; float values): ``red{slot}`` is the
        position in the row of the first maximum (``argmax``) or minimum, a NaN
        counting as either. On ``vser``-wide vectors where the row is contiguous: a best value
        and position per lane, the lanes taken in at the end of each block of 2^30 elements
        (positions in a lane are ``int`` offsets from the block's start); else one element at
        a time."""
        idx, at = self.idx, self.lang.math(acc)
        self._red_types[slot] = "long"
        table = self.lang.arg_reduce[op]
        ident = table["ident"]
        cmp = table["cmp"]
        last = raxes[-1]
        # a later element (b at bi) replaces the best so far (a at ai) when it is greater (less),
        # or NaN where a is not; an element of another lane also when equal at a lower position
        later = f"({cmp} || (isnan({{b}}) && !isnan({{a}})))"
        other = f"({later} || ((({{b}}) == ({{a}}) || (isnan({{a}}) && isnan({{b}}))) && " \
            "({bi}) < ({ai})))"

        def take(cond: str, b: str, bi: str) -> list[str]:
            return [f"if ({cond.format(a='acc', b=b, ai='acci', bi=bi)}) {{ acc = {b}; "
                    f"acci = {bi}; }}"]

        def step(pos: str) -> list[str]:
            lines = [f"i{last} = {pos} - run;", *self._instrs(instrs)]
            val = f"v{body}" if self._types[body] == at else f"({at})(v{body})"
            return lines + [f"{at} b = {val};", *take(later, "b", pos)]

        lines = [f"long red{slot};", "{", f"    {at} acc = ({at})({ident});",
                 "    long acci = rbeg;", f"    {idx} r = rbeg;", "    while (r < rend) {"]
        if len(raxes) > 1:
            lines += ["        " + x for x in self._unravel_r(raxes)]
            lines += [f"        {idx} run = r - i{last};",
                      f"        {idx} rstop = min(rend, run + n{last});"]
        else:
            lines += [f"        {idx} run = 0, rstop = rend;"]
        if self.vser:
            lines += self._arg_vectors(table, at, body, instrs, last, take, other)
        lines += ["        for (; r < rstop; r++) {"]
        lines += ["            " + x for x in step("r")]
        lines += ["        }", "    }", f"    red{slot} = acci;", "}"]
        return lines

    def _arg_vectors(self, table: dict[str, str], at: str, body: int,
                     instrs: tuple[Instr, ...], last: int, take: Callable[..., list[str]],
                     other: str) -> list[str]:
        """The vector part of ``_arg_row``: ``vector_unroll`` pairs of a best value and its
        position per lane (independent chains), merged lane-wise at the end of each block of
        2^30 elements, the lower position winning a tie, then the lanes into ``acc``."""
        idx, n, U = self.idx, self.vser, self.lang.vector_unroll
        vt, it = f"{at}{n}", f"int{n}"
        lanes = ", ".join(str(c) for c in range(n))

        lines = [f"while (r + {n} <= rstop) {{",
                 f"    {idx} bbeg = r, bend = min(rstop, r + (1L << 30));",
                 f"    {it} cur = ({it})({lanes});",
                 f"    {vt} " + ", ".join(f"vm{u} = ({vt})({table['ident']})"
                                          for u in range(U)) + ";",
                 f"    {it} " + ", ".join(f"vi{u} = cur + {u * n}" for u in range(U)) + ";",
                 f"    for (; r + {U * n} <= bend; r += {U * n}, cur += {U * n}) {{"]
        for u in range(U):
            lines.append("        {")
            lines += ["            " + x for x in [f"i{last} = r + {u * n} - run;",
                                                    *self._serial_vector_instrs(instrs, vt)]]
            lines += [f"            {it} t = {_arg_better(table, f'v{body}_v', f'vm{u}')};",
                      f"            vm{u} = select(vm{u}, v{body}_v, t);",
                      f"            vi{u} = select(vi{u}, cur + {u * n}, t);", "        }"]
        lines += ["    }", f"    for (; r + {n} <= bend; r += {n}, cur += {n}) {{"]
        lines += ["        " + x for x in [f"i{last} = r - run;",
                                            *self._serial_vector_instrs(instrs, vt)]]
        lines += [f"        {it} t = {_arg_better(table, f'v{body}_v', 'vm0')};",
                  f"        vm0 = select(vm0, v{body}_v, t);",
                  "        vi0 = select(vi0, cur, t);", "    }"]
        def merge(it: str, a: str, ai: str, b: str, bi: str) -> list[str]:
            # b (at bi) into a (at ai), lane-wise: the better, or the lower position of a tie
            tie = f"((isequal({b}, {a}) | (isnan({b}) & isnan({a}))) & ({bi} < {ai}))"
            return [f"{it} t = {_arg_better(table, b, a)} | {tie};",
                    f"{a} = select({a}, {b}, t); {ai} = select({ai}, {bi}, t);"]

        for u in range(1, U):
            lines += ["    { " + " ".join(merge(it, "vm0", "vi0", f"vm{u}", f"vi{u}")) + " }"]
        # PERF: the lanes folded in halves on vectors, then two into acc; a branch for each of
        # 8 lanes: argmax over the last axis of 64x128x64, kernel time 0.54 -> 0.41 ms (Intel's
        # runtime; short rows pay the fold once per row)
        w, m, i = n, "vm0", "vi0"
        while w > 2:
            w //= 2
            vw, iw = f"{at}{w}", f"int{w}"
            lines += [f"    {vw} vm_{w} = {m}.lo, vh_{w} = {m}.hi;",
                      f"    {iw} vi_{w} = {i}.lo, ih_{w} = {i}.hi;",
                      "    { " + " ".join(merge(iw, f"vm_{w}", f"vi_{w}", f"vh_{w}",
                                                f"ih_{w}")) + " }"]
            m, i = f"vm_{w}", f"vi_{w}"
        for c in range(w):
            lines += ["    " + x for x in take(other, f"{m}.s{c:x}", f"bbeg + {i}.s{c:x}")]
        lines.append("}")
        return ["        " + x for x in lines]

    def _vector_accumulate(self, raxes: tuple[int, ...], instrs: tuple[Instr, ...], body: int,
                           at: str, ident: str, comb: str, op: str) -> list[str]:
        """Lines folding the elements ``rbeg`` .. ``rend`` of a serial row into ``acc`` on
        ``vser``-wide vectors (``lower.serial_vector``): ``vector_unroll`` vector accumulators
        over contiguous runs of the last reduced axis, the rest of a run one element at a time,
        then the lanes in order. PERF: see ``lower.CPU_SERIAL_VECTOR``."""
        idx, n, U, last = self.idx, self.vser, self.lang.vector_unroll, raxes[-1]
        vt = f"{at}{n}"
        # max and min: a compare and a select a vector, a NaN seen kept in a mask beside
        # (``cl_ops.VECTOR_EXTREME``). PERF (kernel time, in turns in one process, medians of
        # 25-31, two cores, loaded; NaN-propagating select -> this, ms): max over the last axis
        # of 64x128x64 0.120 -> 0.100 on Intel's runtime (0.144 -> 0.129 in another run), 0.149
        # -> 0.145 on PoCL 3.1; 1024x512 0.136 -> 0.099 and 0.133 -> 0.121; 4096x4096 4.03 ->
        # 3.65-3.78 and 3.84-4.14 -> 3.72-4.04
        extreme = self.lang.vector_extreme.get(op)

        def vstep(u: int) -> list[str]:
            lines = [f"i{last} = r + {u * n} - run;", *self._serial_vector_instrs(instrs, vt)]
            if extreme is not None:
                return lines + [f"vacc{u} = " + extreme.format(a=f"vacc{u}", b=f"v{body}_v")
                                + ";", f"vnan |= isnan(v{body}_v);"]
            return lines + [f"vacc{u} = " + comb.format(a=f"vacc{u}", b=f"v{body}_v", T=vt)
                            + ";"]

        def step() -> list[str]:
            lines = [f"i{last} = r - run;", *self._instrs(instrs)]
            val = f"v{body}" if self._types[body] == at else f"({at})(v{body})"
            return lines + ["acc = " + comb.format(a="acc", b=val, T=at) + ";"]

        lines = [f"    {vt} " + ", ".join(f"vacc{u} = ({vt})({ident})" for u in range(U)) + ";",
                 f"    {idx} r = rbeg;", "    while (r < rend) {"]
        if extreme is not None:
            lines.insert(1, f"    int{n} vnan = (int{n})(0);")
        if len(raxes) > 1:
            lines += ["        " + x for x in self._unravel_r(raxes)]
            lines += [f"        {idx} run = r - i{last};  // the flat index of the run's start",
                      f"        {idx} rstop = min(rend, run + n{last});"]
        else:
            lines += [f"        {idx} run = 0, rstop = rend;"]
        lines.append(f"        for (; r + {U * n} <= rstop; r += {U * n}) {{")
        for u in range(U):
            lines.append("            {")
            lines += ["                " + x for x in vstep(u)]
            lines.append("            }")
        lines += ["        }", "        for (; r < rstop; r++) {"]
        lines += ["            " + x for x in step()]
        lines += ["        }", "    }"]
        for u in range(1, U):
            lines.append("    vacc0 = " + comb.format(a="vacc0", b=f"vacc{u}", T=vt) + ";")
        # PERF: the lanes folded in halves on vectors, then two into acc, not 8 steps into
        # acc: short rows pay the fold once a row (max over the last axis of 64x128x64,
        # Intel's runtime, kernel time 0.081-0.094 -> 0.076-0.086 ms in three runs)
        w, v = n, "vacc0"
        while w > 2:
            w //= 2
            lines.append(f"    {at}{w} vf{w} = " + comb.format(a=f"{v}.lo", b=f"{v}.hi",
                                                             T=f"{at}{w}") + ";")
            v = f"vf{w}"
        for c in range(w):
            lines.append("    acc = " + comb.format(a="acc", b=f"{v}.s{c:x}", T=at) + ";")
        if extreme is not None:
            lines.append(f"    if (any(vnan)) acc = ({at})(NAN);")
        return lines

    def _serial_vector_instrs(self, instrs: tuple[Instr, ...], vt: str) -> list[str]:
        """A serial row's ``instrs`` (``lower.serial_vector``) on ``vt`` vectors from the
        position the indices name on: loads along the last axis, constants and reduction
        results broadcast, arithmetic as vector operators; values ``v<index>_v``."""
        n = self.vser
        lines = []
        for ins in instrs:
            if ins.op == "rowctx":
                self._row_ctx.add(ins.ctx)
                continue
            if ins.op == "load":
                lrank, unit = self.leaves[ins.slot].rank, self.leaves[ins.slot].unit_last
                addr = self._addr(0, lrank, f"o{ins.slot}", f"s{ins.slot}_", unit)
                expr = f"vload{n}(0, b{ins.slot} + {addr})"
            elif ins.op == "red":
                expr = f"({vt})(red{ins.slot})"
            else:
                expr = self._vector_expr(ins, vt, "_v")
            lines.append(f"{vt} v{ins.out}_v = {expr};")
        return lines

    def _strip_rows(self, raxes: tuple[int, ...], chunked: bool,
                    reductions: tuple[Reduction, ...], out_instrs: tuple[Instr, ...],
                    outs: tuple[KernelOutput, ...]) -> list[str]:
        """A column layout's strip (CPUs): ``strip`` adjacent outputs per work-item, from
        ``row`` on along the last axis, in float8 vectors; each step of the loop over the
        reduced axes reads a contiguous run of every row operand."""
        idx, n = self.idx, self.lang.strip_vector
        vt = f"float{n}"
        parts = range(self.strip // n)
        lines: list[str] = []
        for slot, (op, acc, _src, body, instrs) in enumerate(reductions):
            if op in self.lang.arg_reduce:
                lines += self._arg_strip(slot, op, raxes, instrs, body)
                continue
            _at, ident, comb = self._red_setup(slot, op, acc)
            lines.append(f"{vt} " + ", ".join(f"red{slot}_{u}" for u in parts) + ";")
            lines.append("{")
            lines.append(f"    {vt} " + ", ".join(f"acc{u} = ({vt})({ident})" for u in parts)
                         + ";")
            lines.append(f"    for ({idx} r = rbeg; r < rend; r++) {{")
            step = self._unravel_r(raxes)
            for u in parts:
                step += self._strip_instrs(instrs, u, vt)
                step.append(f"acc{u} = " + comb.format(a=f"acc{u}", b=f"v{body}_{u}", T=vt)
                            + ";")
            lines += ["        " + x for x in step]
            lines.append("    }")
            lines += [f"    red{slot}_{u} = acc{u};" for u in parts]
            lines.append("}")
        for j in raxes:
            lines.append(f"i{j} = 0;")
        if chunked:
            lines.append(f"i{raxes[0]} = ck;")
        for u in parts:
            lines += self._strip_instrs(out_instrs, u, vt)
            for k, o in enumerate(outs):
                addr = self._addr(0, o.rank, f"oo{k}", f"os{k}_", o.unit_last)
                lines.append(f"vstore{n}(v{o.value}_{u}, {u}, out{k} + {addr});")
        return lines

    def _strip_instrs(self, instrs: tuple[Instr, ...], u: int, vt: str) -> list[str]:
        """``instrs`` (float32 loads along the row, constants, arithmetic, reduction results;
        ``lower.column_strip``) on the ``u``-th vector of a strip."""
        n = self.lang.strip_vector
        lines = []
        for ins in instrs:
            if ins.op == "rowctx":
                continue  # opens the context of a reduction's result alone (no loads)
            if ins.op == "load":
                lrank, unit = self.leaves[ins.slot].rank, self.leaves[ins.slot].unit_last
                addr = self._addr(0, lrank, f"o{ins.slot}", f"s{ins.slot}_", unit)
                expr = f"vload{n}({u}, b{ins.slot} + {addr})"
            elif ins.op == "red":
                expr = f"red{ins.slot}_{u}"
                if self._red_types[ins.slot] == "long":  # an arg reduction's positions
                    lines.append(f"long{n} v{ins.out}_{u} = {expr};")
                    continue
            else:
                expr = self._vector_expr(ins, vt, f"_{u}")
            lines.append(f"{vt} v{ins.out}_{u} = {expr};")
        return lines

    def _arg_strip(self, slot: int, op: str, raxes: tuple[int, ...],
                   instrs: tuple[Instr, ...], body: int) -> list[str]:
        """Arg reduction ``slot`` of a column strip (float32 values): ``red{slot}_<u>`` (long
        vectors) hold the position along the reduced axes of the first maximum (``argmax``) or
        minimum of each output, a NaN counting as either. Each float8 of the strip keeps a best
        value and an int position from the start of a block of 2^30 steps, taken into the long
        positions at the end of each block."""
        idx, n = self.idx, self.lang.strip_vector
        vt, it, lt = f"float{n}", f"int{n}", f"long{n}"
        parts = range(self.strip // n)
        self._red_types[slot] = "long"
        table = self.lang.arg_reduce[op]

        lines = [f"{lt} " + ", ".join(f"red{slot}_{u}" for u in parts) + ";", "{",
                 f"    {vt} " + ", ".join(f"best{u} = ({vt})({table['ident']})" for u in parts)
                 + ";",
                 f"    {lt} " + ", ".join(f"bpos{u} = ({lt})(rbeg)" for u in parts) + ";",
                 f"    for ({idx} bbeg = rbeg; bbeg < rend; bbeg += (1L << 30)) {{",
                 f"        {idx} bend = min(rend, bbeg + (1L << 30));",
                 f"        {vt} " + ", ".join(f"acc{u} = ({vt})({table['ident']})" for u in parts)
                 + ";",
                 f"        {it} " + ", ".join(f"pos{u} = ({it})(0)" for u in parts) + ";",
                 f"        for ({idx} r = bbeg; r < bend; r++) {{",
                 f"            {it} here = ({it})((int)(r - bbeg));"]
        step = self._unravel_r(raxes)
        for u in parts:
            step += self._strip_instrs(instrs, u, vt)
            step += [f"{it} t{u} = {_arg_better(table, f'v{body}_{u}', f'acc{u}')};",
                     f"acc{u} = select(acc{u}, v{body}_{u}, t{u});",
                     f"pos{u} = select(pos{u}, here, t{u});"]
        lines += ["            " + x for x in step]
        lines.append("        }")
        for u in parts:
            lines += [f"        {{ {it} t = {_arg_better(table, f'acc{u}', f'best{u}')};",
                      f"          best{u} = select(best{u}, acc{u}, t);",
                      f"          bpos{u} = select(bpos{u}, convert_{lt}(pos{u}) + bbeg, "
                      f"convert_{lt}(t)); }}"]
        lines.append("    }")
        lines += [f"    red{slot}_{u} = bpos{u};" for u in parts]
        lines.append("}")
        return lines

    def _vector_expr(self, ins: Instr, vt: str, suffix: str = "") -> str:
        """A constant's or an operator's expression on ``vt`` vectors, its operands the values
        ``v<index><suffix>`` (``_vector_math``; ``_strip_instrs``, a suffix a vector)."""
        if ins.op == "const":
            return f"({vt})(c{ins.slot})"
        names = dict(zip("abc", (f"v{x}{suffix}" for x in ins.srcs)))
        if ins.fn in self._own:
            return f"clops_{ins.fn}({', '.join(names.values())})"
        return self.lang.ew_table[ins.fn]["f"].format(T=vt, R="float", **names)

    def _red_setup(self, slot: int, op: str, acc: str) -> tuple[str, str, str]:
        """(accumulator type, identity, combine template) of reduction ``slot``."""
        accd = self.lang.dt(acc)
        at = self.lang.math(acc)
        self._red_types[slot] = at
        cat = accd.kind
        lo, hi = self.lang.int_limits.get(at, ("0", "0"))
        ident = self.lang.reduce_identity[op][cat].format(T=at, MIN=lo, MAX=hi)
        return at, ident, self.lang.reduce_combine[op][cat]

    @staticmethod
    def _row_slots(instrs: tuple[Instr, ...]) -> list[int]:
        """Leaves a region loads along the row (context 0), in order."""
        out: list[int] = []
        for ins in instrs:
            if ins.op == "load" and ins.ctx == 0 and ins.slot not in out:
                out.append(ins.slot)
        return out

    def _group_rows(self, raxes: tuple[int, ...], chunked: bool, reduced_out: bool,
                    reductions: tuple[Reduction, ...], out_instrs: tuple[Instr, ...],
                    outs: tuple[KernelOutput, ...], L: int) -> list[str]:
        """One work-group of ``L`` work-items per row (or chunk of a row): strided, unrolled
        (and on contiguous rows vector) loads, a register cache of the row between passes when
        it fits, and a tree (or warp shuffle) finish per reduction."""
        idx = self.idx
        V = self.vrow or 1
        lines: list[str] = []
        if self.vrow:
            lines.append(f"{idx} rowbase = row * rn;")
        setups = []
        for slot, (op, acc, _src, _body, _instrs) in enumerate(reductions):
            at, ident, comb = self._red_setup(slot, op, acc)
            setups.append((at, ident, comb))
            n = L // 32 if self._shfl_ok(at) else L
            lines.append(f"{self.lang.local_decl} {at} scratch{slot}[{n}];")
            lines.append(f"{at} red{slot};")
        if self._combine is not None:
            lines.append(f"{self.lang.local_decl} int last_group;")
        row_out = not (reduced_out or chunked)

        def passes(cached: bool) -> list[str]:
            out: list[str] = []
            for slot, (_op, _acc, _src, body, instrs) in enumerate(reductions):
                at, ident, comb = setups[slot]
                out += self._group_reduce(slot, body, instrs, at, ident, comb, raxes, L,
                                          cached)
            for j in raxes:
                out.append(f"i{j} = 0;")
            if chunked:
                out.append(f"i{raxes[0]} = ck;")
            if not row_out:
                out.append("if (lid == 0) {")
                out += ["    " + s for s in self._instrs(out_instrs)]
                out += ["    " + s for s in self._stores(outs)]
                out.append("}")
                if self._combine is not None:
                    out += self._combine_parts(reductions[0], outs[0].dtype, setups[0], L)
                return out
            if cached:
                for k in range(self.cache):
                    out.append("{")
                    out.append(f"    {idx} r = lid * {V} + {k * L * V};")
                    out.append("    if (r < rn) {")
                    out += ["        " + s for s in self._row_out_step(
                        raxes, out_instrs, outs, "r", k)]
                    out.append("    }")
                    out.append("}")
            else:
                out.append(f"for ({idx} r = lid * {V}; r < rn; r += {L * V}) {{")
                out += ["    " + s for s in self._row_out_step(raxes, out_instrs, outs,
                                                                 "r", None)]
                out.append("}")
            return out

        if self.cache and not chunked:
            slots: list[int] = []
            for *_, instrs in reductions:
                slots += [s for s in self._row_slots(instrs) if s not in slots]
            if row_out:
                slots += [s for s in self._row_slots(out_instrs) if s not in slots]
            lines.append(f"if (rend - rbeg <= {self.cache * L * V}) {{")
            lines.append("    // the row fits in registers: read it once, every load in flight")
            for s in slots:
                vt = self._vec_type(self.leaves[s].dtype) if self.vrow else \
                    self.lang.math(self.leaves[s].dtype)
                lines.append(f"    {vt} " + ", ".join(f"c{s}_{k}" for k in range(self.cache))
                             + ";")
            for k in range(self.cache):
                lines.append("    {")
                lines.append(f"        {idx} r = rbeg + lid * {V} + {k * L * V};")
                lines.append("        if (r < rend) {")
                lines += ["            " + s for s in self._prefetch(raxes, slots, k)]
                lines.append("        }")
                lines.append("    }")
            self._filled = set(slots)
            lines += ["    " + s for s in passes(True)]
            self._filled = set()
            lines.append("} else {")
            lines += ["    " + s for s in passes(False)]
            lines.append("}")
        else:
            lines += passes(False)
        return lines

    def _combine_parts(self, reduction: Reduction, part: str,
                       setup: tuple[str, str, str], L: int) -> list[str]:
        """One-kernel split reduction of one row: each work-group has stored its part (at
        out0[oo0 + chunk]); the last one to announce it on ``count`` adds up all the parts,
        stores the result at fin[fo] and sets ``count`` back to zero for the next kernel."""
        at, ident, comb = setup
        fence = "asm volatile(\"membar.gl;\" ::: \"memory\");" if self.shfl else \
            "mem_fence(CLK_GLOBAL_MEM_FENCE);"
        acc_name, final = reduction.acc, str(self._combine)
        load = self.lang.load_expr(part, "out0", "oo0 + j")
        val = load if self.lang.math(part) == at else f"({at})({load})"
        lines = ["// the last work-group to finish adds up the parts (no second kernel)",
                 "if (lid == 0) {",
                 f"    {fence}  // this group's part, before the count that announces it",
                 "    last_group = atomic_inc(count) == nchunks - 1;", "}",
                 self.lang.barrier, "if (last_group) {", f"    {fence}",
                 "    {", f"        {at} acc = ({at})({ident});",
                 f"        for ({self.idx} j = lid; j < nchunks; j += {L}) acc = "
                 + comb.format(a="acc", b=val, T=at) + ";"]
        lines += ["        " + s for s in self._finish(0, at, comb, L)]
        cast = self.lang.cast_expr("red0", acc_name, final)
        lines += ["    }", "    if (lid == 0) {",
                  "        " + self.lang.store_stmt(final, "fin", "fo", cast),
                  "        *count = 0;", "    }", "}"]
        return lines

    def _prefetch(self, raxes: tuple[int, ...], slots: list[int], k: int) -> list[str]:
        """Load the row element(s) at ``r`` of each leaf into register cache step ``k``."""
        if self.vrow:
            lines = [f"{self.idx} base = rowbase + r;"]
            return lines + [f"c{s}_{k} = {self._vec_load(self.leaves[s].dtype, s)};"
                            for s in slots]
        lines = self._unravel_r(raxes)
        for s in slots:
            name, lrank, unit = self.leaves[s]  # a Leaf
            addr = self._addr(0, lrank, f"o{s}", f"s{s}_", unit)
            lines.append(f"c{s}_{k} = {self.lang.load_expr(name, f'b{s}', addr)};")
        return lines

    def _vec_type(self, name: str) -> str:
        return self.lang.vector_type(name, self.vrow)

    def _vec_load(self, name: str, slot: int) -> str:
        return self.lang.vector_load(name, self.vrow, f"b{slot} + o{slot} + base")

    def _vec_loads(self, instrs: tuple[Instr, ...], k: int | None) -> list[str]:
        """Vector loads at ``base`` of the leaves ``instrs`` read along the row (into the
        register cache at step ``k``, or from it when an earlier pass filled it)."""
        lines = []
        for s in self._row_slots(instrs):
            name = self.leaves[s].dtype
            if k is None:
                lines.append(f"{self._vec_type(name)} lv{s} = {self._vec_load(name, s)};")
                self._vec_name[s] = f"lv{s}"
            else:
                if s not in self._filled:
                    lines.append(f"c{s}_{k} = {self._vec_load(name, s)};")
                self._vec_name[s] = f"c{s}_{k}"
        return lines

    def _group_step(self, raxes: tuple[int, ...], instrs: tuple[Instr, ...], body: int, at: str,
                    comb: str, acc: str, pos: str, k: int | None) -> list[str]:
        """Accumulate the row element(s) at ``pos`` into ``acc``."""
        if not self.vrow:
            self._cache_k = k
            lines = self._reduce_step(raxes, instrs, body, at, comb, acc, pos)
            self._cache_k = None
            return lines
        lines = [f"{self.idx} base = rowbase + {pos};"]
        lines += self._vec_loads(instrs, k)
        for c in range(self.vrow):
            self._comp = c
            block = self._instrs(instrs)
            val = f"v{body}" if self._types[body] == at else f"({at})(v{body})"
            block.append(f"{acc} = " + comb.format(a=acc, b=val, T=at) + ";")
            lines += ["{"] + ["    " + b for b in block] + ["}"]
        self._comp = None
        return lines

    def _group_reduce(self, slot: int, body: int, instrs: tuple[Instr, ...], at: str, ident: str,
                      comb: str, raxes: tuple[int, ...], L: int, cached: bool) -> list[str]:
        idx = self.idx
        V = self.vrow or 1
        lines = ["{", f"    {at} acc = ({at})({ident});"]
        if cached:
            for k in range(self.cache):
                lines.append("    {")
                lines.append(f"        {idx} r = rbeg + lid * {V} + {k * L * V};")
                lines.append("        if (r < rend) {")
                lines += ["            " + s for s in self._group_step(
                    raxes, instrs, body, at, comb, "acc", "r", k)]
                lines.append("        }")
                lines.append("    }")
        else:
            # PERF: independent accumulators over unrolled strided steps: several loads in
            # flight per work-item, each step coalesced across the work-group.
            lines += self._unrolled_accumulate(
                at, ident, comb, self.lang.group_unroll, f"rbeg + lid * {V}", L * V,
                lambda a, pos: self._group_step(raxes, instrs, body, at, comb, a, pos, None))
        lines += ["    " + s for s in self._finish(slot, at, comb, L)]
        lines.append("}")
        return lines

    def _unrolled_accumulate(self, at: str, ident: str, comb: str, U: int, start: str,
                             stride: int, step: Any) -> list[str]:
        """Lines folding the row elements ``start``, ``start + stride``, ... (< rend) into
        ``acc``: ``U`` independent accumulators over unrolled steps, then the remainder.
        ``step(acc, pos)`` gives the lines that add the element at ``pos`` to ``acc``."""
        # PERF: the unit-stride (CPU) loop keeps the form its timings were taken with (`r + U
        # <= rend`, `r++`): with the strided form's text a float32 sum on PoCL ran 1.3-1.8x
        # slower in paired runs (though this VM's noise reaches 1.2x).
        head = f"r + {U} <= rend; r += {U}" if stride == 1 else \
            f"r + {(U - 1) * stride} < rend; r += {U * stride}"
        lines = [f"    {at} " + ", ".join(f"acc{u} = ({at})({ident})" for u in range(U)) + ";",
                 f"    {self.idx} r = {start};", f"    for (; {head}) {{"]
        for u in range(U):
            lines.append("        {")
            lines += ["            " + s for s in step(f"acc{u}", f"r + {u * stride}")]
            lines.append("        }")
        lines += ["    }", "    for (; r < rend; r++) {" if stride == 1 else
                  f"    for (; r < rend; r += {stride}) {{"]
        lines += ["        " + s for s in step("acc", "r")]
        lines.append("    }")
        for u in range(U):
            lines.append("    acc = " + comb.format(a="acc", b=f"acc{u}", T=at) + ";")
        return lines

    def _shfl_ok(self, at: str) -> bool:
        return self.shfl and at in self.lang.shfl_funcs

    def _finish(self, slot: int, at: str, comb: str, L: int) -> list[str]:
        """Combine the work-group's accumulators into ``red{slot}``, seen by every work-item."""
        sc = f"scratch{slot}"
        if self._shfl_ok(at):
            # NVIDIA: butterfly shuffles within each warp of 32, one barrier, then every warp
            # combines the per-warp values itself (each lane ends with the total).
            self._uses_shfl = True
            fn, nw = self.lang.shfl_funcs[at], L // 32
            # Every lane of the warp must reach each shuffle: take it before the combine
            # (a combine may name its operand twice, once in a conditional).
            step = (f"{{ {at} o = {fn}(acc, s); acc = "
                    + comb.format(a="acc", b="o", T=at) + "; }")
            lines = [f"for (int s = 16; s > 0; s >>= 1) {step}",
                     f"if ((lid & 31) == 0) {sc}[lid >> 5] = acc;", self.lang.barrier,
                     f"acc = {sc}[lid & {nw - 1}];"]
            if nw > 1:
                lines.append(f"for (int s = {nw // 2}; s > 0; s >>= 1) {step}")
            lines.append(f"red{slot} = acc;")
            return lines
        return [f"{sc}[lid] = acc;", self.lang.barrier,
                f"for (int s = {L // 2}; s > 0; s >>= 1) {{",
                f"    if (lid < s) {sc}[lid] = " + comb.format(
                    a=f"{sc}[lid]", b=f"{sc}[lid + s]", T=at) + ";",
                f"    {self.lang.barrier}", "}", f"red{slot} = {sc}[0];"]

    def _row_out_step(self, raxes: tuple[int, ...], out_instrs: tuple[Instr, ...],
                      outs: tuple[KernelOutput, ...], pos: str,
                      k: int | None) -> list[str]:
        """Compute and store the outputs of the row element(s) at ``pos``."""
        if not self.vrow:
            self._cache_k = k
            lines = self._unravel_r(raxes, pos)
            lines += self._instrs(out_instrs)
            lines += self._stores(outs)
            self._cache_k = None
            return lines
        n = self.vrow
        lines = [f"{self.idx} base = rowbase + {pos};"]
        lines += self._vec_loads(out_instrs, k)
        lines += self._sv_decls(outs, n)
        for c in range(n):
            self._comp = c
            block = self._instrs(out_instrs) + self._sv_component(outs, c)
            lines += ["{"] + ["    " + b for b in block] + ["}"]
        self._comp = None
        return lines + self._sv_stores(outs, n)

    def _sv_decls(self, outs: tuple[KernelOutput, ...], n: int) -> list[str]:
        """The vectors ``sv<k>`` the outputs' values are gathered in, ``n`` per work-item."""
        return [f"{self.lang.vector_type(o.dtype, n)} sv{k};" for k, o in enumerate(outs)]

    def _sv_component(self, outs: tuple[KernelOutput, ...], c: int) -> list[str]:
        return [self.lang.vector_store_component(o.dtype, f"sv{k}.s{c:x}", f"v{o.value}")
                for k, o in enumerate(outs)]

    def _sv_stores(self, outs: tuple[KernelOutput, ...], n: int) -> list[str]:
        return [self.lang.vector_store(o.dtype, n, f"sv{k}", f"out{k} + oo{k} + base")
                for k, o in enumerate(outs)]

    def _reduce_step(self, raxes: tuple[int, ...], instrs: tuple[Instr, ...], body: int, at: str,
                     comb: str, acc: str, r: str) -> list[str]:
        lines = self._unravel_r(raxes, r)
        lines += self._instrs(instrs)
        val = f"v{body}" if self._types[body] == at else f"({at})(v{body})"
        lines.append(f"{acc} = " + comb.format(a=acc, b=val, T=at) + ";")
        return lines

    def _unravel_r(self, raxes: tuple[int, ...], r: str = "r") -> list[str]:
        lines = [f"{self.idx} t_r = {r};"]
        for j in reversed(raxes[1:]):
            lines.append(f"i{j} = t_r % n{j}; t_r /= n{j};")
        lines.append(f"i{raxes[0]} = t_r;")
        return lines
