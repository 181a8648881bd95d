"""Runtime, launch scopes: ``clops.launches(capture=, profile=)`` says what the launch seam does
with the commands of a block (captured on this thread, profiled on every thread, tracked
always); ``clops.profile()`` and ``plan.capture()`` are its forms. Nesting, threads, exceptions,
and the one record of what is open (``runtime/scope.py``)."""

from __future__ import annotations

import inspect
import threading
from types import SimpleNamespace

import numpy as np
import pyopencl as cl
import pytest

import clops
from clops.runtime import Capture, CLDevice, LaunchScope, Profiler, plan, scope

N = 1024
SOURCE = "__kernel void scale(__global float *x, float a) { x[get_global_id(0)] *= a; }"


@pytest.fixture
def k(device: CLDevice) -> SimpleNamespace:
    return SimpleNamespace(scale=cl.Kernel(device.build(SOURCE), "scale"))


def _work(device: CLDevice, k: SimpleNamespace, x, name: str = "scale") -> None:
    """One named launch and one device copy."""
    device.launch(k.scale, (N,), None, [x, np.float32(2)], writes=[x], name=name)
    y = device.alloc(N * 4)
    device.copy(y, x, N * 4)


def _nothing_open() -> bool:
    return not scope.capturing() and scope.captures() == [] and scope.profilers() == ()


def test_capture_and_profile_together(device, k):
    x = device.alloc(N * 4)
    with clops.launches(capture=True, profile=True) as s:
        assert isinstance(s, LaunchScope) and s.tracked
        assert s.capture in scope.captures() and s.profiler in scope.profilers()
        _work(device, k, x)
    assert _nothing_open()
    assert isinstance(s.capture, Capture) and isinstance(s.profiler, Profiler)
    assert [type(c).__name__ for _, c in s.capture.commands] == ["Launch", "Copy"]
    assert [(r.kind, r.name) for r in s.profiler.records] == [
        ("kernel", "scale"), ("copy", "device_to_device")]
    with clops.launches() as idle:  # asks nothing: commands are only tracked
        assert idle.capture is None and idle.profiler is None and idle.tracked
        assert _nothing_open()


def test_profile_is_a_profiling_scope(device, k):
    """``clops.profile()`` records what ``launches(profile=True)`` records, as before."""
    x = device.alloc(N * 4)
    with clops.profile() as prof:
        assert scope.profilers() == (prof,) and not scope.capturing()
        _work(device, k, x)
    with clops.launches(profile=True) as s:
        _work(device, k, x)
    assert _nothing_open()
    assert [(r.kind, r.name, r.bytes) for r in prof.records] == \
        [(r.kind, r.name, r.bytes) for r in s.profiler.records]
    assert prof.kernel_count == s.profiler.kernel_count == 1
    prof.__enter__()  # entered and left by hand, as the command line does
    _work(device, k, x)
    prof.__exit__(None, None, None)
    assert prof.kernel_count == 2 and _nothing_open()


def test_scopes_nest_either_way(device, k):
    x = device.alloc(N * 4)
    with plan.capture() as cap:
        _work(device, k, x, "outside the profile")
        with clops.profile() as prof:
            _work(device, k, x, "inside both")
    assert [c.name for _, c in cap.commands if isinstance(c, plan.Launch)] == [
        "outside the profile", "inside both"]
    assert [r.name for r in prof.kernels()] == ["inside both"]
    with clops.profile() as outer:
        with clops.launches(capture=True) as s:
            _work(device, k, x, "inside both")
            with clops.launches(capture=True, profile=True) as inner:
                _work(device, k, x, "innermost")
        _work(device, k, x, "outside the capture")
    assert _nothing_open()
    assert [r.name for r in outer.kernels()] == ["inside both", "innermost",
                                                 "outside the capture"]
    assert [c.name for _, c in s.capture.commands if isinstance(c, plan.Launch)] == [
        "inside both", "innermost"]
    assert [c.name for _, c in inner.capture.commands if isinstance(c, plan.Launch)] == [
        "innermost"]
    assert [r.name for r in inner.profiler.kernels()] == ["innermost"]


def test_given_capture_and_profiler_are_added_to(device, k):
    x = device.alloc(N * 4)
    prof, cap = clops.profile(), Capture()
    for _ in range(2):
        with clops.launches(capture=cap, profile=prof) as s:
            assert s.capture is cap and s.profiler is prof
            _work(device, k, x)
    assert prof.kernel_count == 2 and len(cap.commands) == 4


def test_exceptions_leave_nothing_open(device, k):
    x = device.alloc(N * 4)
    with pytest.raises(KeyError):
        with clops.profile(), clops.launches(capture=True, profile=True):
            with plan.capture(), clops.launches(profile=True):
                _work(device, k, x)
                raise KeyError("out of the block")
    assert _nothing_open()
    host = np.empty(N, np.float32)
    with pytest.raises(clops.JitError, match="read of device memory to the host"):
        with clops.launches(capture=True, profile=True):
            device.read(host, x)
    assert _nothing_open()
    with clops.launches(capture=True, strict=False) as s:
        device.read(host, x)  # goes on; the capture is void
    assert s.capture.refused and not s.capture.commands and _nothing_open()


def test_a_scope_is_open_once_at_a_time():
    s = clops.launches(profile=True)
    with s:
        with pytest.raises(RuntimeError, match="open already"):
            s.__enter__()
        assert scope.profilers() == (s.profiler,)
    assert _nothing_open()
    with s:  # closed, it may be opened again
        assert scope.profilers() == (s.profiler,)
    s.__exit__(None, None, None)  # closing it twice does nothing
    assert _nothing_open()


def test_capture_takes_this_thread_and_profile_every_thread(device, k):
    """A capture is one thread's work; a profiler sees every thread's (``capturing()`` says
    whether a capture is open on any thread, as before)."""
    x, y = device.alloc(N * 4), device.alloc(N * 4)
    seen: list[object] = []

    def other() -> None:
        seen.append((scope.capturing(), scope.captures(), scope.profiling()))
        _work(device, k, y, "other thread")

    with clops.launches(capture=True, profile=True) as s:
        _work(device, k, x, "this thread")
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == [(True, [], True)]
    assert [c.name for _, c in s.capture.commands if isinstance(c, plan.Launch)] == [
        "this thread"]
    assert sorted(r.name for r in s.profiler.kernels()) == ["other thread", "this thread"]
    # a capture open on another thread takes none of this thread's commands
    opened, done = threading.Event(), threading.Event()
    held: list[LaunchScope] = []

    def holder() -> None:
        with clops.launches(capture=True) as h:
            held.append(h)
            opened.set()
            done.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    assert opened.wait(30)
    try:
        assert scope.capturing() and scope.captures() == []
        _work(device, k, x, "not captured")
    finally:
        done.set()
        t.join()
    assert held[0].capture.commands == [] and _nothing_open()


def test_threads_open_and_close_scopes_at_once(device, k):
    """Each thread's capture holds its own launches alone, while the others open and close
    theirs."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        x = device.alloc(N * 4)
        try:
            for j in range(10):
                with clops.launches(capture=True, profile=i % 2 == 0) as s:
                    device.launch(k.scale, (N,), None, [x, np.float32(1)], writes=[x],
                                  name=f"thread {i} {j}")
                    with scope.paused():
                        assert scope.captures() == []
                    assert scope.captures() == [s.capture]
                names = [c.name for _, c in s.capture.commands]
                assert names == [f"thread {i} {j}"], names
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert _nothing_open()


def test_paused_leaves_the_capture_not_the_profiler(device, k):
    x = device.alloc(N * 4)
    with clops.launches(capture=True, profile=True) as s, scope.paused():
        _work(device, k, x)
    assert s.capture.commands == [] and s.profiler.kernel_count == 1


def test_tracking_is_always_on(device, k):
    """A scope reports tracking and offers no switch: the commands inside it wait for their
    buffers' pending work and leave their events on them, as outside."""
    assert "track" not in inspect.signature(clops.launches).parameters
    x = device.alloc(N * 4)
    with clops.launches(capture=True, profile=True) as s:
        ev = device.launch(k.scale, (N,), None, [x, np.float32(2)], writes=[x])
        y = device.alloc(N * 4)
        device.copy(y, x, N * 4)
    assert s.tracked
    assert x.last_write is not None and x.last_write[0] is ev.cl_event
    assert y.last_write is not None and x.reads and x.reads[-1][0] is y.last_write[0]
