"""The launch seam (runtime/launch.py, memory.py, plan.py): every enqueue passes CLDevice's
tracked launch and copy paths, prepared launch plans, or the providers' guarded call; the
compiler does not reach up into the array layer. Source is read with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import clops
from clops.runtime import memory, plan

ROOT = Path(clops.__file__).parent
# Where work may be enqueued (kernels, copies, fills, maps): the seam itself (launch.py for
# kernels, memory.py for copies and a CPU device's large reads), host mappings: the staging
# buffers' and the pool's (host views of host-addressable memory), and the disk-remembered
# probes' read of their result (a kernel run on a device not yet known to build, before any of
# its work is tracked). Markers and barriers order work and may be anywhere.
ENQUEUERS = {"runtime/launch.py": None,
             "runtime/memory.py": {"enqueue_copy", "enqueue_map_buffer"},
             "runtime/staging.py": {"enqueue_map_buffer"},
             "runtime/pool.py": {"enqueue_map_buffer"}, "runtime/probes.py": {"enqueue_copy"}}
ORDERING = {"enqueue_marker", "enqueue_barrier", "enqueue_wait_for_events"}


def _enqueue_calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
                else ""
            if name.startswith("enqueue_") and name != "enqueue_prepared" and \
                    name not in ORDERING:  # enqueue_prepared: CLDevice's own, for plans
                out.add(name)
    return out


def test_only_the_seam_calls_pyopencls_enqueues():
    bad = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        calls = _enqueue_calls(p)
        allowed = ENQUEUERS.get(rel, set())
        if allowed is None:
            continue
        extra = calls - allowed
        if extra:
            bad.append(f"{rel}: {sorted(extra)}")
    assert not bad, "enqueue outside the launch seam:\n" + "\n".join(bad)


def test_the_compiler_does_not_import_the_array_layer():
    bad = []
    for p in sorted((ROOT / "compiler").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                if mod.startswith("..array") or mod.startswith("clops.array") or \
                        (mod == ".." and any(a.name in ("array", "Tensor") for a in node.names)):
                    bad.append(f"{p.name}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "\n".join(bad)


def test_capture_records_launches_copies_and_writes_and_refuses_reads(device):
    a = device.alloc(64)
    b = device.alloc(64)
    with plan.capture() as cap:
        device.write(a, np.arange(16, dtype=np.float32))
        device.copy(b, a, 64)
        c = device.alloc(64)
    kinds = [type(c).__name__ for _, c in cap.commands]
    assert kinds == ["Write", "Copy"] and c in cap.allocated and a not in cap.allocated
    host = np.empty(16, np.float32)
    try:
        with plan.capture():
            device.read(host, b)
    except plan.JitError as e:
        assert "read of device memory to the host" in str(e)
    else:
        raise AssertionError("a read inside a capture must be refused")
    with plan.capture(strict=False) as cap:
        device.read(host, b)  # goes on, eagerly; the capture is void
    assert cap.refused and not cap.commands
    np.testing.assert_array_equal(host, np.arange(16))
    with plan.capture() as cap, plan.paused():
        device.copy(a, b, 64)
    assert not cap.commands


def test_capturing_says_whether_a_capture_is_open_on_any_thread():
    import threading

    from clops.runtime import capture

    assert not capture.capturing()
    seen = []
    with capture.capture():
        assert capture.capturing() and plan.capturing()
        t = threading.Thread(target=lambda: seen.append(capture.capturing()))
        t.start()
        t.join()
        with capture.paused():
            assert capture.capturing() and capture.active() == []
    assert seen == [True] and not capture.capturing()


@pytest.mark.parametrize("nbytes", [memory.MAP_READ_MIN - 4, memory.MAP_READ_MIN,
                                    3 * memory.MAP_READ_MIN + 12])
def test_reads_at_offsets_then_writes_keep_their_order(device, nbytes):
    """Large blocking reads on a CPU device map the buffer (the others copy): every byte at
    any offset, any dtype, and a write or launch queued right after the read waits for it."""
    n = nbytes // 4
    values = np.arange(n + 64, dtype=np.int32) * 7 - 3
    buf = device.alloc(values.nbytes)
    device.write(buf, values, blocking=True)
    for off in (0, 4, 256):
        host = np.empty(n, np.int32)
        device.read(host, buf, off)
        np.testing.assert_array_equal(host, values[off // 4: off // 4 + n])
    as_bytes = np.empty(nbytes, np.uint8)
    device.read(as_bytes, buf, 8)
    np.testing.assert_array_equal(as_bytes, values.view(np.uint8)[8:8 + nbytes])
    host = np.empty(n, np.int32)
    device.read(host, buf)
    device.write(buf, np.zeros_like(values))  # after the read (non-blocking)
    again = np.empty(n, np.int32)
    device.read(again, buf)
    np.testing.assert_array_equal(host, values[:n])
    np.testing.assert_array_equal(again, 0)
    device.write(buf, values, blocking=True)
    fortran = np.empty((4, n // 4), np.int32, order="F")
    device.read(fortran, buf)  # not C-contiguous: the copy path, bytes in memory order
    np.testing.assert_array_equal(fortran.ravel(order="K"), values[:4 * (n // 4)])
