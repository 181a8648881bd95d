"""clops: arrays, neural networks and LLM inference on any OpenCL device."""

from __future__ import annotations

from . import _config, linalg  # noqa: E402  (linalg: the Array API linalg extension)
from .array.api import *  # noqa: F403  (the Array API namespace)
from .array.api import __all__ as _array_all
from .array.creation import from_host
from .array.jit import JitError, jit
from .array.tensor import asnumpy
from .runtime import (
    BuildError,
    CLDevice,
    CLQueue,
    DeviceNotFoundError,
    Event,
    context,
    device,
    devices,
    empty_cache,
    launches,
    memory_stats,
    profile,
    set_default_device,
    synchronize,
)

__version__ = "0.1.0"
# NOTE: ``__array_api_version__`` is not a global: __getattr__ below reads it from the
# configuration (CLOPS_ARRAY_API_VERSION: "2024.12", the default, or "2025.12"), so that
# clops._config.reload() switches it as array-api-strict's flags do.

# -- asynchronous programming model: streams, transfers, fission, custom kernels, native interop
from . import native, random  # noqa: E402
from .custom import (  # noqa: E402
    CustomKernel,
    ElementwiseKernel,
    ReductionKernel,
    ScanKernel,
    kernel,
)
from .native import from_pyopencl, get_include, native_call, to_pyopencl  # noqa: E402
from .runtime import Buffer, gather, wait_all, when_done  # noqa: E402
from .runtime.fission import FissionError  # noqa: E402
from .runtime.interop import keepalive, local_memory  # noqa: E402
from .runtime.streams import current_queue, stream, use_queue  # noqa: E402
from .transfer import from_host_async, to_host_future  # noqa: E402

_LAZY = ("llm", "nn", "providers")  # subpackages imported on first use: clops.llm.load()


def __getattr__(name: str) -> object:
    if name == "__array_api_version__":
        return _config.CONFIG.array_api_version
    if name in _LAZY:
        import importlib

        mod = importlib.import_module(f".{name}", __name__)
        globals()[name] = mod
        return mod
    # The fft extension is imported on first use (it brings its providers with it).
    if name == "fft":
        import importlib

        try:
            mod = importlib.import_module(".fft", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.fft":
                raise
            raise AttributeError("clops.fft is not available in this installation") from e
        globals()["fft"] = mod
        return mod
    raise AttributeError(f"module 'clops' has no attribute {name!r}")
