"""Array layer: ``Tensor`` and the Array API functions (``clops`` re-exports them).

Its modules import each other in one direction only, each from those before it:

    _ops (the operator table) < tensor < kernel_ops < interop < elementwise < creation
    < dispatch < manipulation < statistics < indexing < linalg_core < searching
    < advanced_indexing < sorting, set_functions < data_types, arguments, numpy_protocols,
    jit < api

A module that needs a function of a later one (``Tensor``'s operators and methods above all)
calls it through the table ``_ops.OPS``, which each module fills with its functions when it is
imported. This package imports every module, so the table is full before a tensor exists;
only ``dispatch`` (and ``clops.providers`` with it) waits for the first matrix product.
"""

from __future__ import annotations

from . import (
    _ops,
    advanced_indexing,
    api,
    arguments,
    creation,
    data_types,
    elementwise,
    indexing,
    interop,
    jit,
    kernel_ops,
    linalg_core,
    manipulation,
    numpy_protocols,
    searching,
    set_functions,
    sorting,
    statistics,
    tensor,
)
