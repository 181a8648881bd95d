"""The C tensor view (clops/clops.h): the header ships with the package and matches
``clops.native``; a compiled C extension (examples/native_extension) reads the view from the
capsule, scales the tensor in place with its own kernel, reports its event, and clops orders its
work with the extension's in both directions."""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import re
import shutil
import subprocess
import sysconfig
import time
import weakref
from pathlib import Path
from types import ModuleType

import numpy as np
import pyopencl as cl
import pytest

import clops
from clops.graph import dtypes
from clops.native import DTYPE_CODES, TENSOR_VIEW_CAPSULE, TENSOR_VIEW_VERSION, TensorView
from clops.runtime import CLDevice

from ..conftest import Gate

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "native_extension"
HEADER = Path(clops.get_include()) / "clops" / "clops.h"
COMPLETE = cl.command_execution_status.COMPLETE


def _load_build_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("clops_example_native_build",
                                                  EXAMPLE / "build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def build_helper() -> ModuleType:
    return _load_build_helper()


@pytest.fixture(scope="module")
def ext(build_helper: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The example extension, compiled once for this module (skipped where it cannot be)."""
    try:
        path = build_helper.build(tmp_path_factory.mktemp("native_ext"))
    except build_helper.MissingTool as e:
        pytest.skip(f"cannot build the example extension: {e}")
    return build_helper.load(path)


# -- the header itself ---------------------------------------------------------------------------
def test_header_ships_and_matches_python() -> None:
    assert HEADER.is_file(), f"{HEADER} missing: is it in pyproject's package-data?"
    assert clops.get_include() == clops.native.get_include()
    text = HEADER.read_text()
    codes = {m[1].lower(): int(m[2])
             for m in re.finditer(r"#define CLOPS_DTYPE_(\w+) (\d+)", text)}
    assert codes == DTYPE_CODES
    assert set(DTYPE_CODES) == {d.name for d in dtypes.ALL}   # every clops dtype has a code
    assert len(set(DTYPE_CODES.values())) == len(DTYPE_CODES)
    assert f'#define CLOPS_TENSOR_VIEW_CAPSULE "{TENSOR_VIEW_CAPSULE}"' in text
    assert f"#define CLOPS_TENSOR_VIEW_VERSION {TENSOR_VIEW_VERSION}" in text
    # The ctypes mirror lists the C fields in their order.
    body = re.search(r"typedef struct clops_tensor_view \{(.*?)\} clops_tensor_view;", text,
                     re.S)
    assert body is not None
    c_fields = re.findall(r"\*?(\w+);", body[1])
    assert c_fields == [f[0] for f in TensorView._fields_]


@pytest.mark.parametrize("lang", ["c", "c++"])
def test_header_compiles_alone_and_with_python(lang: str, tmp_path: Path,
                                               build_helper: ModuleType) -> None:
    """Plain C or C++ (as pybind11 includes it), with and without Python.h before it."""
    exe = shutil.which("g++" if lang == "c++" else "gcc") or shutil.which(
        "clang++" if lang == "c++" else "clang")
    if exe is None:
        pytest.skip(f"no {lang} compiler (gcc/clang) on PATH")
    try:
        cl_include = build_helper.find_opencl_headers()
    except build_helper.MissingTool as e:
        pytest.skip(str(e))
    incs = ["-I", clops.get_include(), "-I", sysconfig.get_paths()["include"]]
    if cl_include:
        incs += ["-I", cl_include]
    uses = {
        "plain": "#include <clops/clops.h>\n"
                 "size_t f(const clops_tensor_view *v) { return v->version + sizeof *v; }\n",
        "python": "#include <Python.h>\n#include <clops/clops.h>\n"
                  "int f(PyObject *c) { const clops_tensor_view *v ="
                  " clops_tensor_view_from_capsule(c);\n"
                  "  return v ? clops_report_write(c, v->wait_event) : -1; }\n",
    }
    for name, src in uses.items():
        path = tmp_path / f"{name}.{'cpp' if lang == 'c++' else 'c'}"
        path.write_text("#define CL_TARGET_OPENCL_VERSION 120\n" + src)
        r = subprocess.run([exe, "-fsyntax-only", "-Wall", "-Wextra", "-Werror", *incs,
                            str(path)], capture_output=True, text=True)
        assert r.returncode == 0, f"{lang} {name}:\n{r.stderr}"


# -- the capsule ---------------------------------------------------------------------------------
def _view_struct(capsule: object) -> TensorView:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ptr = get(capsule, TENSOR_VIEW_CAPSULE.encode())
    return ctypes.cast(ptr, ctypes.POINTER(TensorView)).contents


def test_capsule_keeps_tensor_alive(device: CLDevice) -> None:
    t = clops.arange(16.0, device=device).realize()
    buf = weakref.ref(t.buffer)
    cap = clops.native.tensor_view(t)
    view = _view_struct(cap)
    assert view.mem == t.buffer.mem.int_ptr and view.ndim == 1 and view.shape[0] == 16
    del t, view
    gc.collect()
    assert buf() is not None                     # the capsule holds the tensor
    del cap
    device.synchronize()
    gc.collect()
    assert buf() is None


def test_view_fields_as_c_sees_them(device: CLDevice, ext: ModuleType) -> None:
    x = clops.asarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4), device=device)
    v = x[:, ::-1, 1:]
    cap = clops.native.tensor_view(v)
    f = ext.view_fields(cap)
    h = clops.native.handles(v)
    assert f["version"] == TENSOR_VIEW_VERSION
    assert f["size"] == f["sizeof"] == ctypes.sizeof(TensorView)
    assert f["offsetof_wait_event"] == TensorView.wait_event.offset
    assert (f["mem"], f["offset"], f["shape"]) == (h["cl_mem"], h["offset"], (2, 3, 3))
    assert f["strides"] == (12, -4, 1) and f["dtype"] == DTYPE_CODES["float32"]
    assert f["itemsize"] == 4 and f["ndim"] == 3
    assert (f["queue"], f["context"], f["device"]) == (h["queue"], h["context"], h["device"])
    assert f["wait_event"] == 0                 # NULL: the upload is earlier on the same queue
    i = clops.asarray(np.arange(4, dtype=np.int16), device=device)
    g = ext.view_fields(clops.native.tensor_view(i))
    assert g["dtype"] == DTYPE_CODES["int16"] and g["itemsize"] == 2


# -- the extension's work, ordered with clops' ---------------------------------------------------
@pytest.mark.parametrize("index", [(), (slice(None, None, 2),), (slice(1, None), slice(None, -1)),
                                   (slice(None, None, -1), slice(1, None, 2)), (1, 2)],
                         ids=["all", "every-other-row", "slice-2d", "flipped-strided", "scalar"])
def test_scale_in_place(device: CLDevice, ext: ModuleType, index: tuple) -> None:
    host = np.arange(30, dtype=np.float32).reshape(5, 6)
    x = clops.asarray(host, device=device)
    (x * 0).realize()                            # a pending reader the write view waits for
    ext.scale(clops.native.tensor_view(x[index]), 3.0)
    want = host.copy()
    want[index] *= 3.0
    np.testing.assert_array_equal(x.to_numpy(), want)
    np.testing.assert_array_equal((x + 1).to_numpy(), want + 1)


def test_later_clops_work_waits_for_extension(device: CLDevice, ext: ModuleType,
                                              gate: Gate) -> None:
    host = np.arange(64, dtype=np.float32)
    x = clops.asarray(host, device=device).realize()
    q2 = device.create_queue()                   # so the rest of the device is not blocked
    ext.scale(clops.native.tensor_view(x, q2), 2.0, wait_for=gate.event.int_ptr)
    y = (x + 1).realize()                        # clops work after the extension's
    write = y.buffer.last_write
    assert write is not None
    time.sleep(0.05)
    assert write[0].command_execution_status != COMPLETE
    gate.open()
    np.testing.assert_array_equal(y.to_numpy(), host * 2 + 1)


def test_extension_waits_for_clops_write(device: CLDevice, ext: ModuleType,
                                         gate: Gate) -> None:
    x = clops.zeros(256, device=device).realize()
    fill = clops.kernel("__kernel void fill(__global float *x, long o, float v)"
                        "{ x[o + get_global_id(0)] = v; }", "fill")
    fill(256, None, x, 7.0, wait_for=[gate.event])   # clops' write, held back
    q2 = device.create_queue()
    cap = clops.native.tensor_view(x, q2)
    assert ext.view_fields(cap)["wait_event"] != 0   # another queue: an explicit wait
    ext.scale(cap, 2.0)
    gate.open()
    np.testing.assert_array_equal(x.to_numpy(), np.full(256, 14, np.float32))


def test_write_view_waits_for_pending_reads(device: CLDevice, ext: ModuleType,
                                            gate: Gate) -> None:
    host = np.arange(32, dtype=np.float32)
    x = clops.asarray(host, device=device).realize()
    other = clops.zeros(4, device=device).realize()
    hold = clops.kernel("__kernel void hold(__global float *x, long o)"
                        "{ x[o + get_global_id(0)] = 1; }", "hold")
    hold(4, None, other, wait_for=[gate.event])  # blocks the default in-order queue
    y = (x * 2).realize()                        # a read of x, pending behind the gate
    q2 = device.create_queue()
    ext.scale(clops.native.tensor_view(x, q2, write=True), 10.0)
    gate.open()
    np.testing.assert_array_equal(y.to_numpy(), host * 2)    # read before the extension wrote
    np.testing.assert_array_equal(x.to_numpy(), host * 10)


def test_report_pyopencl_event_and_user_event(device: CLDevice, gate: Gate) -> None:
    """report_write from Python: an event of a foreign queue (tensor target) and a user event
    (capsule target), which holds back only the work on that tensor."""
    x = clops.zeros(8, device=device).realize()
    # the foreign fill is ordered after clops' own write of x by the caller, as any foreign
    # queue's work must be (on Intel's CPU runtime the fill otherwise ran first, now and then)
    device.synchronize()
    fq = cl.CommandQueue(device.context)
    ev = cl.enqueue_fill_buffer(fq, x.buffer.mem, np.float32(5), 0, 32,
                                wait_for=[gate.event])
    clops.native.report_write(x, ev)
    y = (x + 1).realize()
    cap = clops.native.tensor_view(y)
    user = cl.UserEvent(device.context)
    clops.native.report_write(cap, user.int_ptr)
    gate.open()
    np.testing.assert_array_equal((x * 3).to_numpy(), np.full(8, 15, np.float32))  # not held
    z = (y * 2).realize()
    time.sleep(0.05)
    write = z.buffer.last_write
    assert write is not None and write[0].command_execution_status != COMPLETE
    user.set_status(COMPLETE)
    np.testing.assert_array_equal(z.to_numpy(), np.full(8, 12, np.float32))
    np.testing.assert_array_equal(y.to_numpy(), np.full(8, 6, np.float32))


def test_report_read_holds_back_later_writes(device: CLDevice, gate: Gate) -> None:
    host = np.arange(16, dtype=np.float32)
    x = clops.asarray(host, device=device).realize()
    cap = clops.native.tensor_view(x, write=False)
    # a native reader on its own queue, held back: a device-side copy (NVIDIA's driver does
    # a read into pageable host memory inside the enqueue call, which would wait on the gate)
    dst = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, host.nbytes)
    fq = cl.CommandQueue(device.context)
    ev = cl.enqueue_copy(fq, dst, x.buffer.mem, byte_count=host.nbytes, wait_for=[gate.event])
    clops.native.report_read(cap, ev)
    fill = clops.kernel("__kernel void fill(__global float *x, long o, float v)"
                        "{ x[o + get_global_id(0)] = v; }", "fill")
    done = fill(16, None, x, 9.0)               # a clops write: must wait for the read
    time.sleep(0.05)
    assert not done.done
    gate.open()
    ev.wait()
    out = np.zeros_like(host)
    cl.enqueue_copy(fq, out, dst, is_blocking=True)
    np.testing.assert_array_equal(out, host)
    np.testing.assert_array_equal(x.to_numpy(), np.full(16, 9, np.float32))


def test_errors_say_what_to_do(device: CLDevice, ext: ModuleType) -> None:
    x = clops.ones(4, device=device)
    cap = clops.native.tensor_view(x)
    with pytest.raises(TypeError, match="capsule from clops.native.tensor_view"):
        clops.native.report_write(object(), 1)
    with pytest.raises(ValueError, match="event is NULL"):
        clops.native.report_write(cap, 0)
    other = cl.Context([device.cl_device])
    foreign = cl.UserEvent(other)
    with pytest.raises(ValueError, match="another OpenCL context"):
        clops.native.report_write(cap, foreign)
    # NOTE: completed before it goes: NVIDIA's driver hangs releasing a context whose user
    # event never completed
    foreign.set_status(COMPLETE)
    with pytest.raises(TypeError, match=r"capsule of clops.native.tensor_view\(tensor\)"):
        ext.scale(object(), 2.0)
    with pytest.raises(TypeError, match="float32"):
        ext.scale(clops.native.tensor_view(clops.ones(4, dtype=clops.int32, device=device)), 2.0)
    with pytest.raises(ValueError, match="broadcast"):
        ext.scale(clops.native.tensor_view(clops.broadcast_to(x[:1], (4,))), 2.0)
    with pytest.raises(TypeError, match="clops tensor"):
        clops.native.tensor_view(np.ones(4))


@pytest.mark.usefixtures("ext")  # skips where the extension cannot be built
def test_example_main(device: CLDevice, build_helper: ModuleType,
                      capsys: pytest.CaptureFixture[str]) -> None:
    assert build_helper.main(["--device", device.selector]) == 0
    assert "[ 1.  2. 21.  4. 41.  6. 61.  8.]" in capsys.readouterr().out
