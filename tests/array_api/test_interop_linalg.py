"""DLPack, __array__ and pyopencl interop; clops.linalg against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import clops as xp


def test_dlpack_to_numpy_and_back() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = xp.asarray(a)[:, 1:3]
    assert t.__dlpack_device__()[0] == 4  # kDLOpenCL
    np.testing.assert_array_equal(np.from_dlpack(t), a[:, 1:3])
    cap = t.__dlpack__(dl_device=(1, 0))
    assert cap is not None
    if t.device.caps.unified_memory:  # PoCL: the memory itself, a strided window of it
        torch = pytest.importorskip("torch")
        v = torch.utils.dlpack.from_dlpack(t.__dlpack__(copy=False))
        assert v.tolist() == a[:, 1:3].tolist() and v.stride() == (4, 1)
    else:
        with pytest.raises(BufferError, match="usm_type"):
            t.__dlpack__(copy=False)
    back = xp.from_dlpack(a)
    assert back.dtype == xp.float32
    np.testing.assert_array_equal(back.to_numpy(), a)
    np.testing.assert_array_equal(np.asarray(t), a[:, 1:3])
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float64), a[:, 1:3])


def test_from_dlpack_torch() -> None:
    torch = pytest.importorskip("torch")
    tt = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    t = xp.from_dlpack(tt)
    assert t.dtype == xp.int32
    np.testing.assert_array_equal(t.to_numpy(), tt.numpy())
    assert torch.from_dlpack(xp.asarray([1.0, 2.0])).tolist() == [1.0, 2.0]


def test_pyopencl_arrays_without_copies(device: xp.CLDevice) -> None:
    import pyopencl.array as cl_array

    t = xp.arange(10.0, device=device) * 2
    a = t.to_pyopencl()
    assert a.base_data is t.buffer.mem
    np.testing.assert_array_equal(a.get(), np.arange(10.0) * 2)
    b = cl_array.to_device(device.queue.cl_queue, np.arange(5, dtype=np.int32))
    u = xp.asarray(b, device=device)
    assert u.buffer.mem is b.base_data
    u[1] = 100  # writes through to the pyopencl array's memory
    assert b.get().tolist() == [0, 100, 2, 3, 4]


RNG = np.random.default_rng(0)
M = RNG.normal(size=(2, 4, 4)).astype(np.float32)
SPD = (M @ np.swapaxes(M, -1, -2) + 4 * np.eye(4)).astype(np.float32)


def close(t: xp.Tensor, ref: np.ndarray, tol: float = 1e-4) -> None:
    got = t.to_numpy()
    assert got.shape == np.shape(ref)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_linalg_on_device() -> None:
    x = xp.asarray(M)
    close(xp.linalg.diagonal(x, offset=1), np.diagonal(M, 1, -2, -1))
    close(xp.linalg.diagonal(x, offset=-2), np.diagonal(M, -2, -2, -1))
    close(xp.linalg.trace(x), np.trace(M, axis1=-2, axis2=-1))
    close(xp.linalg.outer(x[0, 0], x[0, 1]), np.outer(M[0, 0], M[0, 1]))
    v = M[..., :3]
    close(xp.linalg.cross(xp.asarray(v), xp.asarray(v[::-1])), np.cross(v, v[::-1]))
    close(xp.linalg.matrix_power(x, 3), np.linalg.matrix_power(M, 3), 1e-3)
    close(xp.linalg.matrix_power(x, 0), np.linalg.matrix_power(M, 0))
    for ord in (1, 2, np.inf, -np.inf, 0, 3):
        close(xp.linalg.vector_norm(x, axis=-1, ord=ord), np.linalg.norm(M, ord=ord, axis=-1))
    close(xp.linalg.vector_norm(x, axis=(0, 2), keepdims=True),
          np.sqrt((M ** 2).sum(axis=(0, 2), keepdims=True)))
    for ord in ("fro", 1, -1, np.inf, -np.inf, 2, -2, "nuc"):
        close(xp.linalg.matrix_norm(x, ord=ord), np.linalg.norm(M, ord=ord, axis=(-2, -1)),
              1e-3)
    close(xp.linalg.vecdot(x, x), np.sum(M * M, axis=-1))
    close(xp.linalg.matmul(x, x), M @ M)
    close(xp.linalg.tensordot(x, x, axes=([1, 2], [1, 2])),
          np.tensordot(M, M, axes=([1, 2], [1, 2])), 1e-3)


def test_linalg_decompositions_keep_dtypes() -> None:
    x, s = xp.asarray(M), xp.asarray(SPD)
    close(xp.linalg.cholesky(s), np.linalg.cholesky(SPD))
    close(xp.linalg.cholesky(s, upper=True), np.swapaxes(np.linalg.cholesky(SPD), -1, -2))
    close(xp.linalg.inv(s), np.linalg.inv(SPD))
    close(xp.linalg.det(x), np.linalg.det(M), 1e-3)
    sign, logdet = xp.linalg.slogdet(x)
    close(sign, np.linalg.slogdet(M)[0])
    close(logdet, np.linalg.slogdet(M)[1])
    b = RNG.normal(size=(2, 4)).astype(np.float32)
    close(xp.linalg.solve(s, xp.asarray(b[0])), np.linalg.solve(SPD, b[0]))
    close(xp.linalg.eigvalsh(s), np.linalg.eigvalsh(SPD), 1e-3)
    w, v = xp.linalg.eigh(s)
    close(xp.matmul(xp.asarray(SPD), v), (v * xp.expand_dims(w, axis=-2)).to_numpy(), 1e-3)
    q, r = xp.linalg.qr(x)
    close(xp.matmul(q, r), M, 1e-4)
    u, sv, vh = xp.linalg.svd(x, full_matrices=False)
    close(sv, np.linalg.svd(M, compute_uv=False))
    close(xp.linalg.svdvals(x), np.linalg.svd(M, compute_uv=False))
    close(xp.linalg.pinv(x), np.linalg.pinv(M), 1e-3)
    assert xp.linalg.matrix_rank(x).to_numpy().tolist() == [4, 4]
    for t in (xp.linalg.inv(s), q, u, sv):
        assert t.dtype == xp.float32 and isinstance(t, xp.Tensor)
    with pytest.raises(TypeError):
        xp.linalg.inv(xp.asarray([[1, 0], [0, 1]]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_device_factorizations(dtype: type, device: xp.CLDevice) -> None:
    if dtype == np.float64 and not device.caps.fp64:
        pytest.skip("no fp64 on this device")
    rng = np.random.default_rng(3)
    tol = 2e-3 if dtype == np.float32 else 1e-9
    for n in (1, 3, 37):
        a = rng.normal(size=(2, n, n)).astype(dtype)
        spd = (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(dtype)
        x, s = xp.asarray(a, device=device), xp.asarray(spd, device=device)
        np.testing.assert_allclose(xp.linalg.det(x).to_numpy(), np.linalg.det(a),
                                   rtol=tol * n, atol=tol)
        sign, logabs = xp.linalg.slogdet(x)
        rs, rl = np.linalg.slogdet(a)
        np.testing.assert_array_equal(sign.to_numpy(), rs)
        np.testing.assert_allclose(logabs.to_numpy(), rl, rtol=tol, atol=tol)
        np.testing.assert_allclose(xp.linalg.inv(s).to_numpy(), np.linalg.inv(spd), rtol=tol,
                                   atol=tol)
        np.testing.assert_allclose(xp.linalg.cholesky(s).to_numpy(), np.linalg.cholesky(spd),
                                   rtol=tol, atol=tol)
        np.testing.assert_allclose(xp.linalg.cholesky(s, upper=True).to_numpy(),
                                   np.swapaxes(np.linalg.cholesky(spd), -1, -2), rtol=tol,
                                   atol=tol)
        b = rng.normal(size=(3, 1, n, 2)).astype(dtype)  # batch dims broadcast
        np.testing.assert_allclose(xp.linalg.solve(s, xp.asarray(b, device=device)).to_numpy(),
                                   np.linalg.solve(spd, b), rtol=tol * 10, atol=tol * 10)
        v = rng.normal(size=n).astype(dtype)
        np.testing.assert_allclose(xp.linalg.solve(s[0], xp.asarray(v, device=device))
                                   .to_numpy(), np.linalg.solve(spd[0], v), rtol=tol * 10,
                                   atol=tol * 10)
    sing = xp.asarray(np.ones((3, 3), dtype), device=device)
    assert xp.linalg.det(sing).item() == 0
    sign, logabs = xp.linalg.slogdet(sing)
    assert sign.item() == 0 and logabs.item() == -np.inf


@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 6), (2, 5, 4), (1, 1), (33, 20)])
@pytest.mark.parametrize("mode", ["reduced", "complete"])
def test_device_qr_matches_lapack(shape: tuple[int, ...], mode: str,
                                  device: xp.CLDevice) -> None:
    a = np.random.default_rng(len(shape) + shape[-1]).normal(size=shape).astype(np.float32)
    q, r = xp.linalg.qr(xp.asarray(a, device=device), mode=mode)
    qn, rn = np.linalg.qr(a, mode=mode)
    assert q.shape == qn.shape and r.shape == rn.shape and q.dtype == xp.float32
    np.testing.assert_allclose(q.to_numpy(), qn, atol=2e-5)
    np.testing.assert_allclose(r.to_numpy(), rn, atol=2e-5)


@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 6), (2, 5, 4), (1, 1), (24, 17)])
@pytest.mark.parametrize("full", [True, False])
def test_device_svd_eigh(shape: tuple[int, ...], full: bool, device: xp.CLDevice) -> None:
    a = np.random.default_rng(shape[-1]).normal(size=shape).astype(np.float32)
    u, s, vh = xp.linalg.svd(xp.asarray(a, device=device), full_matrices=full)
    un, sn, vhn = np.linalg.svd(a, full_matrices=full)
    U, S, Vh = u.to_numpy(), s.to_numpy(), vh.to_numpy()
    assert (U.shape, S.shape, Vh.shape) == (un.shape, sn.shape, vhn.shape)
    np.testing.assert_allclose(S, sn, rtol=1e-4, atol=1e-5)
    k = S.shape[-1]
    np.testing.assert_allclose((U[..., :k] * S[..., None, :]) @ Vh[..., :k, :], a, atol=1e-4)
    eye_u = np.swapaxes(U, -1, -2) @ U
    np.testing.assert_allclose(eye_u, np.broadcast_to(np.eye(U.shape[-1]), eye_u.shape),
                               atol=1e-5)
    np.testing.assert_allclose(xp.linalg.svdvals(xp.asarray(a, device=device)).to_numpy(), sn,
                               rtol=1e-4, atol=1e-5)
    sq = a[..., :k, :k] + np.swapaxes(a[..., :k, :k], -1, -2)
    w, v = xp.linalg.eigh(xp.asarray(sq, device=device))
    W, V = w.to_numpy(), v.to_numpy()
    np.testing.assert_allclose(W, np.linalg.eigvalsh(sq), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(sq @ V, V * W[..., None, :], atol=1e-4)
    np.testing.assert_allclose(xp.linalg.eigvalsh(xp.asarray(sq, device=device)).to_numpy(), W,
                               atol=1e-5)


def test_device_rank_and_pinv_of_rank_deficient() -> None:
    r = np.random.default_rng(0).normal(size=(6, 2)).astype(np.float32)
    low = r @ r.T  # rank 2
    assert xp.linalg.matrix_rank(xp.asarray(low)).item() == 2
    ref = np.linalg.pinv(low, rtol=6 * np.finfo(np.float32).eps)
    np.testing.assert_allclose(xp.linalg.pinv(xp.asarray(low)).to_numpy(), ref, atol=1e-4)
    assert xp.linalg.matrix_rank(xp.asarray(low), rtol=0.5).item() == 1


def test_complex_inputs_use_the_host_and_keep_dtypes() -> None:
    rng = np.random.default_rng(5)
    z = (rng.normal(size=(3, 3)) + 1j * rng.normal(size=(3, 3))).astype(np.complex64)
    h = (z @ z.conj().T + 3 * np.eye(3)).astype(np.complex64)
    x, hx = xp.asarray(z), xp.asarray(h)
    for got, ref in ((xp.linalg.inv(x), np.linalg.inv(z)), (xp.linalg.det(x), np.linalg.det(z)),
                     (xp.linalg.cholesky(hx), np.linalg.cholesky(h)),
                     (xp.linalg.eigvalsh(hx), np.linalg.eigvalsh(h)),
                     (xp.linalg.svdvals(x), np.linalg.svd(z, compute_uv=False)),
                     (xp.linalg.solve(hx, x), np.linalg.solve(h, z))):
        assert got.dtype == ref.dtype
        np.testing.assert_allclose(got.to_numpy(), ref, rtol=1e-4, atol=1e-4)
