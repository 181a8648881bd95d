"""Runtime, discovery: finds OpenCL platforms (registering a lone vendor driver if needed, and
pointing PoCL's kernel cache into clops' cache folder) and turns selector strings such as
``"gpu:1"`` or ``"pocl"`` into devices."""

from __future__ import annotations

import atexit
import ctypes.util
import glob
import hashlib
import os
import shutil
import stat
import sys
import tempfile
import warnings
from dataclasses import dataclass

import pyopencl as cl

from .. import _config
from . import cachefiles

# Vendor driver libraries that are often installed without an ICD file (containers that mount
# the driver but not /etc/OpenCL/vendors). Name in the ICD file -> selector name.
_VENDOR_LIBRARIES = {
    "libnvidia-opencl.so.1": "nvidia",
    "libamdocl64.so": "amd",
    "libigdrcl.so": "intel",
    "libpocl.so.2": "pocl",
    # Intel's CPU runtime, as the intel-opencl-rt wheel installs it into an environment (its own
    # ICD file there names a placeholder path)
    "libintelocl.so": "intel-cpu",
}
_LIBRARY_DIRS = [
    "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib", "/usr/lib/aarch64-linux-gnu", "/opt/rocm/lib",
]

# Keywords of the backend part of a selector, matched against platform and device vendor names.
BACKEND_KEYWORDS = {
    "nvidia": ("nvidia",),
    "amd": ("amd", "advanced micro devices"),
    "intel": ("intel",),
    "pocl": ("portable computing language", "pocl"),
    "qualcomm": ("qualcomm",),
    "apple": ("apple",),
    "rusticl": ("rusticl", "mesa"),
}
KINDS = {"gpu": cl.device_type.GPU, "cpu": cl.device_type.CPU,
         "accelerator": cl.device_type.ACCELERATOR}


class DeviceNotFoundError(LookupError):
    """No OpenCL device matches a selector."""


@dataclass(frozen=True)
class DeviceEntry:
    platform: cl.Platform
    device: cl.Device
    kind: str  # "gpu" | "cpu" | "accelerator"
    backend: str  # one of BACKEND_KEYWORDS, or "opencl"

    def describe(self) -> str:
        return f"{self.backend}:{self.kind} {self.device.name.strip()} ({self.platform.version})"


def _find_vendor_libraries() -> list[str]:
    """Vendor libraries present: a bare name where the loader finds it on its own, the full
    path for one inside this Python environment (``<prefix>/lib``, where wheels put them)."""
    found = []
    for lib in _VENDOR_LIBRARIES:
        if lib == "libpocl.so.2":
            continue
        in_env = os.path.join(sys.prefix, "lib", lib)
        if os.path.exists(in_env):
            found.append(in_env)
            continue
        for d in _LIBRARY_DIRS:
            if os.path.exists(os.path.join(d, lib)):
                found.append(lib)
                break
        else:
            if ctypes.util.find_library(lib.split(".so")[0].removeprefix("lib")):
                found.append(lib)
    return found


def _registered_icds() -> list[str]:
    vendors = os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    if os.path.isfile(vendors):
        return [vendors]
    return glob.glob(os.path.join(vendors, "*.icd"))


def _register_unlisted_drivers() -> str | None:
    """Before the loader's first call: if a vendor driver is installed but no ICD file names it,
    write ICD files (keeping the registered ones) into a private folder and point the loader at
    it. Returns the folder, or None when nothing was missing."""
    registered = _registered_icds()
    named = set()
    for path in registered:
        try:
            with open(path) as f:
                named.add(os.path.basename(f.read().strip()))
        except OSError:
            pass
    # Where the user chose the drivers (OCL_ICD_VENDORS), only those installed into this Python
    # environment (by its full path) are added: the user installed them there for it.
    chosen = "OCL_ICD_VENDORS" in os.environ
    missing = [lib for lib in _find_vendor_libraries()
               if os.path.basename(lib) not in named and (not chosen or os.path.isabs(lib))]
    if not missing:
        return None
    files: dict[str, str] = {}
    for path in registered:
        with open(path) as src:
            files[os.path.basename(path)] = src.read()
    for lib in missing:
        files[f"clops-{_VENDOR_LIBRARIES[os.path.basename(lib)]}.icd"] = lib + "\n"
    try:
        folder = _icd_folder(files)
    except OSError as e:
        warnings.warn(f"clops: {e}; the OpenCL loader sees only the registered drivers, not "
                      f"{', '.join(missing)}", RuntimeWarning, stacklevel=3)
        return None
    os.environ["OCL_ICD_VENDORS"] = folder
    return folder


def icd_folder_path(files: dict[str, str]) -> str:
    """Where the ICD folder for ``files`` goes: one per set of files, under the cache folder,
    so that later processes reuse it (no litter)."""
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:16]
    return os.path.join(cachefiles.root(), "icd", digest)


def _icd_folder(files: dict[str, str]) -> str:
    """A folder holding exactly ``files``, that no other user can have chosen or can change: the
    loader loads every library an ICD file in it names. Made private (0700, ours, no links) under
    the cache folder, else a fresh temporary folder; the files are written anew each time."""
    try:
        folder = cachefiles.private_dir(icd_folder_path(files))
    except OSError as e:  # UnsafeDirectoryError too
        warnings.warn(f"clops: the ICD folder in the cache folder cannot be used ({e}); using a "
                      "temporary one for this process", RuntimeWarning, stacklevel=3)
        folder = tempfile.mkdtemp(prefix="clops-icd-")
        atexit.register(shutil.rmtree, folder, True)
    for name in os.listdir(folder):
        # Anything else would be read by the loader too (e.g. left by an older clops); another
        # process's temporary files (".NAME.*.tmp", which the loader skips) are left to it.
        if name not in files and not (name.startswith(".") and name.endswith(".tmp")):
            path = os.path.join(folder, name)
            if stat.S_ISDIR(os.lstat(path).st_mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    for name, text in files.items():
        if not cachefiles.write_file(os.path.join(folder, name), text.encode()):
            raise OSError(f"cannot write the ICD file {name} into {folder}: make the cache "
                          "folder (CLOPS_CACHE_DIR) writable, or set OCL_ICD_VENDORS yourself")
    return folder


def _point_pocl_cache() -> None:
    """Before the loader's first call: PoCL keeps its compiled kernels in POCL_CACHE_DIR
    (default ~/.cache/pocl); put them in clops' cache folder, or, with CLOPS_DISK_CACHE=0, in a
    temporary folder removed at exit, PoCL's cache off. A POCL_* the user set is kept."""
    if not _config.CONFIG.disk_cache:
        os.environ.setdefault("POCL_KERNEL_CACHE", "0")
    if "POCL_CACHE_DIR" in os.environ:
        return
    if _config.CONFIG.disk_cache:
        folder = os.path.join(cachefiles.root(), "pocl")
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            return  # PoCL then uses its own default
    else:
        # PoCL still writes while it builds (and leaves empty temporary files behind).
        folder = tempfile.mkdtemp(prefix="clops-pocl-")
        atexit.register(shutil.rmtree, folder, True)
    os.environ["POCL_CACHE_DIR"] = folder


_ENTRIES: list[DeviceEntry] | None = None


def backend_of(platform: cl.Platform, device: cl.Device) -> str:
    # The platform decides first: PoCL on an AMD CPU is "pocl", not "amd".
    for text in (f"{platform.name} {platform.vendor}".lower(), device.vendor.lower()):
        for backend, words in BACKEND_KEYWORDS.items():
            if any(w in text for w in words):
                return backend
    return "opencl"


def kind_of(device: cl.Device) -> str:
    t = device.type
    if t & cl.device_type.GPU:
        return "gpu"
    if t & cl.device_type.CPU:
        return "cpu"
    return "accelerator"


def _platforms() -> list[cl.Platform]:
    try:
        return list(cl.get_platforms())
    except cl.Error:
        return []


NO_PLATFORM_HELP = """\
no OpenCL platform was found.
  - For a CPU device, install PoCL: `apt-get install pocl-opencl-icd` (Debian/Ubuntu) or
    `pip install pocl-binary-distribution`.
  - For an NVIDIA GPU whose driver is installed but not registered, write an ICD file:
        mkdir -p ~/.clops-icd && echo /usr/lib/libnvidia-opencl.so.1 > ~/.clops-icd/nvidia.icd
        export OCL_ICD_VENDORS=~/.clops-icd
  - `clinfo` lists what the OpenCL loader sees."""


def entries(refresh: bool = False) -> list[DeviceEntry]:
    """Every OpenCL device of every platform, GPUs first, in a stable order."""
    global _ENTRIES
    if _ENTRIES is not None and not refresh:
        return _ENTRIES
    if _ENTRIES is None:
        _point_pocl_cache()
        _register_unlisted_drivers()
    found: list[DeviceEntry] = []
    for p in _platforms():
        try:
            devs = p.get_devices()
        except cl.Error:
            continue
        for d in devs:
            found.append(DeviceEntry(p, d, kind_of(d), backend_of(p, d)))
    order = {"gpu": 0, "accelerator": 1, "cpu": 2}
    # Newer platform versions first within a kind: with two PoCLs installed, the newer wins.
    found.sort(key=lambda e: (order[e.kind], _version_key(e.platform.version)))
    visible = _config.visible_devices()
    if visible is not None:
        found = _visible(found, visible)
    _ENTRIES = found
    return found


def _visible(found: list[DeviceEntry], text: str) -> list[DeviceEntry]:
    """The entries ``CLOPS_VISIBLE_DEVICES`` names, in its order (each selector's matches among
    all devices; later indices count the visible devices only, as CUDA's do)."""
    out: list[DeviceEntry] = []
    for sel in split_selectors(text, "CLOPS_VISIBLE_DEVICES"):
        for e in _match(found, sel):
            if all(e.device.int_ptr != o.device.int_ptr for o in out):
                out.append(e)
    return out


def split_selectors(text: str, what: str = "selector list") -> list[str]:
    """``"cpu,gpu:1"`` -> ``["cpu", "gpu:1"]`` (each checked by ``parse_selector``).

    >>> split_selectors("opencl:gpu:0, opencl:gpu:1")
    ['opencl:gpu:0', 'opencl:gpu:1']
    """
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not p for p in parts):
        raise ValueError(f"{what} {text!r}: give comma-separated selectors such as 'cpu,gpu:1'")
    for p in parts:
        parse_selector(p)
    return parts


def _version_key(version: str) -> tuple[int, ...]:
    nums: list[int] = []
    for tok in version.replace("+", " ").replace("-", " ").split():
        parts = tok.split(".")
        if all(p.isascii() and p.isdigit() for p in parts) and len(parts) >= 2:
            nums.extend(-int(p) for p in parts)
    return tuple(nums)


def parse_selector(selector: str) -> tuple[str | None, str | None, int | None]:
    """``"[backend][:kind][:index]"`` -> (backend, kind, index); every part is optional.

    >>> parse_selector("opencl:gpu:1")
    ('opencl', 'gpu', 1)
    """
    if not isinstance(selector, str):
        raise TypeError(f"a device selector is a string such as 'gpu' or 'cpu:0', not "
                        f"{type(selector).__name__}")
    backend = kind = None
    index = None
    for raw in selector.strip().lower().split(":"):
        part = raw.strip()
        if not part:
            continue
        # NOTE: ASCII digits only: str.isdigit() is also true of '²' and other digits that
        # int() refuses.
        if part.isascii() and part.isdigit():
            if index is not None:
                raise ValueError(f"selector {selector!r} names two indices")
            index = int(part)
        elif part in KINDS:
            if kind is not None:
                raise ValueError(f"selector {selector!r} names two device kinds")
            kind = part
        elif part == "opencl" or part in BACKEND_KEYWORDS:
            if backend is not None:
                raise ValueError(f"selector {selector!r} names two backends")
            backend = part
        else:
            raise ValueError(
                f"selector {selector!r} is malformed: unknown part {part!r}; a selector is "
                f"[backend][:kind][:index] with backend in {['opencl', *BACKEND_KEYWORDS]}, kind "
                f"in {list(KINDS)} and index a number in ASCII digits 0-9, e.g. 'cpu:0'"
            )
    return backend, kind, index


def listing() -> str:
    es = entries()
    if not es:
        return "  (none)"
    return "\n".join(f"  {i}: {e.describe()}" for i, e in enumerate(es))


def _match(es: list[DeviceEntry], selector: str) -> list[DeviceEntry]:
    backend, kind, index = parse_selector(selector)
    matches = [e for e in es if (backend in (None, "opencl") or e.backend == backend)
               and (kind is None or e.kind == kind)]
    return matches[index:index + 1] if index is not None else matches


def select(selector: str) -> list[DeviceEntry]:
    """The devices that match ``selector``, best first; raises with the list of devices."""
    parse_selector(selector)
    es = entries()
    if not es:
        raise DeviceNotFoundError(NO_PLATFORM_HELP)
    matches = _match(es, selector)
    if not matches:
        raise DeviceNotFoundError(
            f"no OpenCL device matches selector {selector!r}. Devices present:\n{listing()}\n"
            "Select one with e.g. 'gpu', 'cpu', 'gpu:1', 'nvidia', 'pocl' or 'opencl:cpu:0'."
        )
    return matches
