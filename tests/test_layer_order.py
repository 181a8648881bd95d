"""The layer order of DESIGN.md for the hand kernels and the vendor bridges: ``clops/kernels``
imports only the runtime and the graph, ``clops/providers`` those and the kernels (clops' own
relayout and FFT), and ``clops/nn`` nothing above it (llm, serve, dask). Modules are parsed with
``ast``: imports inside functions and behind ``TYPE_CHECKING`` count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import clops

ROOT = Path(clops.__file__).parent
# ``_config`` (every CLOPS_* flag, read in one place) sits below every layer.
ALLOWED = {
    "kernels": {"kernels", "runtime", "graph", "_config"},
    "providers": {"providers", "kernels", "runtime", "graph", "_config"},
}
FORBIDDEN = {"nn": {"llm", "serve", "dask"}}


def clops_imports(path: Path, package: str, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, top-level clops module) of every import of clops code in ``path``, a module of
    ``clops.<package>`` (under ``root``); ``"<clops>"`` for the namespace itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    depth = len(path.relative_to(root).parts) - 1  # folders below clops/
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "clops":
                    found.append((node.lineno, parts[1] if len(parts) > 1 else "<clops>"))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "clops":
                    continue
                if len(parts) > 1:
                    found.append((node.lineno, parts[1]))
                else:
                    found += [(node.lineno, a.name) for a in node.names]
            elif node.level <= depth:  # within the same package
                found.append((node.lineno, package))
            else:  # from the top of clops
                if node.module:
                    found.append((node.lineno, node.module.split(".")[0]))
                else:
                    found += [(node.lineno, a.name) for a in node.names]
    return found


def _modules(package: str) -> list[Path]:
    mods = sorted((ROOT / package).rglob("*.py"))
    assert mods, f"no modules under clops/{package}"
    return mods


def test_detector_reads_relative_and_absolute_imports(tmp_path):
    pkg = tmp_path / "clops" / "kernels"
    pkg.mkdir(parents=True)
    src = pkg / "m.py"
    src.write_text("from . import launch\nfrom ..runtime import CLDevice\nimport clops\n"
                   "def f():\n    from ..array.tensor import Tensor\n"
                   "    from clops.nn import quant\n    from .. import _config\n")
    found = clops_imports(src, "kernels", tmp_path / "clops")
    assert found == [(1, "kernels"), (2, "runtime"), (3, "<clops>"), (5, "array"), (6, "nn"),
                     (7, "_config")]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_go_down_only(package):
    bad = [f"clops/{p.relative_to(ROOT)}:{line}: imports clops.{mod}"
           for p in _modules(package) for line, mod in clops_imports(p, package)
           if mod not in ALLOWED[package]]
    assert not bad, f"clops/{package} may import only {sorted(ALLOWED[package])}:\n" + \
        "\n".join(bad)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_nothing_above_is_imported(package):
    bad = [f"clops/{p.relative_to(ROOT)}:{line}: imports clops.{mod}"
           for p in _modules(package) for line, mod in clops_imports(p, package)
           if mod in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)
