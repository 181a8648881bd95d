"""Array layer, argument checks: the namespaces (``clops``, ``clops.linalg``, ``clops.fft``) wrap
each function that takes arrays so that anything else given where its signature says ``Tensor``
is refused by name, before the function body fails on a missing attribute.

The Array API leaves conversion to ``asarray`` (numpy converts lists silently; the standard's
functions take arrays), so ``clops.sum([1, 2, 3])`` is a ``TypeError`` that says so.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from .tensor import Tensor

# How signatures spell the parameters checked (annotations are strings: every module of the
# array layer has ``from __future__ import annotations``).
ONE = ("Tensor",)
SEQUENCE = ("Sequence[Tensor] | tuple[Tensor, ...]", "Sequence[Tensor]", "tuple[Tensor, ...]",
            "list[Tensor]")


def _described(value: Any) -> str:
    """``a list``, ``int``, ``numpy.ndarray``: what was given instead of an array."""
    kind = type(value)
    if isinstance(value, Tensor):
        return "a single array"
    if kind in (list, tuple):
        return f"a {kind.__name__}"
    return kind.__name__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"


def _refuse(fn: str, param: str, value: Any, item: int | None = None) -> TypeError:
    where = param if item is None else f"{param}[{item}]"
    return TypeError(f"{fn}: {where} must be an array (a clops Tensor), not "
                     f"{_described(value)}; convert it first with clops.asarray(...)")


def array_parameters(fn: Callable[..., Any]) -> list[tuple[int, str, str]]:
    """``(position, name, kind)`` of each parameter of ``fn`` that must hold arrays: kind "one"
    (an array), "sequence" (a tuple or list of arrays) or "each" (``*arrays``)."""
    out = []
    for i, p in enumerate(inspect.signature(fn).parameters.values()):
        ann = p.annotation
        if p.kind is p.VAR_POSITIONAL and ann in ONE:
            out.append((i, p.name, "each"))
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if ann in ONE:
                out.append((i, p.name, "one"))
            elif ann in SEQUENCE:
                out.append((i, p.name, "sequence"))
    return out


def check_arrays(fn: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
    """``fn`` wrapped to refuse non-arrays in the parameters its signature types ``Tensor``
    (``fn`` itself when it has none).

    >>> check_arrays(clops.array.statistics.sum)([1, 2, 3])
    Traceback (most recent call last):
    TypeError: sum: x must be an array (a clops Tensor), not a list; convert it first with ...
    """
    params = array_parameters(fn)
    if not params:
        return fn
    what = name or fn.__name__

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for i, param, kind in params:
            if kind == "each":
                for j, v in enumerate(args[i:]):
                    if not isinstance(v, Tensor):
                        raise _refuse(what, param, v, j)
                continue
            if i < len(args):
                v = args[i]
            elif param in kwargs:
                v = kwargs[param]
            else:
                continue  # missing: the call itself raises the usual TypeError
            if kind == "one":
                if not isinstance(v, Tensor):
                    raise _refuse(what, param, v)
            elif not isinstance(v, list | tuple):
                raise TypeError(f"{what}: {param} must be a tuple or list of arrays (clops "
                                f"Tensors), not {_described(v)}")
            else:
                for j, item in enumerate(v):
                    if not isinstance(item, Tensor):
                        raise _refuse(what, param, item, j)
        return fn(*args, **kwargs)

    return checked


def check_namespace(namespace: dict[str, Any], names: list[str]) -> None:
    """Wrap, in place, each function among ``names`` of a namespace's globals."""
    for n in names:
        f = namespace.get(n)
        if inspect.isfunction(f):
            namespace[n] = check_arrays(f, n)
