"""dask, worker: loaded by each worker of ``clops.dask.LocalCluster`` (Dask's ``preload``):
makes the worker's device, or its sub-device of a split, the process's default device, and
registers clops' Dask lookups and serializers there."""

from __future__ import annotations

import os
from typing import Any


def dask_setup(worker: Any) -> None:
    import clops
    import clops.dask  # noqa: F401 - the lookups and serializers

    dev = clops.device(os.environ.get("CLOPS_DEVICE") or None)
    part = os.environ.get("CLOPS_DASK_SUBDEVICE")
    if part:
        i, n = (int(v) for v in part.split("/"))
        dev = dev.create_sub_devices(n)[i]
    clops.set_default_device(dev)
