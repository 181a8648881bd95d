"""runtime/tma.py without a GPU: tensor maps are asked of the CUDA driver once per set of
arguments, and a refusal is remembered as one (a stand-in for libcuda counts the calls)."""

from __future__ import annotations

import ctypes

from clops.runtime import tma


class _FakeCuda:
    """The three libcuda calls encode makes; the map's first word is the address it got."""

    def __init__(self) -> None:
        self.encodes = 0

    def cuCtxPushCurrent_v2(self, ctx):  # noqa: N802 - libcuda's names
        return 0

    def cuCtxPopCurrent_v2(self, out):  # noqa: N802
        return 0

    def cuTensorMapEncodeTiled(self, out, dtype, rank, address, *rest):  # noqa: N802
        self.encodes += 1
        if address.value % 16:
            return 1  # CUDA_ERROR_INVALID_VALUE
        ctypes.cast(out, ctypes.POINTER(ctypes.c_uint64))[0] = address.value
        return 0


def test_encode_asks_the_driver_once_per_arguments():
    lib = _FakeCuda()
    cu = tma._Cuda(lib, ctypes.c_void_p(1))
    args = ((64, 128, 1), (128, 128 * 128), (64, 64, 1))
    first = cu.encode(1 << 20, *args)
    assert first is not None and len(first) == 128
    assert int.from_bytes(first[:8], "little") == 1 << 20
    assert cu.encode(1 << 20, *args) == first and lib.encodes == 1
    other = cu.encode(2 << 20, *args)
    assert other != first and lib.encodes == 2
    assert cu.encode(8, *args) is None and cu.encode(8, *args) is None and lib.encodes == 3


def test_tma_is_on_unless_turned_off(monkeypatch):
    """Hopper GPUs' float16 products take the tensor memory accelerator by default;
    CLOPS_TMA=0 (or false, no, off) keeps them on the cp.async copies."""
    from clops import _config

    monkeypatch.delenv("CLOPS_TMA", raising=False)
    assert _config.tma()
    for off in ("0", "false", "no", "off"):
        monkeypatch.setenv("CLOPS_TMA", off)
        assert not _config.tma()
    monkeypatch.setenv("CLOPS_TMA", "1")
    assert _config.tma()
