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
    worker."""
    import clops

    if devices is None:
        return [clops.device().selector]
    text = devices if isinstance(devices, str) else ",".join(devices)
    found = clops.devices(text)
    if not found:
        raise LookupError(f"no OpenCL device matches {text!r} (clops info lists them)")
    out: list[str] = []
    for d in found:
        if d.selector not in out:
            out.append(d.selector)
    return out


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
        sels = device_selectors(devices)
        if split is not None and split < 2:
            raise ValueError(f"split must be 2 or more sub-devices, not {split}")
        entries = [(s, f"{i}/{split}" if split else "") for s in sels
                   for i in range(split or 1)]
        workers = {}
        for j, (sel, part) in enumerate(entries):
            wenv = {**(env or {}), "CLOPS_DEVICE": sel}
            if part:
                wenv["CLOPS_DASK_SUBDEVICE"] = part
            workers[f"clops-{j}"] = {"cls": Nanny, "options": {
                "nthreads": threads, "env": wenv, "resources": {"OPENCL": 1},
                "memory_limit": memory_limit, "preload": ["clops.dask.worker"],
                "dashboard_address": None, "silence_logs": kwargs.get("silence_logs", 40)}}
        scheduler = {"cls": Scheduler, "options": {"dashboard_address": dashboard_address}}
        self.selectors = [s + (f" [sub-device {p}]" if p else "") for s, p in entries]
        kwargs.setdefault("silence_logs", 40)
        super().__init__(workers=workers, scheduler=scheduler, **kwargs)
