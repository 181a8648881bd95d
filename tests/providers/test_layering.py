"""The layering rule of DESIGN.md: pyopencl is imported only under ``clops/runtime/``. Modules are
parsed with ``ast``, so an import in a comment or a docstring does not count, and one inside a
function or behind ``TYPE_CHECKING`` does."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import clops

ROOT = Path(clops.__file__).parent
RUNTIME = ROOT / "runtime"


def _is_pyopencl(module: str) -> bool:
    return module == "pyopencl" or module.startswith("pyopencl.")


def pyopencl_imports(path: Path) -> list[tuple[int, str]]:
    """(line, statement) of every import of pyopencl (or a submodule) in ``path``:
    ``import``, ``from ... import`` and ``importlib.import_module`` / ``__import__`` calls with
    a literal name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module is not None:
                names = [node.module]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else ""
            first = node.args[0]
            if fname in ("import_module", "__import__") and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str):
                names = [first.value]
        if any(_is_pyopencl(n) for n in names):
            found.append((node.lineno, ast.unparse(node)))
    return found


def _hits(mods: list[Path]) -> list[str]:
    return [f"{p.relative_to(ROOT.parent)}:{line}: {stmt}"
            for p in mods for line, stmt in pyopencl_imports(p)]


def _modules(under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if RUNTIME not in p.parents)


def test_detector_sees_real_imports_only(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""\n>>> import pyopencl as cl\n"""\n# import pyopencl\n'
                   "import numpy\nimport pyopencl.array as cla\n"
                   "def f():\n    from pyopencl import cltypes\n"
                   "    return __import__('pyopencl')\n"
                   "x = 'import pyopencl'\n")
    hits = pyopencl_imports(src)
    assert [line for line, _ in hits] == [6, 8, 9], hits


def test_providers_do_not_import_pyopencl():
    mods = _modules(ROOT / "providers")
    assert mods, "no provider modules found"
    hits = _hits(mods)
    assert not hits, "providers must go through clops.runtime:\n" + "\n".join(hits)


@pytest.mark.parametrize("layer", sorted(p.name for p in ROOT.iterdir()
                                         if p.is_dir() and (p / "__init__.py").exists()
                                         and p != RUNTIME) + ["<top level>"])
def test_only_runtime_imports_pyopencl(layer):
    if layer == "<top level>":
        mods = sorted(ROOT.glob("*.py"))
    else:
        mods = _modules(ROOT / layer)
    hits = _hits(mods)
    assert not hits, ("only clops/runtime/ may import pyopencl (DESIGN.md); move these behind "
                      "the runtime's API:\n" + "\n".join(hits))
