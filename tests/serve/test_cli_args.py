"""``clops serve``'s arguments, parsed before anything loads."""

from __future__ import annotations

import pytest

from clops.serve.cli import parser


def test_kv_cache_choice():
    assert parser().parse_args([]).kv_cache is None  # float16 on GPUs, float32 on CPUs
    assert parser().parse_args(["m.gguf", "--kv-cache", "float32"]).kv_cache == "float32"
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["--kv-cache", "int8"])
    assert info.value.code == 2
