"""Native kernels in a row as one command (``runtime.nativekernel.chain_items``, ``Chain``):
which launches join, and the chained block's layout (a launch plan of chained products on a
device: tests/nn/test_native_cpu.py)."""

from __future__ import annotations

import ctypes

import numpy as np

from clops.runtime.nativekernel import Chain, NativeKernel, chain_items


class _Block(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("n", ctypes.c_int64), ("b", ctypes.c_void_p)]


class _Mem:
    def __init__(self, ptr: int) -> None:
        self.int_ptr = ptr


class _Fake(NativeKernel):
    def __init__(self, chain_fn: int | None, kind: int = 1) -> None:
        super().__init__(1, "fake", 3)
        self.chain_fn, self.chain_kind = chain_fn, kind

    def block(self):
        a, n, b = self.args
        return _Block(a=a.int_ptr, n=n, b=b.int_ptr), [("a", a), ("b", b)]


def test_native_kernels_in_a_row_sharing_a_chain_join():
    ks = [_Fake(7), _Fake(7), object(), _Fake(7), _Fake(None), _Fake(None), _Fake(7),
          _Fake(8), _Fake(8), _Fake(8)]
    out = chain_items([(k, (1,), None, "") for k in ks])
    assert [e if isinstance(e, int) else [ks.index(k) for k in e.kernels] for e in out] == \
        [[0, 1], 2, 3, 4, 5, 6, [7, 8, 9]]


def test_the_chained_block_holds_each_block_after_its_kind_and_size():
    ks = [_Fake(7, kind=1), _Fake(7, kind=2)]
    for i, k in enumerate(ks):
        k.set_args(_Mem(100 + i), 5 + i, _Mem(200 + i))
    chain = Chain(ks)
    blk, mems = chain.block()
    raw = np.frombuffer(ctypes.string_at(ctypes.addressof(blk), ctypes.sizeof(blk)), np.int64)
    size = ctypes.sizeof(_Block) // 8
    assert raw[0] == 2
    assert list(raw[1:3]) == [1, 8 * size] and list(raw[3:3 + size]) == [100, 5, 200]
    at = 3 + size
    assert list(raw[at:at + 2]) == [2, 8 * size]
    assert list(raw[at + 2:at + 2 + size]) == [101, 6, 201]
    # each memory object at the byte offset of its handle in the chained block
    assert [(off, m.int_ptr) for off, m in mems] == [(24, 100), (40, 200),
                                                    (8 * (at + 2), 101), (8 * (at + 4), 201)]
    # an argument set on one kernel makes the chain's block again
    chain._call = ("made",)
    assert not chain._stale()
    ks[1].set_arg(1, 9)
    assert chain._stale()
