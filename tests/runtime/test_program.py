"""Runtime, programs: the in-memory and on-disk build caches and build errors that show the
numbered source and the compiler log."""

from __future__ import annotations

import importlib
import os
import re
import uuid
from collections import Counter

import numpy as np
import pyopencl as cl
import pytest

from clops.runtime import BUILD_STATS, BuildError, CLDevice
from clops.runtime.program import ProgramCache, error_lines, excerpt

device_module = importlib.import_module("clops.runtime.device")
program_module = importlib.import_module("clops.runtime.program")


def _unique_source() -> str:
    # A fresh name per call: no cache (ours, the driver's or pyopencl's) has seen it.
    name = "k_" + uuid.uuid4().hex[:12]
    return (f"__kernel void {name}(__global float *x, float v) {{\n"
            "    x[get_global_id(0)] = x[get_global_id(0)] * v + 1.0f;\n"
            "}\n")


def _kernel_name(source: str) -> str:
    return source.split("void ", 1)[1].split("(", 1)[0]


def _stats_delta(before: Counter[str]) -> dict[str, int]:
    return {k: BUILD_STATS[k] - before[k] for k in ("builds", "disk_hits", "memory_hits")}


def _runs(device: CLDevice, prog: cl.Program, source: str) -> None:
    kernel = cl.Kernel(prog, _kernel_name(source))
    data = np.arange(64, dtype=np.float32)
    buf = device.alloc(data.nbytes)
    device.write(buf, data)
    device.launch(kernel, (64,), None, [buf, np.float32(3)], writes=[buf])
    out = np.empty_like(data)
    device.read(out, buf)
    np.testing.assert_array_equal(out, data * 3 + 1)


def test_memory_cache(device: CLDevice) -> None:
    cache = ProgramCache(device, disk_dir=None)
    src = _unique_source()
    before = Counter(BUILD_STATS)
    p1 = cache.build(src)
    assert _stats_delta(before) == {"builds": 1, "disk_hits": 0, "memory_hits": 0}
    p2 = cache.build(src)
    assert p2 is p1
    assert _stats_delta(before) == {"builds": 1, "disk_hits": 0, "memory_hits": 1}
    p3 = cache.build(src, ("-DUNUSED=1",))  # other options: another program
    assert p3 is not p1
    assert _stats_delta(before) == {"builds": 2, "disk_hits": 0, "memory_hits": 1}
    _runs(device, p1, src)
    _runs(device, p3, src)
    cache.clear()
    assert cache.build(src) is not p1
    assert _stats_delta(before)["builds"] == 3


def test_device_build_is_cached(device: CLDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    # A cache without a disk folder, so that the unique source leaves nothing behind.
    monkeypatch.setattr(device, "programs", ProgramCache(device, None))
    src = _unique_source()
    p1 = device.build(src)
    before = Counter(BUILD_STATS)
    assert device.build(src) is p1
    assert device.build(src, []) is p1  # options as any sequence
    assert _stats_delta(before) == {"builds": 0, "disk_hits": 0, "memory_hits": 2}
    _runs(device, p1, src)


def test_disk_cache(device: CLDevice, clops_env, tmp_path) -> None:
    clops_env(CLOPS_CACHE_DIR=str(tmp_path))
    folder = os.path.join(device_module.cache_dir(), "programs")
    assert folder == os.path.join(str(tmp_path), "programs")
    src = _unique_source()
    before = Counter(BUILD_STATS)
    first = ProgramCache(device, folder)
    p1 = first.build(src)
    assert _stats_delta(before) == {"builds": 1, "disk_hits": 0, "memory_hits": 0}
    files = os.listdir(folder)
    assert len(files) == 1 and files[0].endswith(".bin")
    assert os.path.getsize(os.path.join(folder, files[0])) > 0
    # A second cache, as a new process would have: loaded from disk, not compiled.
    second = ProgramCache(device, folder)
    p2 = second.build(src)
    assert p2 is not p1
    assert _stats_delta(before) == {"builds": 1, "disk_hits": 1, "memory_hits": 0}
    _runs(device, p2, src)
    # Other options are another entry.
    second.build(src, ("-cl-fast-relaxed-math",))
    assert _stats_delta(before)["builds"] == 2
    assert len(os.listdir(folder)) == 2


@pytest.mark.parametrize("var", program_module.TARGET_ENV)
def test_disk_cache_keeps_another_target_cpus_binary_apart(device: CLDevice, clops_env,
                                                           tmp_path, var: str) -> None:
    # A runtime told to compile for another CPU (an AVX2 run on an AVX-512 machine) reports the
    # same device: its binaries must not be taken for the machine's own, nor the reverse.
    folder = str(tmp_path / "programs")
    src = _unique_source()
    for name in program_module.TARGET_ENV:
        clops_env(**{name: None})
    before = Counter(BUILD_STATS)
    ProgramCache(device, folder).build(src)
    clops_env(**{var: "core-avx2"})
    prog = ProgramCache(device, folder).build(src)
    assert _stats_delta(before) == {"builds": 2, "disk_hits": 0, "memory_hits": 0}
    assert len(os.listdir(folder)) == 2
    _runs(device, prog, src)
    ProgramCache(device, folder).build(src)  # the same setting again: its own entry
    clops_env(**{var: None})
    ProgramCache(device, folder).build(src)  # and without it, the first one
    assert _stats_delta(before) == {"builds": 2, "disk_hits": 2, "memory_hits": 0}


def test_disk_cache_survives_a_corrupt_binary(device: CLDevice, tmp_path) -> None:
    folder = str(tmp_path / "programs")
    src = _unique_source()
    ProgramCache(device, folder).build(src)
    (path,) = [os.path.join(folder, f) for f in os.listdir(folder)]
    with open(path, "wb") as f:
        f.write(b"\x7fELF not really a binary")
    before = Counter(BUILD_STATS)
    prog = ProgramCache(device, folder).build(src)
    assert _stats_delta(before) == {"builds": 1, "disk_hits": 0, "memory_hits": 0}
    _runs(device, prog, src)
    with open(path, "rb") as f:
        assert not f.read().startswith(b"\x7fELF not")  # rewritten with a good binary


def test_disk_cache_off(device: CLDevice, tmp_path) -> None:
    cache = ProgramCache(device, None)
    cache.build(_unique_source())
    assert os.listdir(tmp_path) == []


BROKEN = """\
// line 1
#define SCALE 2.0f
__kernel void broken(__global float *x) {
    size_t i = get_global_id(0);
    float a = x[i];
    float b = a * SCALE;
    x[i] = b + undefined_name;
    x[i] += 1.0f;
    x[i] -= 1.0f;
    x[i] *= 1.0f;
    x[i] /= 1.0f;
    x[i] = x[i];
    x[i] = -(-x[i]);
}
"""


def test_build_error_shows_numbered_source_and_log(device: CLDevice) -> None:
    cache = ProgramCache(device, None)
    with pytest.raises(BuildError) as info:
        cache.build(BROKEN, ("-DWHATEVER=1",))
    err = info.value
    msg = str(err)
    assert device.name in msg
    assert "-DWHATEVER=1" in msg
    assert err.source == BROKEN and err.options == ("-DWHATEVER=1",)
    assert err.log and "--- compiler log ---\n" + err.log in msg
    assert "undefined_name" in err.log
    lines = msg.splitlines()
    marked = [ln for ln in lines if re.match(r"\s*\d+>\|", ln)]
    assert marked == [" 7>|     x[i] = b + undefined_name;"]
    # Three lines of context either side, numbered; lines far away are left out.
    for n in (4, 5, 6, 8, 9, 10):
        assert any(ln.startswith(f"{n:>2} | ") for ln in lines), n
    assert not any(ln.startswith(" 1 | ") or ln.startswith("13 | ") for ln in lines)
    assert " 4 |     size_t i = get_global_id(0);" in lines
    # A failed build is not cached: it fails again, with the same message.
    with pytest.raises(BuildError) as again:
        cache.build(BROKEN, ("-DWHATEVER=1",))
    head = msg.split("--- compiler log ---")[0]
    assert str(again.value).split("--- compiler log ---")[0] == head


def test_build_error_through_device(device: CLDevice) -> None:
    with pytest.raises(BuildError, match="undefined_name"):
        device.build(BROKEN)
    assert isinstance(BuildError("d", "x", (), "log"), RuntimeError)


@pytest.mark.parametrize(
    ("log", "lines"),
    [
        ("<source>:12:5: error: use of undeclared identifier 'x'", [12]),
        ("error: /tmp/pocl_x.cl:3:10: use of undeclared identifier 'x'\n1 error generated.", [3]),
        ("1:7:3: error: expected ';' after expression", [7]),
        ("<kernel>:4:1: fatal error: 'x.h' file not found", [4]),
        ('"/tmp/x.cl", line 9: error: identifier "y" is undefined', [9]),
        ("<source>:2:1: warning: unused\n<source>:5:2: error: a\n<source>:8:2: error: b", [5, 8]),
        ("no location here", []),
        ("<source>:3:5: warning: only a warning", []),
    ],
)
def test_error_lines(log: str, lines: list[int]) -> None:
    assert error_lines(log) == lines


def test_excerpt() -> None:
    src = "\n".join(f"line{n}" for n in range(1, 21))
    text = excerpt(src, [2, 15], context=1)
    assert text.splitlines() == [
        " 1 | line1", " 2>| line2", " 3 | line3", "   | ...",
        "14 | line14", "15>| line15", "16 | line16"]
    # Without a location (or one outside the source) the whole short source is shown.
    assert excerpt("a\nb", []).splitlines() == ["1 | a", "2 | b"]
    assert excerpt("a\nb", [40]).splitlines() == ["1 | a", "2 | b"]


def test_release_kernel_takes_only_unshared_objects(device: CLDevice) -> None:
    """release_kernel takes back objects marked as a single launch's own (kernels.launch's
    kernel) and new_kernel hands them out again; an object shared through a cache (a device's
    kernel()) is never taken, so it can never reach two owners."""
    from clops.kernels import launch
    from clops.runtime import program

    prog = launch.program(device, "norm", LSIZE=1)
    own = launch.kernel(device, "norm", "rmsnorm", LSIZE=1)
    program.release_kernel(own, [None, None, np.int32(0), np.int32(4), None, np.int32(4),
                                 np.float32(1e-5)])
    assert program.new_kernel(prog, "rmsnorm") is own
    shared = device.kernel(launch.source("norm"), "rmsnorm", ("-DLSIZE=1",))
    program.release_kernel(shared, [])
    assert program.new_kernel(prog, "rmsnorm") is not shared


def _second_of_two(device: CLDevice) -> CLDevice:
    """The second of two sub-devices of ``device`` in one context (a split model's later GPU
    stands in for it on CPUs)."""
    from clops import FissionError

    try:
        subs = device.create_sub_devices(2)
    except FissionError as e:
        pytest.skip(f"{device.name} does not split into sub-devices ({e})")
    assert subs[0].shares_context(subs[1])
    return subs[1]


def test_disk_cache_stores_the_devices_own_binary(device: CLDevice, tmp_path) -> None:
    # A program built from source in a context of two devices, for the second alone: the
    # cache keeps the second device's binary (the context's first entry is empty), and a new
    # process loads it from disk rather than compiling again.
    second = _second_of_two(device)
    folder = str(tmp_path / "programs")
    src = _unique_source()
    built = ProgramCache(second, folder).build(src)
    assert program_module.device_binary(built, second.cl_device)
    before = Counter(BUILD_STATS)
    again = ProgramCache(second, folder).build(src)
    assert _stats_delta(before) == {"builds": 0, "disk_hits": 1, "memory_hits": 0}
    _runs(second, again, src)


def test_new_kernel_where_a_driver_refuses_kernel_names(device: CLDevice,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # NVIDIA's driver answers INVALID_PROGRAM_EXECUTABLE to the kernel names of a program
    # built for a context's later device, whose kernels run: the kernel is made unchecked
    src = _unique_source()
    prog = ProgramCache(device, None).build(src)

    class Refusing:
        int_ptr = prog.int_ptr

        def get_info(self, what):
            raise cl.LogicError("clGetProgramInfo", cl.status_code.INVALID_PROGRAM_EXECUTABLE,
                                "refused")

    made = []
    monkeypatch.setattr(cl, "Kernel", lambda p, name: made.append((p, name)) or name)
    assert program_module.new_kernel(Refusing(), "any_name") == "any_name"  # type: ignore
    assert made and made[0][1] == "any_name"
    monkeypatch.undo()
    with pytest.raises(LookupError, match="no kernel 'missing'"):
        program_module.new_kernel(prog, "missing")  # names checked where the driver gives them
