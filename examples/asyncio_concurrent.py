"""Several device computations at once from asyncio: each task submits its work to its own
queue (``clops.stream`` is per task) and awaits the host result, so the event loop stays free
while the device works, and the tasks' kernels may run concurrently.

    python examples/asyncio_concurrent.py [--tasks 4] [--n 256] [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import numpy as np

import clops


async def job(seed: int, n: int, dev: Any) -> np.ndarray:
    """Row norms of (X @ X.T) for a random X drawn on the device, on a queue of this task."""
    with clops.stream(device=dev):
        x = clops.random.normal(seed, (n, n), device=dev)
        g = x @ x.T
        norms = clops.sqrt(clops.sum(g * g, axis=1))
        # Await the value: the loop runs other tasks until the copy to the host is done.
        return await asyncio.wrap_future(clops.to_host_future(norms))


def reference(seed: int, n: int, dev: Any) -> np.ndarray:
    """The same in numpy from the same draws (a counter-based generator: same on any device)."""
    x = clops.random.normal(seed, (n, n), device=dev).to_numpy().astype(np.float64)
    g = x @ x.T
    return np.sqrt((g * g).sum(axis=1))


async def run(tasks: int, n: int, device: Any = None) -> list[np.ndarray]:
    dev = clops.device(device)
    ticks = 0

    async def heartbeat() -> None:  # shows that the loop is not blocked meanwhile
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    hb = asyncio.create_task(heartbeat())
    try:
        results = await asyncio.gather(*(job(s, n, dev) for s in range(tasks)))
    finally:
        hb.cancel()
    run.ticks = ticks  # type: ignore[attr-defined]
    return list(results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default=None)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--n", type=int, default=256)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = asyncio.run(run(args.tasks, args.n, args.device))
    dt = time.perf_counter() - t0
    dev = clops.device(args.device)
    ok = all(np.allclose(o, reference(s, args.n, dev), rtol=1e-3) for s, o in enumerate(out))
    print(f"{args.tasks} concurrent tasks, n={args.n}: {dt * 1e3:.1f} ms, event loop ticked "
          f"{run.ticks} times meanwhile; {'correct' if ok else 'WRONG'}")  # type: ignore
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
