"""Array layer, the operator table: the lowest module of ``clops.array``. ``Tensor``'s methods
and operators, and any module that needs a function of a module above it, call through
``OPS``; each operator module enters its functions when it is imported (``clops.array``'s
``__init__`` imports them all, lowest first), so modules import each other in one direction
only.

>>> from clops.array._ops import OPS
>>> OPS.asarray is clops.asarray  # entered by creation, with @register
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])


class OperatorTable:
    """Functions by name, as attributes: ``OPS.asarray(x)`` costs one instance-dict lookup."""

    def __getattr__(self, name: str) -> Any:
        # reached only for a name no module entered
        raise AttributeError(f"clops.array has no operator {name!r} in its table: the module "
                             "that defines it was not imported (import clops)")


OPS = OperatorTable()


@overload
def register(fn: F, /) -> F: ...


@overload
def register(*, name: str) -> Callable[[F], F]: ...


def register(fn: F | None = None, /, *, name: str | None = None) -> Any:
    """Enter ``fn`` in ``OPS`` under ``name`` (its own name by default) and return it
    unchanged; as ``@register`` or ``@register(name="...")``. A name that another module
    entered already is an error (the two would shadow each other's operator)."""

    def enter(f: F) -> F:
        key = name or f.__name__
        old = vars(OPS).get(key)
        if old is not None and old.__module__ != f.__module__:
            raise ValueError(f"operator {key!r} of {f.__module__} is already in the table, "
                             f"from {old.__module__}")
        setattr(OPS, key, f)
        return f

    return enter if fn is None else enter(fn)
