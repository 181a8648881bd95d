"""Real Array API clients on clops tensors: array-api-compat, array-api-extra and scikit-learn
estimators with ``array_api_dispatch=True``, compared with their numpy results."""

from __future__ import annotations

import os

import numpy as np
import pytest

import clops as xp


def test_array_api_extra() -> None:
    xpx = pytest.importorskip("array_api_extra")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = xp.asarray(a)
    np.testing.assert_allclose(np.asarray(xpx.cov(x, xp=xp)), np.cov(a), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(xpx.kron(x, x, xp=xp)), np.kron(a, a))
    assert int(xpx.nunique(xp.asarray([1, 2, 2, 3]), xp=xp)) == 3
    np.testing.assert_array_equal(np.asarray(xpx.pad(x, 1, xp=xp)), np.pad(a, 1))
    np.testing.assert_array_equal(
        np.asarray(xpx.setdiff1d(xp.asarray([1, 2, 3, 4]), xp.asarray([2, 4]), xp=xp)), [1, 3])
    y = xpx.at(x, (slice(None), 1)).set(-1.0, copy=True)
    ref = a.copy()
    ref[:, 1] = -1
    np.testing.assert_array_equal(np.asarray(y), ref)
    z = xpx.at(x)[x > 5].add(1.0, copy=True)
    ref = a.copy()
    ref[ref > 5] += 1
    np.testing.assert_array_equal(np.asarray(z), ref)


@pytest.fixture
def sklearn_api() -> object:
    sklearn = pytest.importorskip("sklearn")
    if os.environ.get("SCIPY_ARRAY_API") != "1":
        import sys

        if "scipy" in sys.modules or "sklearn.utils" in sys.modules:
            pytest.skip("scikit-learn's array API mode needs SCIPY_ARRAY_API=1 set before "
                        "scipy is imported")
        os.environ["SCIPY_ARRAY_API"] = "1"
    return sklearn


def test_sklearn_estimators_match_numpy(sklearn_api: object) -> None:
    import sklearn
    from sklearn.datasets import make_classification
    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import Ridge
    from sklearn.metrics import (
        accuracy_score,
        confusion_matrix,
        f1_score,
        mean_squared_error,
        r2_score,
    )
    from sklearn.preprocessing import StandardScaler

    X, y = make_classification(n_samples=60, n_features=5, random_state=0)
    X = X.astype(np.float32)
    Xt, yt = xp.asarray(X), xp.asarray(y)
    cases = [(LinearDiscriminantAnalysis(), True, "transform"),
             (PCA(n_components=3, svd_solver="full"), False, "transform"),
             (Ridge(solver="svd"), True, "predict"),
             (StandardScaler(), False, "transform")]
    for est, supervised, method in cases:
        ref_est = sklearn.base.clone(est)
        with sklearn.config_context(array_api_dispatch=True):
            fitted = est.fit(Xt, yt) if supervised else est.fit(Xt)
            out = getattr(fitted, method)(Xt)
        ref = getattr(ref_est.fit(X, y) if supervised else ref_est.fit(X), method)(X)
        assert isinstance(out, xp.Tensor)
        got = out.to_numpy()
        if method == "transform" and got.ndim == 2:
            # components are defined up to sign (singular vectors): align each column
            got = got * np.where((got * ref).sum(axis=0) < 0, -1, 1)
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3)
    with sklearn.config_context(array_api_dispatch=True):
        assert float(accuracy_score(yt, yt)) == 1.0
        got_r2 = float(r2_score(Xt[:, 0], Xt[:, 1]))
        got_mse = float(mean_squared_error(Xt[:, 0], Xt[:, 1]))
        shifted = xp.asarray(np.roll(y, 1))
        got_cm = confusion_matrix(yt, shifted)
        got_f1 = float(f1_score(yt, shifted))
    np.testing.assert_array_equal(np.asarray(got_cm), confusion_matrix(y, np.roll(y, 1)))
    assert got_f1 == pytest.approx(f1_score(y, np.roll(y, 1)))
    assert got_r2 == pytest.approx(r2_score(X[:, 0], X[:, 1]), rel=1e-4)
    assert got_mse == pytest.approx(mean_squared_error(X[:, 0], X[:, 1]), rel=1e-4)
