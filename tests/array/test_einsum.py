"""clops.einsum against numpy.einsum: products that are batched matmuls, outer products, sums
within and across operands, implicit outputs, ellipses, several operands, integer and mixed
dtypes; what it refuses; numpy's einsum on tensors (the Dask path) on the device."""

from __future__ import annotations

import numpy as np
import pytest

import clops

RNG = np.random.default_rng(5)

CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),                 # implicit output
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bij,bkj->bki", [(2, 3, 4), (2, 5, 4)]),    # transposed operands and output
    ("ij,kj->", [(3, 4), (5, 4)]),               # everything summed
    ("i,i->", [(7,), (7,)]),
    ("i,j->ij", [(3,), (4,)]),                   # outer product
    ("ij,ij->ij", [(3, 4), (3, 4)]),             # elementwise
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ijk->kj", [(2, 3, 4)]),
    ("ijk,jl->ikl", [(2, 3, 4), (3, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),  # three operands
    ("abc,cd,a->bd", [(2, 3, 4), (4, 5), (2,)]),
    ("ik,jk->ijk", [(2, 3), (4, 3)]),            # a shared label kept
    ("ij,jk->k", [(3, 4), (4, 5)]),              # a label summed within one operand
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,jk", [(2, 2, 3, 4), (4, 5)]),
    ("i...,i...->...", [(3, 2, 4), (3, 2, 4)]),
    ("ij,j->i", [(3, 4), (1,)]),                 # a size-1 label broadcast
]


@pytest.mark.parametrize("subscripts,shapes", CASES)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_einsum_matches_numpy(device, subscripts, shapes, dtype):
    arrs = [RNG.integers(-3, 4, s).astype(dtype) if dtype == "int32"
            else RNG.standard_normal(s).astype(dtype) for s in shapes]
    got = clops.einsum(subscripts, *[clops.asarray(a, device=device) for a in arrs])
    want = np.einsum(subscripts, *arrs)
    assert got.shape == want.shape and got.dtype.name == str(want.dtype)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_dtypes_promote_as_the_array_api_does(device):
    a = RNG.integers(-3, 4, (3, 4)).astype(np.int8)
    b = RNG.integers(-3, 4, (4, 2)).astype(np.int16)
    got = clops.einsum("ij,jk->ik", clops.asarray(a, device=device),
                       clops.asarray(b, device=device))
    assert got.dtype.name == "int16"
    np.testing.assert_array_equal(np.asarray(got), a.astype(np.int16) @ b)
    with pytest.raises(TypeError, match="promotion"):  # float with int: none in the standard
        clops.einsum("ij,jk->ik", clops.asarray(a.astype(np.float32), device=device),
                     clops.asarray(b, device=device))


def test_a_product_runs_as_matmul(device):
    from clops import profile

    a, b = (clops.asarray(RNG.standard_normal((64, 64)).astype(np.float32), device=device)
            for _ in range(2))
    clops.realize(a, b)
    bt = clops.matrix_transpose(b)
    # (once before both: a first product may run a one-time check of the native kernels)
    np.asarray(clops.matmul(a, bt))
    with profile() as prof:
        np.asarray(clops.einsum("ij,kj->ik", a, b))
    names = [r.name for r in prof.kernels()]
    direct = [r.name for r in _kernels(lambda: np.asarray(clops.matmul(a, bt)))]
    assert sorted(set(names)) == sorted(set(direct))


def _kernels(fn):
    from clops import profile

    with profile() as prof:
        fn()
    return prof.kernels()


@pytest.mark.parametrize("subscripts,shapes,match", [
    ("ii->i", [(3, 3)], "repeat within one operand"),
    ("ij,jk->ik", [(3, 4)], "operand subscripts"),
    ("ij,jk->il", [(3, 4), (4, 5)], "names one no operand has"),
    ("ij,jk->ii", [(3, 4), (4, 5)], "repeats a label"),
    ("ijk,jk->ik", [(3, 4), (4, 5)], "does not label"),
    ("ij,jk->ik", [(3, 4), (5, 6)], "sizes"),
    ("i2,j->ij", [(3, 1), (4,)], "cannot read"),
])
def test_bad_subscripts_are_refused_by_name(device, subscripts, shapes, match):
    ops = [clops.asarray(np.ones(s, np.float32), device=device) for s in shapes]
    with pytest.raises((ValueError, NotImplementedError), match=match):
        clops.einsum(subscripts, *ops)


def test_numpy_einsum_on_tensors_runs_on_the_device(device):
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    b = RNG.standard_normal((4, 5)).astype(np.float32)
    ta, tb = clops.asarray(a, device=device), clops.asarray(b, device=device)
    got = np.einsum("ij,jk->ik", ta, tb, dtype=np.float64, optimize=False)
    assert isinstance(got, clops.Tensor) and got.dtype.name == "float64" \
        or not device.caps.fp64
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=1e-5, atol=1e-5)
    # a diagonal runs on the host, the result back on the device
    sq = clops.asarray(RNG.standard_normal((3, 3)).astype(np.float32), device=device)
    diag = np.einsum("ii->i", sq)
    assert isinstance(diag, clops.Tensor)
    np.testing.assert_allclose(np.asarray(diag), np.diag(np.asarray(sq)), rtol=1e-6)


@pytest.mark.parametrize("seed", range(24))
def test_random_contractions_match_numpy(device, seed):
    """Random labels (1 to 3 operands of 0 to 3 distinct labels), sizes and outputs."""
    rng = np.random.default_rng(seed)
    sizes = {c: int(rng.integers(1, 5)) for c in "abcde"}
    ins = ["".join(rng.choice(list("abcde"), int(rng.integers(0, 4)), replace=False))
           for _ in range(int(rng.integers(1, 4)))]
    used = sorted(set("".join(ins)))
    if rng.random() < 0.3:
        subscripts = ",".join(ins)  # implicit output
    else:
        out = "".join(rng.permutation(used)[:int(rng.integers(0, len(used) + 1))])
        subscripts = ",".join(ins) + "->" + out
    arrs = [rng.standard_normal(tuple(sizes[c] for c in i)).astype(np.float32) for i in ins]
    got = clops.einsum(subscripts, *[clops.asarray(a, device=device) for a in arrs])
    want = np.einsum(subscripts, *arrs)
    assert got.shape == want.shape, subscripts
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4, err_msg=subscripts)
