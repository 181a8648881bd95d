"""Compiler: pending graphs to generated kernels. ``schedule`` (fuse into kernels, as a
``Schedule``) -> ``lower`` (a structural ``KernelKey`` plus launch values) -> ``render``
(``CLRenderer``: the source) -> build and launch through the device (``realize.run``). See
docs/ARCHITECTURE.md."""

from __future__ import annotations

from typing import Any

from .realize import run, target
from .realize import schedule_of as _schedule_of
from .schedule import Alloc, KernelRun, Schedule

__all__ = ["Alloc", "KernelRun", "Schedule", "run", "schedule_of"]


def schedule_of(*tensors: Any) -> Schedule:
    """The kernels realizing ``tensors`` together would launch, with their keys, geometry,
    inputs, outputs and temporaries, made without allocating or launching anything (the
    tensors stay pending). ``run(p, device)`` runs it.

    >>> p = clops.compiler.schedule_of((a * b + c).sum(axis=1))
    >>> [k.name for k in p.kernels]
    ['k_multiply_add_sum']
    """
    pending = [t for t in tensors if t._node.resolve().op != "load"]
    if not pending:
        return Schedule()
    device = pending[0].device
    if any(t.device is not device for t in pending):
        raise ValueError("schedule_of() takes tensors of one device; schedule each device's "
                         "apart")
    return _schedule_of([(target(t._node.resolve())[0], None, None) for t in pending], device)
