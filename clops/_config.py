"""Configuration: every CLOPS_* environment flag is read here and nowhere else."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30,
          "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def parse_bytes(text: str) -> int:
    """Parse a byte count such as ``"1048576"``, ``"512MB"`` or ``"1.5 GiB"``.

    >>> parse_bytes("512MB")
    536870912
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if m is None or m.group(2).upper() not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a byte count: write a number of bytes, "
            "optionally with a unit (K, KB, MB, MiB, GB, GiB), e.g. '512MB'"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass(frozen=True)
class Config:
    device: str | None
    debug: int
    memory_limit: int | None
    disk_cache: bool
    providers: str | None
    test_devices: str | None
    array_api_version: str


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


# The Array API versions clops.__array_api_version__ may report (CLOPS_ARRAY_API_VERSION picks
# one; the default is the first). Where versions differ (2025.12 returns tuples from meshgrid,
# broadcast_arrays and devices(), where 2024.12 returns lists), the chosen one decides.
ARRAY_API_VERSIONS = ("2024.12", "2025.12")


def _array_api_version() -> str:
    raw = os.environ.get("CLOPS_ARRAY_API_VERSION", "").strip()
    if not raw:
        return ARRAY_API_VERSIONS[0]
    if raw not in ARRAY_API_VERSIONS:
        raise ValueError(f"CLOPS_ARRAY_API_VERSION={raw!r}: clops implements the Array API "
                         f"versions {', '.join(ARRAY_API_VERSIONS)}")
    return raw


def read() -> Config:
    """Read the environment now (tests may change it and call this again)."""
    limit = os.environ.get("CLOPS_MEMORY_LIMIT")
    return Config(
        device=os.environ.get("CLOPS_DEVICE") or None,
        debug=_int("CLOPS_DEBUG", 0),
        memory_limit=parse_bytes(limit) if limit else None,
        disk_cache=os.environ.get("CLOPS_DISK_CACHE", "1") not in ("0", "false", "no"),
        providers=os.environ.get("CLOPS_PROVIDERS") or None,
        test_devices=os.environ.get("CLOPS_TEST_DEVICES") or None,
        array_api_version=_array_api_version(),
    )


CONFIG = read()


def cache_dir() -> str | None:
    """``CLOPS_CACHE_DIR``, read when asked (tests point it at temporary folders)."""
    return os.environ.get("CLOPS_CACHE_DIR") or None


DEFAULT_CACHE_LIMIT = 2 << 30


def cache_limit() -> int:
    """``CLOPS_CACHE_LIMIT``: the most bytes the kernel caches (program binaries and PoCL's
    kernels) keep, read when asked; default 2 GiB, ``0`` for no limit."""
    raw = os.environ.get("CLOPS_CACHE_LIMIT", "").strip()
    if not raw:
        return DEFAULT_CACHE_LIMIT
    try:
        return parse_bytes(raw)
    except ValueError as e:
        raise ValueError(f"CLOPS_CACHE_LIMIT: {e}") from None


def raw_enqueue() -> bool:
    """``CLOPS_RAW_ENQUEUE`` (default on): launch plans replay on GPUs without events."""
    return os.environ.get("CLOPS_RAW_ENQUEUE", "1") not in ("0", "false", "no")


def native_replay() -> bool:
    """``CLOPS_NATIVE_REPLAY`` (default on): a launch plan's event-free enqueues go to the driver
    from one call into a small C loop built with the system's C compiler (where one is found),
    not one Python call a launch."""
    return os.environ.get("CLOPS_NATIVE_REPLAY", "1") not in ("0", "false", "no", "off")


def native_cpu() -> bool:
    """``CLOPS_NATIVE_CPU`` (default on): CPU devices run the LLM's products and decode attention
    as native kernels compiled with the system's C compiler, where it is found and the CPU has
    AVX2 with FMA (or AVX-512 with VNNI); ``0``: OpenCL C kernels only; ``avx2``: built for AVX2
    even where the CPU has AVX-512 (to measure what an AVX2 machine runs)."""
    return os.environ.get("CLOPS_NATIVE_CPU", "1") not in ("0", "false", "no", "off")


def native_cpu_avx2() -> bool:
    """``CLOPS_NATIVE_CPU=avx2``: the native CPU kernels built for AVX2 (no AVX-512)."""
    return os.environ.get("CLOPS_NATIVE_CPU", "").lower() == "avx2"


def tma() -> bool:
    """``CLOPS_TMA`` (default on): Hopper GPUs' float16 products take their tiles through the
    tensor memory accelerator, whose tensor maps the CUDA driver encodes: a CUDA context on the
    GPU (524 MiB of its memory on an H100, none more where the process has one already) for a
    GEMM 7-8% faster; ``0``: the cp.async producer warps, no CUDA context."""
    return os.environ.get("CLOPS_TMA", "1") not in ("0", "false", "no", "off")


def command_buffers() -> str:
    """``CLOPS_COMMAND_BUFFERS``: "auto" (unset; launch plans of GPUs and other accelerators
    are recorded into command buffers where the device has ``cl_khr_command_buffer``), "1" (of
    every such device, CPUs too) or "0" (never)."""
    raw = os.environ.get("CLOPS_COMMAND_BUFFERS", "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    if raw in ("0", "false", "no", "off"):
        return "off"
    if raw in ("1", "true", "yes", "on"):
        return "on"
    raise ValueError(f"CLOPS_COMMAND_BUFFERS={raw!r}: use 0, 1 or auto")


def _on(name: str) -> bool:
    """A flag on unless set to 0 (false, no, off)."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def progress() -> bool:
    """``CLOPS_PROGRESS`` (default on): a note on the terminal while programs compile."""
    return _on("CLOPS_PROGRESS")


def token_queue() -> bool:
    """``CLOPS_TOKEN_QUEUE`` (default on): generation on GPUs reads each token on a queue of its
    own."""
    return _on("CLOPS_TOKEN_QUEUE")


def head_greedy() -> bool:
    """``CLOPS_HEAD_GREEDY`` (default on): the LM head makes a decode row's greedy token too
    (NVIDIA)."""
    return _on("CLOPS_HEAD_GREEDY")


def layer_kernel() -> bool:
    """``CLOPS_LAYER_KERNEL`` (default on): decode rows run many layers a launch on GPUs."""
    return _on("CLOPS_LAYER_KERNEL")


def layer_kernel_f16() -> bool:
    """``CLOPS_LAYER_KERNEL_F16`` (default on): the layer kernel takes float16 weights."""
    return _on("CLOPS_LAYER_KERNEL_F16")


def fuse_down() -> bool:
    """``CLOPS_FUSE_DOWN`` (default on): the layer kernel may run the down projection inside
    the [gate | up] phase."""
    return _on("CLOPS_FUSE_DOWN")


def device_selector() -> str | None:
    """``CLOPS_DEVICE``, read now (a Dask worker's process has its own)."""
    return os.environ.get("CLOPS_DEVICE") or None


def dask_subdevice() -> tuple[int, int] | None:
    """``CLOPS_DASK_SUBDEVICE`` ("i/n", set by ``clops.dask.LocalCluster`` for each worker):
    the worker takes sub-device i of its device split in n."""
    raw = os.environ.get("CLOPS_DASK_SUBDEVICE")
    if not raw:
        return None
    i, n = (int(v) for v in raw.split("/"))
    return i, n


def api_key() -> str | None:
    """``CLOPS_API_KEY``: the key ``clops serve`` asks API requests for (``--api-key`` wins)."""
    return os.environ.get("CLOPS_API_KEY") or None


def debug_level() -> int:
    return CONFIG.debug


def visible_devices() -> str | None:
    """``CLOPS_VISIBLE_DEVICES``: comma-separated selectors of the only devices clops lists (as
    ``CUDA_VISIBLE_DEVICES``; read when devices are first listed)."""
    return os.environ.get("CLOPS_VISIBLE_DEVICES") or None


def reload() -> Config:
    global CONFIG
    CONFIG = read()
    return CONFIG
