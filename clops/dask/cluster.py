"""dask, cluster: a ``dask.distributed`` cluster on this machine with one worker process per
OpenCL device (``CLOPS_DEVICE`` set for each), or per sub-device of a CPU split with OpenCL's
device fission (``split=``), each worker declaring one ``OPENCL`` resource."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distributed import Nanny, Scheduler, SpecCluster


def device_selectors(devices: str | Sequence[str] | None = None) -> list[str]:
    """One selector (``opencl:gpu:0``, ...) per device that ``devices`` lists: a kind
    (``"gpu"``, ``"cpu"``), a selector list (``"gpu:0,gpu:1"``) or a sequence of selectors;
    None: the default device (``clops.device()``). Every GPU the driver lists gets its own
    worker. ``"cpu"`` gives the one CPU device ``clops.device("cpu")`` picks: the CPU
    runtimes OpenCL lists (PoCL, Intel's) drive the same cores (``split`` gives a worker per
    sub-device). A listed device whose runtime cannot build a kernel (``clops info`` says
    why) gets no worker."""
    import clops

    if devices is None:
        return [clops.device().selector]
    text = devices if isinstance(devices, str) else ",".join(devices)
    if text.strip().lower() == "cpu":
        return [clops.device("cpu").selector]
    found = clops.devices(text)
    if not found:
        raise LookupError(f"no OpenCL device matches {text!r} (clops info lists them)")
    builds = [d for d in found if d.probe("builds")]
    if not builds:
        raise LookupError(f"no device {text!r} lists can build a kernel: "
                          f"{', '.join(d.selector for d in found)} (clops info says why)")
    out: list[str] = []
    for d in builds:
        if d.selector not in out:
            out.append(d.selector)
    return out


def _check_split(selector: str, split: int) -> None:
    """Raise here, before any worker starts, if ``selector``'s device cannot give ``split``
    sub-devices (a worker that cannot take its sub-device would never start)."""
    import clops

    dev = clops.device(selector)
    sup = dev.partition_support()
    most = min(int(sup["max_sub_devices"]), dev.caps.compute_units)  # type: ignore[call-overload]
    if "equally" not in sup["types"] or most < 2:  # type: ignore[operator]
        raise ValueError(f"{selector} ({dev.name}) cannot be split into sub-devices; start "
                         "one worker per device instead (leave split out)")
    if split > most:
        raise ValueError(f"{selector} ({dev.name}) splits into at most {most} sub-devices "
                         f"(one per compute unit), not {split}; ask for split={most} or fewer")


def worker_specs(devices: str | Sequence[str] | None = None, split: int | None = None,
                 threads: int = 1, memory_limit: str | int = "auto",
                 env: dict[str, str] | None = None, silence_logs: int = 40) -> dict[str, dict]:
    """The ``SpecCluster`` worker specifications of ``LocalCluster``: one ``Nanny`` per device
    (per sub-device with ``split``), named ``clops-0``, ``clops-1``, ..., each with its own
    ``CLOPS_DEVICE`` and an ``OPENCL: 1`` resource."""
    sels = device_selectors(devices)
    if split is not None and split < 2:
        raise ValueError(f"split must be 2 or more sub-devices, not {split}")
    if split is not None:
        for sel in sels:
            _check_split(sel, split)
    entries = [(s, f"{i}/{split}" if split else "") for s in sels for i in range(split or 1)]
    workers = {}
    for j, (sel, part) in enumerate(entries):
        wenv = {**(env or {}), "CLOPS_DEVICE": sel}
        if part:
            wenv["CLOPS_DASK_SUBDEVICE"] = part
        workers[f"clops-{j}"] = {"cls": Nanny, "options": {
            "nthreads": threads, "env": wenv, "resources": {"OPENCL": 1},
            "memory_limit": memory_limit, "preload": ["clops.dask.worker"],
            "dashboard_address": None, "silence_logs": silence_logs}}
    return workers


class LocalCluster(SpecCluster):
    """One Dask worker per OpenCL device.

    >>> from distributed import Client
    >>> cluster = clops.dask.LocalCluster(devices="gpu")       # a worker per GPU
    >>> cluster = clops.dask.LocalCluster(devices="cpu", split=2)   # two CPU sub-devices
    >>> client = Client(cluster)

    ``devices``: as ``device_selectors`` takes them (None: the default device).
    ``split=n`` divides each listed device into n sub-devices (device fission, where the
    driver has it, as PoCL does) and starts a worker on each. Each worker has ``threads``
    threads (one by default: a device's queue orders its work anyway), a resource
    ``OPENCL: 1`` and the environment ``env`` (``CLOPS_MEMORY_LIMIT``, say);
    ``dashboard_address`` is off unless given. Other keyword arguments go to
    ``SpecCluster``.
    """

    def __init__(self, devices: str | Sequence[str] | None = None, split: int | None = None,
                 threads: int = 1, memory_limit: str | int = "auto",
                 dashboard_address: str | None = None, env: dict[str, str] | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("silence_logs", 40)
        workers = worker_specs(devices, split, threads, memory_limit, env,
                               kwargs["silence_logs"])
        self.selectors = [w["options"]["env"]["CLOPS_DEVICE"] + (
            f" [sub-device {w['options']['env']['CLOPS_DASK_SUBDEVICE']}]"
            if "CLOPS_DASK_SUBDEVICE" in w["options"]["env"] else "") for w in workers.values()]
        scheduler = {"cls": Scheduler, "options": {"dashboard_address": dashboard_address}}
        super().__init__(workers=workers, scheduler=scheduler, **kwargs)
