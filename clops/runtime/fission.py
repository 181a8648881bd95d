"""Runtime, fission: split a device into sub-devices (OpenCL device partitioning). Each
sub-device is a ``CLDevice`` of its own (queues, pool, program cache); the sub-devices of one
split share one context, so a tensor moves between them by a device-side copy (``to_device``),
and between them and their parent through the host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import pyopencl as cl

from . import discovery, registry

if TYPE_CHECKING:
    from .protocols import Device

D = TypeVar("D", bound="Device")

_PP = cl.device_partition_property
_AFFINITY = {
    "numa": cl.device_affinity_domain.NUMA,
    "l4": cl.device_affinity_domain.L4_CACHE,
    "l3": cl.device_affinity_domain.L3_CACHE,
    "l2": cl.device_affinity_domain.L2_CACHE,
    "l1": cl.device_affinity_domain.L1_CACHE,
    "next": cl.device_affinity_domain.NEXT_PARTITIONABLE,
}


class FissionError(RuntimeError):
    """A device cannot be split the way that was asked."""


def partition_support(dev: Device) -> dict[str, object]:
    """What partitioning a device supports: the largest number of sub-devices, the partition
    types (``"equally"``, ``"by_counts"``, ``"by_affinity_domain"``) and affinity domains.

    >>> clops.device("cpu").partition_support()["max_sub_devices"] >= 0
    True
    """
    d = dev.cl_device
    try:
        max_sub = int(d.partition_max_sub_devices)
        plist: Any = d.partition_properties or []
        props = [int(p) for p in plist]
        raw: Any = d.partition_affinity_domain or 0
        # Some pyopencl versions return the flags as a list.
        domains = sum(int(x) for x in raw) if isinstance(raw, list) else int(raw)
    except (cl.Error, AttributeError):
        max_sub, props, domains = 0, [], 0
    names = {int(_PP.EQUALLY): "equally", int(_PP.BY_COUNTS): "by_counts",
             int(_PP.BY_AFFINITY_DOMAIN): "by_affinity_domain"}
    return {
        "max_sub_devices": max_sub,
        "types": [names[p] for p in props if p in names],
        "affinity_domains": [k for k, v in _AFFINITY.items() if domains & int(v)],
    }


def create_sub_devices(dev: D, n: int | None = None, *, units: int | None = None,
                       counts: list[int] | None = None,
                       affinity: str | None = None) -> list[D]:
    """Split ``dev`` into sub-devices: ``n`` of them with equal compute units (the default is
    one per compute unit, up to the device's maximum), ``units`` compute units each, explicit
    ``counts`` per sub-device, or along an ``affinity`` domain (``"numa"``, ``"l1"`` ..
    ``"l4"``, ``"next"``).

    Raises ``FissionError`` naming what the device does support when it cannot. Each
    sub-device is of ``dev``'s class, made as ``type(dev)(entry, selector, context=)``.

    >>> subs = clops.device("cpu").create_sub_devices(2)
    >>> [s.caps.compute_units for s in subs]
    [1, 1]
    """
    sup = partition_support(dev)
    max_sub = int(sup["max_sub_devices"])  # type: ignore[call-overload]
    types: list[str] = sup["types"]  # type: ignore[assignment]
    cu = dev.caps.compute_units
    if max_sub <= 1 or not types:
        raise FissionError(
            f"{dev.name} cannot be split into sub-devices (its driver reports "
            f"{max_sub} sub-devices and partition types {types or 'none'}); use several queues "
            "on the device (device.create_queue()) for concurrency instead")
    given = [x is not None for x in (n, units, counts, affinity)]
    if sum(given) > 1:
        raise ValueError("create_sub_devices: give one of n, units, counts or affinity")
    if affinity is not None:
        if "by_affinity_domain" not in types or not sup["affinity_domains"]:
            raise FissionError(
                f"{dev.name} does not partition by affinity domain (supported: {types}); "
                "split it by n, units or counts instead")
        key = affinity.lower().removesuffix("_cache")
        if key not in _AFFINITY:
            raise ValueError(f"unknown affinity domain {affinity!r}; one of {list(_AFFINITY)}")
        if key != "next" and key not in sup["affinity_domains"]:  # type: ignore[operator]
            raise FissionError(f"{dev.name} does not partition along {affinity!r}; its "
                               f"domains are {sup['affinity_domains']}")
        spec = [int(_PP.BY_AFFINITY_DOMAIN), int(_AFFINITY[key])]
    elif counts is not None:
        if "by_counts" not in types:
            raise FissionError(f"{dev.name} does not partition by counts (supported: {types})")
        if not counts or any(c <= 0 for c in counts) or sum(counts) > cu or \
                len(counts) > max_sub:
            raise ValueError(f"counts {counts} do not fit {dev.name}: {cu} compute units, at "
                             f"most {max_sub} sub-devices, each count positive")
        spec = [int(_PP.BY_COUNTS), *counts, int(_PP.BY_COUNTS_LIST_END)]
    else:
        if units is None:
            if n is not None and n > min(max_sub, cu):
                # NOTE: never fewer than asked in silence: a caller counting on n workers or
                # queues would get fewer
                raise FissionError(
                    f"{dev.name} splits into at most {min(max_sub, cu)} sub-devices ({cu} "
                    f"compute units, its driver allows {max_sub}); {n} were asked")
            n = min(n or cu, max_sub, cu)
            if n < 1:
                raise ValueError(f"cannot split {dev.name} into {n} sub-devices")
            units = cu // n
        if units < 1 or units > cu:
            raise ValueError(f"{units} compute units per sub-device do not fit {dev.name} "
                             f"({cu} compute units)")
        if "equally" in types:
            spec = [int(_PP.EQUALLY), units]
            want = cu // units if n is None else n
        else:
            want = cu // units if n is None else n
            spec = [int(_PP.BY_COUNTS), *([units] * want), int(_PP.BY_COUNTS_LIST_END)]
    try:
        subs = dev.cl_device.create_sub_devices(spec)  # type: ignore[arg-type]
    except cl.Error as e:
        raise FissionError(f"{dev.name} refused the partition {spec}: {e}") from None
    if spec[0] == int(_PP.EQUALLY):
        subs = subs[:want]
    out: list[D] = []
    make: Any = type(dev)
    parent = dev.entry
    # the siblings share one context: a tensor moves between them by a device-side copy
    ctx = cl.Context(list(subs))
    for i, sub in enumerate(subs):
        entry = discovery.DeviceEntry(parent.platform, sub, parent.kind, parent.backend)
        child = make(entry, f"{dev.selector}.{i}", context=ctx)
        child.parent = dev  # type: ignore[attr-defined]  # NOTE: keeps the parent alive
        registry.register(child, sub.int_ptr)  # seen by clops.synchronize() and empty_cache()
        out.append(child)
    return out
