"""Launches that leave the local size to the driver on CPUs: PoCL 3.1 makes one work-group of
up to 16 work-items and two of up to 4096, whatever the cores (a group runs on one core), so
on PoCL clops chooses groups enough for every core; elsewhere the driver chooses."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import clops
from clops.compiler.geometry import CPU_SPLIT_GROUPS_PER_CU, driver_local


def _cpu(backend: str, cores: int = 2) -> SimpleNamespace:
    return SimpleNamespace(kind="cpu", backend=backend,
                           caps=SimpleNamespace(compute_units=cores, max_work_group=4096))


def test_groups_enough_for_every_core_on_pocl() -> None:
    pocl = _cpu("pocl")
    want = CPU_SPLIT_GROUPS_PER_CU * 2
    assert driver_local(pocl, (8,)) == (1,)  # (PoCL: one group of 8)
    assert driver_local(pocl, (4096,)) == (4096 // want,)
    assert driver_local(pocl, (1000,)) == (8,)  # (a power of two that divides 1000)
    assert driver_local(pocl, (1 << 24,)) == (4096,)  # (no group past 4096)
    assert driver_local(pocl, (512, 3)) == (512 // want, 1)
    assert driver_local(_cpu("pocl", 16), (4096,)) == (4096 // (CPU_SPLIT_GROUPS_PER_CU * 16),)
    for items in (1, 7, 8, 100, 4096, 1000, 12345, 1 << 20):
        (local,) = driver_local(pocl, (items,))
        assert items % local == 0 and (items // local >= want or local == 1)


def test_other_drivers_choose() -> None:
    assert driver_local(_cpu("intel"), (8,)) is None
    gpu = SimpleNamespace(kind="gpu", backend="pocl", caps=SimpleNamespace(compute_units=2,
                                                                          max_work_group=1024))
    assert driver_local(gpu, (8,)) is None


def test_the_few_rows_of_a_chunked_argmax_take_every_core(device: clops.CLDevice) -> None:
    """argmax of 2^22 float32 (a row cut into chunks, a work-item each): the right position,
    and on PoCL the chunks' launch in groups of one."""
    x = np.random.default_rng(3).standard_normal(1 << 22).astype(np.float32)
    x[777_777] = 9.0
    t = clops.asarray(x, device=device)
    seen: list = []
    launch = device.launch

    def spy(knl, gsize, lsize, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((kwargs.get("name"), gsize, lsize))
        return launch(knl, gsize, lsize, *args, **kwargs)

    device.launch = spy  # type: ignore[method-assign]
    try:
        assert int(clops.argmax(t)) == 777_777
    finally:
        del device.launch
    if device.kind == "cpu" and device.backend == "pocl":
        chunks = [(g, ls) for name, g, ls in seen if name == "k_argmax"]
        assert chunks and all(ls is not None and tuple(ls)[0] == 1 for _, ls in chunks), seen
