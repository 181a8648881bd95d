"""Kernels, launching: loads ``.cl`` sources and builds them per device and compile-time
parameters; launchers return ``Launch`` objects of the runtime's seam (``runtime/plan.py``),
which ``LaunchPlan`` replays (a decode step is one replay: only its enqueues)."""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import numpy as np

from ..graph.dtypes import DType
from ..runtime import CLDevice, cltypes
from ..runtime.plan import Launch, LaunchPlan
from ..runtime.program import new_kernel, spare_ok

__all__ = ["HEADERS", "Launch", "LaunchPlan", "expand_includes", "f32", "flat_geometry",
           "float_define", "i32", "is_cpu", "kernel", "math_options", "pow2_at_most", "program",
           "shared_kernel", "source"]


# ``#include "clops/<file>.cl"``: a header of this folder that user kernels include too
# (``clops.custom``), pasted in so that the program cache sees it.
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]clops/([A-Za-z0-9_]+\.cl)[>"][ \t]*'
                      r'(//.*)?$', re.M)
HEADERS = ("philox.cl",)  # the Philox counter-based generator (clops.random documents it)
# headers of clops' own kernels only: NVIDIA PTX helpers (included where the PTX probe passed),
# the KV cache's element type, split partials' combine, the fence before a partial's count and
# the token choice's reductions, a mixture of experts' grouped products, horizontal sums and the
# 4-byte dot product, the weight formats' storage types, the rotary pairs, the radix sorts' keys;
# and the matrix-vector kernels, which the tensor cores' int8 rows product (qmma.cl) extends
INTERNAL_HEADERS = ("ptx.cl", "kv.cl", "partials.cl", "fence.cl", "choose.cl", "experts.cl",
                    "vec.cl", "formats.cl", "rope.cl", "sortkey.cl", "matmul.cl")


def expand_includes(source: str, internal: bool = False) -> str:
    """Replace ``#include "clops/<file>.cl"`` with the header (one of ``HEADERS``, or with
    ``internal``, of ``INTERNAL_HEADERS`` too)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in HEADERS + (INTERNAL_HEADERS if internal else ()):
            raise FileNotFoundError(f"#include: clops has no {m.group(1)}; available: "
                                    f"{list(HEADERS)}")
        # (a header's own includes too: qmma.cl includes matmul.cl, which includes headers)
        return expand_includes(resources.files(__package__).joinpath(m.group(1)).read_text(),
                               internal)

    return _INCLUDE.sub(sub, source)


@functools.cache
def source(name: str) -> str:
    """The text of ``clops/kernels/<name>.cl``, with its ``#include "clops/<file>.cl"`` lines
    replaced by the headers."""
    return expand_includes(resources.files(__package__).joinpath(f"{name}.cl").read_text(),
                           internal=True)


def _options(defines: dict[str, Any]) -> tuple[str, ...]:
    """Build options of ``defines`` (``-DNAME=value`` in name order; ``_fast``: relaxed math).

    PERF: remembered by the defines with their values' types (1 and 1.0 spell differently):
    2.5 -> 0.9 us, paid at every hand kernel's launch."""
    return _spelled(tuple((k, type(v), v) for k, v in defines.items()))


@functools.lru_cache(maxsize=4096)
def _spelled(defines: tuple[tuple[str, type, Any], ...]) -> tuple[str, ...]:
    named = {k: v for k, _, v in defines}
    opts = ["-cl-fast-relaxed-math"] if named.pop("_fast", False) else []
    opts += [f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in sorted(named.items())]
    return tuple(opts)


def program(dev: CLDevice, name: str, **defines: Any) -> Any:
    """The built program of ``name.cl`` with ``-D`` ``defines`` (cached by the device)."""
    return dev.build(source(name), _options(defines))


def kernel(dev: CLDevice, name: str, function: str, **defines: Any) -> Any:
    """A kernel object of its own (its own argument slots) for ``function`` in ``name.cl``: new,
    or one a launch run once gave back (``Launch.run_once``).

    NOTE: every launch recorded in a plan gets its own kernel object, so that its arguments are
    set once and a replay only enqueues.
    """
    return spare_ok(new_kernel(program(dev, name, **defines), function, f"{name}.cl"))


def eager_kernel(dev: CLDevice, name: str, function: str, arg_types: list[Any],
                 **defines: Any) -> Any:
    """The device's one kernel object for ``function`` in ``name.cl`` with ``-D`` ``defines``,
    for launches one at a time (``dev.launch`` sets its arguments at each), told its arguments'
    types (``arg_types``: numpy scalar types, None for buffers).

    PERF: a new kernel object costs pyopencl about 0.08 ms and setting arguments of unknown
    types about 5 us each; with this a launch's host work is a few microseconds."""
    return dev.kernel(source(name), function, _options(defines), arg_types)


def shared_kernel(dev: CLDevice, name: str, function: str, options: tuple[str, ...]) -> Any:
    """The device's cached kernel object for ``function`` in ``name.cl`` built with
    ``options`` (one object for every caller: launches set its arguments each time)."""
    return dev.kernel(source(name), function, options)


# -- the array kernels (gather, scan, sort, linalg): one program per (file, element type) -------
def math_options(dtype: DType) -> tuple[str, ...]:
    """Build options of the kernels that compute on ``dtype`` (``-DT=`` its math type)."""
    opts = [f"-DT={cltypes.math(dtype) if dtype.kind != 'b' else 'uchar'}"]
    if dtype.kind == "f":
        opts.append("-DIS_FLOAT")
    if dtype.kind == "c":
        opts.append("-DCOMPLEX")
    if dtype.needs_fp64:
        opts.append("-DFP64")
    return tuple(opts)


def flat_geometry(dev: CLDevice, n: int) -> tuple[tuple[int], tuple[int] | None]:
    """Global and local size of a launch of ``n`` work-items: the driver's choice on CPUs,
    groups of up to 256 elsewhere."""
    if dev.kind == "cpu":
        return (n,), None
    wg = min(256, dev.caps.max_work_group)
    return (-(-n // wg) * wg,), (wg,)



def i32(v: int) -> np.int32:
    return np.int32(v)


def f32(v: float) -> np.float32:
    return np.float32(v)


def is_cpu(dev: CLDevice) -> bool:
    """Whether ``dev`` is a CPU: the launchers' one question about the device kind (tests set
    it to take the GPU paths on a CPU)."""
    return dev.kind == "cpu"


def narrow_cpu(dev: CLDevice | None) -> bool:
    """Whether ``dev`` is a CPU whose native float vectors are 8 wide or fewer (AVX2: 16
    registers of 8), where the CPU kernels' 16-wide vectors take 2 registers each: fewer sums
    per work-item fit (``matmul.rb_rows``, ``gemm.gemm_cpu``)."""
    return (dev is not None and dev.kind == "cpu"
            and 0 < dev.caps.native_vector_width_float < 16)


def pow2_at_most(n: int) -> int:
    """The largest power of two not above ``n`` (1 for n < 2)."""
    return 1 << max(0, int(n).bit_length() - 1)


def float_define(v: float) -> str:
    """A float32 value as an OpenCL C literal, for a -D define."""
    return f"{float(np.float32(v))!r}f"
