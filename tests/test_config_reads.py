"""Every ``CLOPS_*`` environment variable is read in ``clops/_config.py`` and nowhere else in the
package, and each one it reads is documented in ``docs/environment.md``."""

from __future__ import annotations

import ast
import os
import re

import pytest

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PACKAGE = os.path.join(ROOT, "clops")


def _reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each CLOPS_* name given to os.environ / os.getenv (get, [], in, pop,
    setdefault) in ``tree``."""
    out = []
    for node in ast.walk(tree):
        names: list[ast.AST] = []
        if isinstance(node, ast.Call):
            f = node.func
            text = ast.unparse(f)
            if text in ("os.getenv", "getenv") or text.startswith(("os.environ.", "environ.")):
                names = list(node.args[:1])
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ",
                                                                             "environ"):
            names = [node.slice]
        elif isinstance(node, ast.Compare) and any(
                ast.unparse(c) in ("os.environ", "environ") for c in node.comparators):
            names = [node.left]
        for n in names:
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and \
                    n.value.startswith("CLOPS_"):
                out.append((node.lineno, n.value))
    return out


def test_only_config_reads_clops_variables():
    stray, read = [], set()
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                found = _reads(ast.parse(f.read(), path))
            rel = os.path.relpath(path, ROOT)
            if rel == os.path.join("clops", "_config.py"):
                read.update(v for _, v in found)
            else:
                stray += [f"{rel}:{line} reads {v}" for line, v in found]
    assert not stray, "read these through clops._config: " + "; ".join(stray)
    assert len(read) > 10  # (the scan finds _config's own reads)
    with open(os.path.join(ROOT, "docs", "environment.md"), encoding="utf-8") as f:
        documented = set(re.findall(r"`(CLOPS_[A-Z0-9_]+)`", f.read()))
    assert read - documented == set(), f"undocumented: {sorted(read - documented)}"


def test_the_scan_finds_each_way_of_reading():
    src = ('import os\nos.environ.get("CLOPS_A")\nos.getenv("CLOPS_B", "1")\n'
           'os.environ["CLOPS_C"]\n"CLOPS_D" in os.environ\nos.environ.get("HOME")\n')
    assert [v for _, v in _reads(ast.parse(src))] == ["CLOPS_A", "CLOPS_B", "CLOPS_C",
                                                       "CLOPS_D"]
