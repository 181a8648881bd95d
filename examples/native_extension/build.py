"""Example, native extension build: compiles ``scale_ext.c`` into the CPython extension module
``clops_scale_ext`` against ``clops/clops.h`` (``clops.get_include()``) and libOpenCL, with
setuptools and the compiler this Python was built with, then scales a tensor with it.

    python examples/native_extension/build.py          # builds into a temporary folder, runs
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import importlib.util
import os
import shlex
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

import clops

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "scale_ext.c"
MODULE = "clops_scale_ext"

_HEADER_DIRS = ("/usr/include", "/usr/local/include", "/opt/homebrew/include")
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
             "/usr/local/lib")


class MissingTool(RuntimeError):
    """A C compiler, the OpenCL headers or libOpenCL is not there: nothing to build with."""


def find_compiler() -> str:
    """The C compiler this Python's extensions are built with (``CC``), if it is installed."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    exe = shlex.split(cc)[0]
    if shutil.which(exe) is None:
        raise MissingTool(f"no C compiler: {exe!r} (this Python's CC) is not on PATH; install "
                          "gcc or clang, or set CC")
    return exe


def find_opencl_headers() -> str | None:
    """A folder holding ``CL/cl.h`` (None: the compiler's own search path has it, as on
    macOS, where the header comes with the OpenCL framework)."""
    if sys.platform == "darwin":
        return None
    extra = os.environ.get("CPATH", "").split(os.pathsep) + os.environ.get(
        "C_INCLUDE_PATH", "").split(os.pathsep)
    for d in [*filter(None, extra), *_HEADER_DIRS]:
        if (Path(d) / "CL" / "cl.h").is_file():
            return d
    raise MissingTool("no OpenCL headers (CL/cl.h): install opencl-headers (Debian/Ubuntu: "
                      "apt install opencl-headers) or add their folder to CPATH")


def find_opencl_library() -> tuple[list[str], list[str]]:
    """How to link libOpenCL: (libraries, extra objects). ``-lOpenCL`` needs the development
    link ``libOpenCL.so``; without it, the runtime library is linked by its path."""
    if sys.platform == "darwin":
        return [], []
    dirs = os.environ.get("LIBRARY_PATH", "").split(os.pathsep) + list(_LIB_DIRS)
    for d in filter(None, dirs):
        if (Path(d) / "libOpenCL.so").exists():
            return ["OpenCL"], []
    for d in filter(None, dirs):
        found = sorted(glob.glob(str(Path(d) / "libOpenCL.so.*")))
        if found:
            return [], [found[0]]
    if ctypes.util.find_library("OpenCL"):
        return ["OpenCL"], []
    raise MissingTool("no libOpenCL to link with: install an OpenCL ICD loader (Debian/Ubuntu: "
                      "apt install ocl-icd-opencl-dev)")


def build(out_dir: str | Path) -> Path:
    """Compile the extension into ``out_dir``; returns the module file. Raises ``MissingTool``
    when there is nothing to build with."""
    from setuptools import Distribution, Extension

    find_compiler()
    cl_include = find_opencl_headers()
    libraries, objects = find_opencl_library()
    out = Path(out_dir)
    ext = Extension(
        MODULE, [str(SOURCE)],
        include_dirs=[clops.get_include(), *([cl_include] if cl_include else [])],
        libraries=libraries, extra_objects=objects,
        extra_link_args=["-framework", "OpenCL"] if sys.platform == "darwin" else [],
    )
    dist = Distribution({"name": MODULE, "ext_modules": [ext]})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(out)  # type: ignore[attr-defined]
    cmd.build_temp = str(out / "temp")  # type: ignore[attr-defined]
    cmd.ensure_finalized()
    cmd.run()
    return Path(cmd.get_ext_fullpath(MODULE))  # type: ignore[attr-defined]


def load(path: str | Path) -> ModuleType:
    """Import the built module from its file."""
    spec = importlib.util.spec_from_file_location(MODULE, str(path))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[MODULE] = mod
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="build folder (default: a temporary one)")
    ap.add_argument("--device", default=None, help="clops device selector")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ext = load(build(args.out or tmp))
        x = clops.asarray(np.arange(8, dtype=np.float32), device=args.device)
        ext.scale(clops.native.tensor_view(x[::2]), 10.0)    # every other element, in place
        print((x + 1).to_numpy())                            # clops waits for the kernel
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
