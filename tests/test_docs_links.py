"""The documents' links hold: every relative link in README.md and docs/*.md (and the
benchmark results they point into) names a file that exists, and every ``#anchor`` a heading
of the file it names, spelled as GitHub spells heading anchors. Needs no device."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "bench" / "results" / "RESULTS.md"]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced blocks and code spans, where brackets are not links."""
    return CODE.sub("", FENCE.sub("", text))


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path`` (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path.read_text(encoding="utf-8")))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: stay out


def test_anchor_spelling():
    assert anchors(ROOT / "bench" / "results" / "RESULTS.md") >= {
        "serving-soak-benchsoak_servepy", "cpu-runtimes-bench_cpu_runtimespy"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc: Path):
    broken = []
    for target in links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken)
