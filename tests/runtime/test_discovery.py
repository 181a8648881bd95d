"""Runtime, discovery: selector strings, device listing, CLOPS_DEVICE and capability fields."""

from __future__ import annotations

import importlib

import pytest

import clops
from clops.runtime import CLDevice, DeviceCaps, DeviceNotFoundError, discovery, parse_selector

# NOTE: ``clops.runtime.device`` is the function; the module holds the default device.
device_module = importlib.import_module("clops.runtime.device")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu", (None, "gpu", None)),
        ("cpu", (None, "cpu", None)),
        ("opencl:gpu:0", ("opencl", "gpu", 0)),
        ("gpu:1", (None, "gpu", 1)),
        ("nvidia", ("nvidia", None, None)),
        ("pocl", ("pocl", None, None)),
        ("", (None, None, None)),
        ("cpu:0", (None, "cpu", 0)),
        ("opencl:cpu:12", ("opencl", "cpu", 12)),
        ("amd:gpu", ("amd", "gpu", None)),
        ("accelerator", (None, "accelerator", None)),
        (" PoCL : CPU : 1 ", ("pocl", "cpu", 1)),
        ("3", (None, None, 3)),
    ],
)
def test_parse_selector(text: str, expected: tuple[str | None, str | None, int | None]) -> None:
    assert parse_selector(text) == expected


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("fpga", "unknown part 'fpga'"),
        ("gpu:cpu", "two device kinds"),
        ("nvidia:amd", "two backends"),
        ("gpu:0:1", "two indices"),
        ("gpu:-1", "unknown part '-1'"),
        ("cuda:0", "unknown part 'cuda'"),
    ],
)
def test_parse_selector_errors(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint) as info:
        parse_selector(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("text", ["cpu:\u00b2", "gpu:\u0663", "\uff11", "cpu:1\u00b9"])
def test_non_ascii_digits_are_a_malformed_selector(text: str) -> None:
    """'²' and other digits of other scripts pass str.isdigit() but are no index: the selector
    is malformed, and the message says what a selector looks like."""
    for parse in (parse_selector, clops.device):
        with pytest.raises(ValueError, match="is malformed") as info:
            parse(text)
        msg = str(info.value)
        assert repr(text) in msg and "[backend][:kind][:index]" in msg and "'cpu:0'" in msg


def test_unknown_part_lists_the_choices() -> None:
    with pytest.raises(ValueError) as info:
        parse_selector("tpu")
    msg = str(info.value)
    for word in ("nvidia", "pocl", "opencl", "gpu", "cpu", "[backend][:kind][:index]"):
        assert word in msg


def test_devices_listing() -> None:
    devs = clops.devices()
    assert devs, "no OpenCL device found"
    assert all(isinstance(d, CLDevice) for d in devs)
    assert len({id(d) for d in devs}) == len(devs)
    # The same objects every time, and GPUs before accelerators before CPUs.
    assert [id(d) for d in clops.devices()] == [id(d) for d in devs]
    order = {"gpu": 0, "accelerator": 1, "cpu": 2}
    ranks = [order[d.kind] for d in devs]
    assert ranks == sorted(ranks)
    assert clops.device() in devs
    listing = discovery.listing()
    for d in devs:
        assert d.name in listing


def test_every_device_is_reachable_by_its_selectors() -> None:
    counts: dict[str, int] = {}
    for d in clops.devices():
        index = counts.get(d.kind, 0)
        counts[d.kind] = index + 1
        assert d.selector == f"opencl:{d.kind}:{index}"
        assert clops.device(d.selector) is d
        assert clops.device(f"{d.kind}:{index}") is d
        by_backend = clops.device(f"{d.backend}:{d.kind}")
        assert (by_backend.backend, by_backend.kind) == (d.backend, d.kind)
    for kind in counts:
        assert clops.device(kind).kind == kind
    assert clops.device("").probe("builds")  # empty: the first device that builds


def test_default_device_builds_kernels() -> None:
    # The automatic choice skips a driver that cannot build (two PoCLs, one too old for the CPU).
    assert clops.device().probe("builds") is True


def test_pocl_selector_when_present() -> None:
    pocls = [d for d in clops.devices() if d.backend == "pocl"]
    if not pocls:
        pytest.skip("no PoCL device present")
    dev = clops.device("pocl")
    assert dev.backend == "pocl"
    assert dev.kind == "cpu"
    assert dev in pocls


@pytest.mark.parametrize("selector", ["cpu:99", "opencl:gpu:42", "accelerator:7"])
def test_no_match_lists_devices(selector: str) -> None:
    with pytest.raises(DeviceNotFoundError) as info:
        clops.device(selector)
    msg = str(info.value)
    assert repr(selector) in msg
    assert "Devices present" in msg
    for d in clops.devices():
        assert d.name in msg


def test_missing_backend_is_not_found() -> None:
    present = {d.backend for d in clops.devices()}
    absent = next(b for b in discovery.BACKEND_KEYWORDS if b not in present)
    with pytest.raises(DeviceNotFoundError, match=repr(absent)):
        clops.device(absent)


def test_bad_selector_types() -> None:
    with pytest.raises(TypeError):
        clops.device(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown part"):
        clops.device("warp-drive")


def test_clops_device_env(clops_env) -> None:
    devs = clops.devices()
    # The last device differs from the automatic choice whenever there are two or more.
    target = devs[-1]
    cfg = clops_env(CLOPS_DEVICE=target.selector)
    assert cfg.device == target.selector
    device_module._DEFAULT = None
    assert clops.device() is target
    assert clops.device() is target  # remembered


def test_clops_device_env_kind(clops_env) -> None:
    kind = clops.devices()[0].kind
    clops_env(CLOPS_DEVICE=kind)
    device_module._DEFAULT = None
    assert clops.device().kind == kind


def test_clops_device_env_bad(clops_env) -> None:
    clops_env(CLOPS_DEVICE="cpu:99")
    device_module._DEFAULT = None
    with pytest.raises(DeviceNotFoundError, match="cpu:99"):
        clops.device()


def test_clops_device_env_unset_is_automatic(clops_env) -> None:
    cfg = clops_env(CLOPS_DEVICE=None)
    assert cfg.device is None
    device_module._DEFAULT = None
    auto = clops.device()
    assert auto.probe("builds")
    gpus = [d for d in clops.devices() if d.kind == "gpu" and d.probe("builds")]
    if gpus:
        assert auto.kind == "gpu"


def test_set_default_device(clops_env) -> None:
    clops_env()
    last = clops.devices()[-1]
    assert clops.set_default_device(last.selector) is last
    assert clops.device() is last
    assert clops.set_default_device(None) is None
    assert clops.device().probe("builds")


def test_caps_are_sane(device: CLDevice) -> None:
    c = device.caps
    assert isinstance(c, DeviceCaps)
    assert c.name == device.name and c.name
    assert c.kind == device.kind in ("gpu", "cpu", "accelerator")
    assert c.compute_units >= 1
    assert c.global_mem > 0
    assert 0 < c.max_alloc <= c.global_mem
    assert c.local_mem > 0
    assert c.max_work_group >= 1
    assert len(c.max_work_item_sizes) >= 1
    assert all(n >= 1 for n in c.max_work_item_sizes)
    assert c.address_bits in (32, 64)
    assert c.preferred_vector_width_float >= 0
    assert c.opencl_version.startswith("OpenCL")
    assert list(c.extensions) == sorted(c.extensions)
    assert all(isinstance(e, str) and " " not in e for e in c.extensions)
    assert c.fp16_extension == ("cl_khr_fp16" in c.extensions)
    if "cl_khr_fp64" in c.extensions:
        assert c.fp64
    # Probes: bools once run, remembered in caps.
    assert device.probe("builds") is True
    assert device.caps.builds is True
    assert isinstance(device.probe("nvidia_ptx"), bool)
    if device.backend != "nvidia":
        assert device.caps.nvidia_ptx is False


def test_caps_are_cached(device: CLDevice) -> None:
    assert device.caps is device.caps
    assert device.key == f"{device.name}|{device.platform_version}|{device.driver_version}"
    assert device.name in repr(device) and device.selector in str(device)
