"""The import arrows of clops run one way: every import a module of the package makes (at the
top, inside a function, under TYPE_CHECKING) is checked against the layer table of
docs/ARCHITECTURE.md. Needs no device."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clops"
TABLE = ROOT / "docs" / "ARCHITECTURE.md"


def read_layers(text: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(module prefix -> layer, layer -> the layers it may import) from the table between
    ``<!-- layers:begin -->`` and ``<!-- layers:end -->``."""
    block = text.split("<!-- layers:begin -->", 1)[1].split("<!-- layers:end -->", 1)[0]
    owner: dict[str, str] = {}
    allowed: dict[str, set[str]] = {}
    for line in block.strip().splitlines()[2:]:  # past the header and its rule
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        layer, modules, _, may = cells
        for name in re.findall(r"`([\w.]+)`", modules):
            owner[name] = layer
        allowed[layer] = {m.strip() for m in may.split(",") if m.strip()}
    for layer, deps in allowed.items():
        unknown = deps - set(allowed)
        assert not unknown, f"layer {layer} may import {unknown}, which the table does not have"
    return owner, allowed


def layer_of(module: str, owner: dict[str, str]) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        got = owner.get(".".join(parts[:n]))
        if got is not None:
            return got
    raise AssertionError(f"{module} belongs to no layer of docs/ARCHITECTURE.md: add it there")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(module: str, source: str, is_package: bool) -> list[tuple[str, int]]:
    """The clops modules ``source`` imports, with their line numbers."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "clops"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "clops":
                continue
            # `from clops import llm` imports the module clops.llm; a name that is no module
            # is taken from the package (or module) ``target`` itself
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.append((sub if _is_module(sub) else target, node.lineno))
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def violations(owner: dict[str, str], allowed: dict[str, set[str]],
               sources: dict[str, tuple[str, bool]]) -> list[str]:
    bad = []
    for module, (source, is_package) in sorted(sources.items()):
        mine = layer_of(module, owner)
        for target, line in imports_of(module, source, is_package):
            theirs = layer_of(target, owner)
            if theirs != mine and theirs not in allowed[mine]:
                bad.append(f"{module}:{line} imports {target}: layer {mine} may not import "
                           f"{theirs} (may: {', '.join(sorted(allowed[mine])) or 'nothing'})")
    return bad


def package_sources() -> dict[str, tuple[str, bool]]:
    return {module_name(p): (p.read_text(), p.name == "__init__.py")
            for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_import_follows_the_layer_table() -> None:
    owner, allowed = read_layers(TABLE.read_text())
    bad = violations(owner, allowed, package_sources())
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_every_layer_of_the_table_has_modules() -> None:
    owner, allowed = read_layers(TABLE.read_text())
    sources = package_sources()
    used = {layer_of(m, owner) for m in sources}
    assert used == set(allowed), f"layers with no module: {set(allowed) - used}"


@pytest.mark.parametrize("module,source,mine,theirs", [
    ("clops.runtime.pool", "from ..array.tensor import Tensor\n", "runtime", "array"),
    ("clops.kernels.norm", "def f():\n    from clops.nn import functional\n", "kernels", "nn"),
    ("clops.graph.ir", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from ..compiler import render\n", "graph", "compiler"),
    ("clops.providers.dispatch", "import clops\n", "providers", "array"),
])
def test_an_import_against_the_order_is_caught(module: str, source: str, mine: str,
                                               theirs: str) -> None:
    owner, allowed = read_layers(TABLE.read_text())
    bad = violations(owner, allowed, {module: (source, False)})
    assert bad and all(f"layer {mine} may not import {theirs} " in b for b in bad), bad


def test_an_import_down_the_order_passes() -> None:
    owner, allowed = read_layers(TABLE.read_text())
    src = "from ..runtime import device\nfrom ..graph.dtypes import DType\nfrom . import lower\n"
    assert violations(owner, allowed, {"clops.compiler.render": (src, False)}) == []


def import_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the import graph ``edges`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


# Packages whose modules import each other one way only (no module imports one that imports
# it back, not even from inside a function): every package of more than one module.
ACYCLIC = ("clops.runtime", "clops.array", "clops.graph", "clops.compiler", "clops.kernels",
           "clops.providers", "clops.nn", "clops.llm", "clops.serve", "clops.dask", "clops.cli",
           "clops.tests")


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_circle_inside(package: str) -> None:
    sources = {m: v for m, v in package_sources().items()
               if m == package or m.startswith(package + ".")}
    edges = {m: {t for t, _ in imports_of(m, src, pkg) if t in sources and t != m}
             for m, (src, pkg) in sources.items()}
    assert import_cycle(edges) is None, f"import circle: {' -> '.join(import_cycle(edges) or [])}"


def test_a_circle_is_found() -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
