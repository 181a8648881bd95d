"""Runtime, capabilities: ``DeviceCaps``, what a device can do, read from the driver's device
attributes; the run-time probes' answers (``probes.py``) fill in its last fields."""

from __future__ import annotations

from dataclasses import dataclass

import pyopencl as cl


@dataclass(frozen=True)
class DeviceCaps:
    """What a device can do, probed once and cached on disk per device and driver."""

    name: str
    vendor: str
    platform: str
    driver: str
    opencl_version: str
    kind: str
    compute_units: int
    global_mem: int
    max_alloc: int
    local_mem: int
    max_work_group: int
    max_work_item_sizes: tuple[int, ...]
    preferred_vector_width_float: int
    fp64: bool
    fp16_extension: bool
    subgroups: bool
    extensions: tuple[str, ...]
    address_bits: int
    unified_memory: bool
    # fused multiply-add for float reported (CL_FP_FMA): kernels may call fma() for it
    fma: bool = False
    # bytes of a kernel's arguments (CL_DEVICE_MAX_PARAMETER_SIZE; 1024 at least)
    max_parameter_size: int = 1024
    # floats in the vectors the device's arithmetic runs natively (CL_DEVICE_NATIVE_VECTOR_WIDTH_
    # FLOAT: a CPU with AVX-512 16, with AVX2 8, as its runtime compiles for it; 0 unknown)
    native_vector_width_float: int = 0
    # Run-time probes (compile and run a small kernel); None means not yet probed.
    fp16: bool | None = None
    nvidia_ptx: bool | None = None
    builds: bool | None = None


# The fields the run-time probes fill (``probes.run_stored``).
PROBED = ("fp16", "nvidia_ptx", "builds")


def static_caps(d: cl.Device, name: str, platform: str, driver: str, kind: str) -> DeviceCaps:
    """The capabilities the driver reports for ``d`` (the probed fields left unknown)."""
    exts = tuple(sorted(d.extensions.split()))
    return DeviceCaps(
        name=name, vendor=d.vendor.strip(), platform=platform,
        driver=driver, opencl_version=d.version, kind=kind,
        compute_units=d.max_compute_units, global_mem=d.global_mem_size,
        max_alloc=d.max_mem_alloc_size, local_mem=d.local_mem_size,
        max_work_group=d.max_work_group_size,
        max_work_item_sizes=tuple(d.max_work_item_sizes),
        preferred_vector_width_float=d.preferred_vector_width_float,
        fp64="cl_khr_fp64" in exts or bool(getattr(d, "double_fp_config", 0)),
        fp16_extension="cl_khr_fp16" in exts,
        subgroups="cl_khr_subgroups" in exts or "cl_intel_subgroups" in exts,
        extensions=exts, address_bits=d.address_bits,
        unified_memory=bool(d.host_unified_memory),
        fma=bool(int(d.single_fp_config) & int(cl.device_fp_config.FMA)),
        max_parameter_size=int(d.max_parameter_size),
        native_vector_width_float=int(d.native_vector_width_float),
    )
