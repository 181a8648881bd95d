"""Array, dtypes: equality of dtype objects with non-dtypes (found by the array-api-tests suite)."""

import numpy as np
import pytest

import clops


@pytest.mark.parametrize(
    "name", ["bool", "int8", "int64", "uint32", "float32", "float64", "complex64"]
)
def test_dtype_never_equals_none_or_python_types(name: str) -> None:
    dt = getattr(clops, name)
    # np.dtype(None) and np.dtype(float) are float64: a dtype must still not equal them
    assert not (dt == None)  # noqa: E711
    assert dt != None  # noqa: E711
    for t in (bool, int, float, complex):
        assert not (dt == t)
    assert dt == name
    assert dt == np.dtype(name)
    assert dt == getattr(clops, name)


def test_promotion_lookup_by_equality_does_not_match_none() -> None:
    # a mapping keyed by equality (as the conformance suite's promotion table is) must not
    # report a dtype where the lookup found nothing
    table = {("bool", "bool"): clops.bool}
    found = table.get((clops.bool, clops.float64))
    assert found != clops.float64
    assert not clops.can_cast(clops.bool, clops.float64)
