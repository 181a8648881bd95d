"""dask, worker: loaded by each worker of ``clops.dask.LocalCluster`` (Dask's ``preload``):
makes the worker's device, or its sub-device of a split, the process's default device, and
registers clops' Dask lookups and serializers there."""

from __future__ import annotations

from typing import Any


def dask_setup(worker: Any) -> None:
    import clops
    import clops.dask  # noqa: F401 - the lookups and serializers
    from clops import _config

    dev = clops.device(_config.device_selector())
    part = _config.dask_subdevice()
    if part is not None:
        i, n = part
        dev = dev.create_sub_devices(n)[i]
    clops.set_default_device(dev)
