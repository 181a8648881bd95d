"""clops.fft against numpy.fft, once through VkFFT (forced) and once through clops' own kernels
(VkFFT denied, and VkFFT missing), over sizes (powers of two, mixed radix, primes for
Bluestein), axes, n (crop and pad), norms, dtypes and strided inputs."""

from __future__ import annotations

import numpy as np
import pytest

import clops
import clops.fft as cfft
from clops import providers
from clops.array import dispatch
from clops.kernels import fft, layout
from clops.providers import VkFFTProvider

VKFFT = providers.get("vkfft")
RNG = np.random.default_rng(11)


def crand(*shape, dtype=np.complex64):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)


@pytest.fixture(params=["vkfft", "generated"])
def impl(request, clops_env):
    """Run a test with VkFFT forced, then with clops' own kernels."""
    if request.param == "vkfft":
        if not VKFFT.available:
            pytest.skip(f"pyvkfft missing: {VKFFT.unavailable_reason()}")
        clops_env(CLOPS_PROVIDERS="+vkfft")
    else:
        clops_env(CLOPS_PROVIDERS="-vkfft")
    return request.param


def close(got, want, tol=2e-5):
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("n", [1, 2, 6, 8, 16, 24, 30, 49, 64, 97, 128, 512, 8192, 3 * 4096])
def test_fft_sizes(device, impl, n):
    # passes of radix 16, 8 (and 4 and 2 after them), the small primes and Bluestein
    x = crand(3, n)
    t = clops.asarray(x, device=device)
    close(cfft.fft(t), np.fft.fft(x))
    close(cfft.ifft(t), np.fft.ifft(x))


def test_axes_n_norms(device, impl):
    x = crand(4, 6, 10)
    r = x.real.astype(np.float32).copy()
    t, tr = clops.asarray(x, device=device), clops.asarray(r, device=device)
    close(cfft.fft(t, axis=0, n=7), np.fft.fft(x, axis=0, n=7))
    close(cfft.fft(tr, axis=1, n=3, norm="ortho"), np.fft.fft(r, axis=1, n=3, norm="ortho"))
    close(cfft.ifft(t, norm="forward"), np.fft.ifft(x, norm="forward"))
    close(cfft.rfft(tr), np.fft.rfft(r))
    close(cfft.rfft(tr, axis=0, n=9, norm="forward"), np.fft.rfft(r, axis=0, n=9, norm="forward"))
    close(cfft.irfft(t), np.fft.irfft(x))
    close(cfft.irfft(t, n=11, axis=1, norm="ortho"), np.fft.irfft(x, n=11, axis=1, norm="ortho"))
    close(cfft.hfft(t), np.fft.hfft(x))
    close(cfft.ihfft(tr), np.fft.ihfft(r))
    close(cfft.fftn(t), np.fft.fftn(x))
    close(cfft.ifftn(t, s=(5, 4), axes=(0, 2)), np.fft.ifftn(x, s=(5, 4), axes=(0, 2)))
    close(cfft.rfftn(tr), np.fft.rfftn(r))
    close(cfft.irfftn(t, axes=(0, 2)), np.fft.irfftn(x, axes=(0, 2)))


def test_strided_input_and_float64(device, impl):
    x = crand(6, 20)
    t = clops.asarray(x, device=device)
    close(cfft.fft(t[1:5, ::2]), np.fft.fft(x[1:5, ::2]))
    close(cfft.fft(t.mT), np.fft.fft(x.T))
    if device.caps.fp64:
        d = crand(2, 37, dtype=np.complex128)
        got = cfft.fft(clops.asarray(d, device=device))
        assert got.dtype == clops.complex128
        close(got, np.fft.fft(d), tol=1e-12)


def test_helpers(device):
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    t = clops.asarray(x, device=device)
    np.testing.assert_array_equal(np.asarray(cfft.fftshift(t)), np.fft.fftshift(x))
    np.testing.assert_array_equal(np.asarray(cfft.ifftshift(t, axes=0)),
                                  np.fft.ifftshift(x, axes=0))
    np.testing.assert_allclose(np.asarray(cfft.fftfreq(7, d=0.5)), np.fft.fftfreq(7, 0.5))
    np.testing.assert_allclose(np.asarray(cfft.rfftfreq(8)), np.fft.rfftfreq(8))
    with pytest.raises(ValueError, match="norm"):
        cfft.fft(t, norm="sideways")
    with pytest.raises(TypeError, match="real"):
        cfft.rfft(clops.asarray(crand(4), device=device))


def test_vkfft_chosen_and_recorded(device, clops_env):
    if not VKFFT.available:
        pytest.skip(f"pyvkfft missing: {VKFFT.unavailable_reason()}")
    clops_env(CLOPS_PROVIDERS="+vkfft")
    t = clops.asarray(crand(4, 64), device=device)
    with clops.profile() as prof:
        np.asarray(cfft.fft(t))
    assert [r.name for r in prof.records if r.kind == "provider"] == ["vkfft.fft"]
    clops_env(CLOPS_PROVIDERS="none")
    with clops.profile() as prof:
        np.asarray(cfft.fft(t))
    assert not [r for r in prof.records if r.kind == "provider"]
    assert any(r.name.startswith("fft_radix") for r in prof.kernels())


def test_measured_choice(device, clops_env):
    clops_env(CLOPS_PROVIDERS=None)
    x = crand(8, 256)
    close(cfft.fft(clops.asarray(x, device=device)), np.fft.fft(x))
    (d,) = [d for d in providers.choices() if d.op == "fft"]
    if VKFFT.available:
        assert d.reason == "measured" and set(d.costs) == {"vkfft", "generated"}
    else:
        assert d.choice == "generated"


def test_without_pyvkfft(device, clops_env, monkeypatch):
    missing = VkFFTProvider()
    monkeypatch.setattr(missing, "load", lambda: (_ for _ in ()).throw(ImportError("no pyvkfft")))
    monkeypatch.setitem(providers.registry._REGISTRY, "vkfft", missing)
    clops_env(CLOPS_PROVIDERS="+vkfft")
    assert "no pyvkfft" in missing.unavailable_reason()
    assert providers.choose("fft", device, "complex64", (2, 8)) is None
    x = crand(2, 12)
    close(cfft.fft(clops.asarray(x, device=device)), np.fft.fft(x))


def test_rows_at_an_offset(device, up, down):
    # an offset that is not a multiple of the base address alignment: VkFFT gets a copy
    x = crand(2, 16)
    store = np.zeros(3 + x.size, np.complex64)
    store[3:] = x.ravel()
    rows = up(store, (2, 16), (16, 1), 3)
    for run in ([VKFFT.fft] if VKFFT.available else []) + [fft.fft]:
        out = layout.empty(device, (2, 16), "complex64")
        run(device, rows, out)
        np.testing.assert_allclose(down(out), np.fft.fft(x), atol=1e-4)
    with dispatch.generated_only():
        out = layout.empty(device, (2, 16), "complex64")
        dispatch.fft_rows("fft", device, rows, out, inverse=True, scale=1 / 16)
        np.testing.assert_allclose(down(out), np.fft.ifft(x), atol=1e-5)


@pytest.mark.parametrize("n", [4, 6, 10, 16, 74, 2 * 97, 1000, 4096])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_rfft_of_even_lengths_by_half_transforms(device, n, dtype):
    """An even length's rfft is the n/2-point transform of its (even, odd) pairs and one last
    step (clops' own kernels): rows at even and odd offsets (a copy), every dtype, a scale,
    and the DC and Nyquist terms of constant and alternating signals."""
    if dtype == "float64" and not device.caps.fp64:
        pytest.skip("no cl_khr_fp64")
    cdt = layout.COMPLEX_OF[dtype]
    x = RNG.standard_normal((3, n)).astype(dtype)
    x[1] = 2.5
    x[2, ::2], x[2, 1::2] = 1.0, -1.0
    store = np.zeros(1 + x.size, dtype)
    for off in (0, 1):
        store[off:off + x.size] = x.ravel()
        buf = device.alloc(store.nbytes)
        device.write(buf, store, blocking=True)
        rows = layout.Operand(buf, (3, n), dtype, (n, 1), off)
        out = layout.empty(device, (3, n // 2 + 1), cdt)
        fft.rfft(device, rows, out, scale=0.5)
        got = np.empty((3, n // 2 + 1), np.complex128 if cdt == "complex128" else np.complex64)
        device.read(got, out.buffer)
        want = np.fft.rfft(x.astype(np.float64)) * 0.5
        tol = 1e-12 if dtype == "float64" else 3e-6 * np.log2(n)
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
        assert abs(got[1, 0] - 1.25 * n) <= tol * n and abs(got[2, n // 2] - 0.5 * n) <= tol * n


def test_wide_passes_first():
    assert fft.radices(2 ** 23) == [16, 16, 16, 16, 16, 8]
    assert fft.radices(3 * 4096) == [16, 16, 16, 3]
    assert fft.radices(64) == [16, 4] and fft.radices(32) == [16, 2]
    assert fft.radices(2 * 37) is None


@pytest.mark.parametrize("n", [6, 97, 105, 2 * 97, 4096 + 2])
def test_gpu_launch_sizes(device, monkeypatch, n):
    """On GPUs the kernels run in groups of GPU_ROW_GROUP along a row, the row's work-items
    rounded up past its end (the path forced here on any device): odd and prime lengths,
    Bluestein's steps, rfft's last step and irfft's extension."""
    monkeypatch.setattr(device, "kind", "gpu")
    x = crand(3, n)
    r = x.real.astype(np.float32).copy()
    with dispatch.generated_only():
        t, tr = clops.asarray(x, device=device), clops.asarray(r, device=device)
        close(cfft.fft(t), np.fft.fft(x))
        close(cfft.ifft(t), np.fft.ifft(x))
        close(cfft.rfft(tr), np.fft.rfft(r))
        close(cfft.irfft(t), np.fft.irfft(x))
