"""Compiler: pending graphs to generated kernels. ``schedule`` (fuse into kernels, as a ``Plan``)
-> ``lower`` (a structural ``KernelKey`` plus launch values) -> ``render`` (``CLRenderer``: the
source) -> build and launch through the device (``realize.run``). See docs/ARCHITECTURE.md."""

from __future__ import annotations

from typing import Any

from .realize import plan as plan_targets
from .realize import run, target
from .schedule import AllocStep, KernelStep, Plan

__all__ = ["AllocStep", "KernelStep", "Plan", "plan", "run"]


def plan(*tensors: Any) -> Plan:
    """The kernels realizing ``tensors`` together would launch, with their keys, geometry,
    inputs, outputs and temporaries, made without allocating or launching anything (the
    tensors stay pending). ``run(p, device)`` runs it.

    >>> p = clops.compiler.plan((a * b + c).sum(axis=1))
    >>> [k.name for k in p.kernels]
    ['k_multiply_add_sum']
    """
    pending = [t for t in tensors if t._node.resolve().op != "load"]
    if not pending:
        return Plan()
    device = pending[0].device
    if any(t.device is not device for t in pending):
        raise ValueError("plan() takes tensors of one device; plan each device's apart")
    return plan_targets([(target(t._node.resolve())[0], None, None) for t in pending], device)
