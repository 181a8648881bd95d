"""Graph, dtypes: ``==`` between a dtype and any object answers True or False and never raises
(``clops.float32 == {"name": "x"}`` raised numpy's ValueError, which made almost every test of
the array-api-tests suite error where it looks dtypes up in its tables)."""

from __future__ import annotations

import numpy as np
import pytest

import clops

ODD = [{"name": "x"}, {"names": ["a"], "formats": ["i4"]}, [("a", "i4", 3, 4)], ("i4", -1),
       "not-a-dtype", object(), 3.5, [1, 2], Exception("x"), b"xx", "", "V"]


@pytest.mark.parametrize("other", ODD, ids=lambda o: type(o).__name__)
@pytest.mark.parametrize("name", ["bool", "int32", "float32", "complex128", "bfloat16"])
def test_comparing_with_anything_gives_a_bool(name, other):
    dt = getattr(clops, name)
    assert (dt == other) is False
    assert (dt != other) is True
    assert (other == dt) is False  # the reflected form too (numpy scalars compare back)


def test_equal_things_stay_equal():
    assert clops.float32 == np.dtype("float32") and clops.float32 == "float32"
    assert clops.float32 == np.float32 and clops.int64 == clops.int64
    assert clops.bfloat16 != np.dtype("uint16")  # stored as uint16 bits, not that dtype
    # a dict keyed by dtypes can be probed with anything
    table = {clops.float32: "f", clops.int8: "i"}
    assert [k for k in table if k == {"name": "x"}] == []
