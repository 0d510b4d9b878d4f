"""The code and the docs cite the project's own pages, and those citations resolve.

* Every citation ``docs/<page>.md`` in a .py file under gpcore/, app/, tests/, benchmarks/ or in README.md and
  docs/**/*.md names an existing file; a section after it (``§2.6``, ``§5.1–5.4``, ``§1.3, §1.5``) is a heading of
  that file (``## 2.6 ...``, or for a whole section ``# §2 ...`` or any ``## 2.x``); errata after it
  (``erratum D1``, ``errata S1–S8``, ``with S1–S3``) are listed on that page in bold (``**D1 — ...``).
* No source file under gpcore/, app/ or tests/ cites the external method reference any more (issue 20).
* Relative markdown links ``[text](path#anchor)`` in README.md and docs/ point to existing files, and an anchor to
  a heading of the target page (GitHub's slug rules).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("gpcore", "app", "tests", "benchmarks")
NO_REFERENCE_DIRS = ("gpcore", "app", "tests")
EXTERNAL_REFERENCE = "ALGORITHMS" + ".md"  # split so this file does not mention it

_SEC = r"\d+(?:\.\d+)*"
_ID = r"[A-Z]\d+"
CITATION = re.compile(
    r"(?<![\w/.-])docs/(?P<path>(?:[\w-]+/)*[\w.-]+\.md)"
    rf"(?P<sections>(?:,?[ \t]*\n?[ \t]*§[ \t]*{_SEC}(?:[ \t]*[–-][ \t]*{_SEC})?)*)"
    rf"(?P<errata>,?\s+(?:with|errat(?:um|a))\s+{_ID}(?:\s*[–-]\s*{_ID}|\s*,\s*{_ID})*)?"
)
SECTION = re.compile(rf"§[ \t]*(?P<a>{_SEC})(?:[ \t]*[–-][ \t]*(?P<b>{_SEC}))?")
ERRATUM_RANGE = re.compile(rf"(?P<a>{_ID})(?:\s*[–-]\s*(?P<b>{_ID}))?")
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<text>.+?)\s*#*\s*$", re.M)
HEADING_NUMBER = re.compile(r"^§?\s*(\d+(?:\.\d+)*)\b")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _code_files() -> list[Path]:
    files = [p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    # this file's own examples of bad citations are checked by the last test instead
    return [p for p in files if "__pycache__" not in p.parts and p != Path(__file__).resolve()]


def _md_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _lineno(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


@cache
def _headings(page: Path) -> tuple[tuple[str, ...], frozenset[str]]:
    """Section numbers of the page's headings, and its GitHub anchors."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    numbers, anchors, seen = [], set(), {}
    for m in HEADING.finditer(text):
        heading = m["text"]
        num = HEADING_NUMBER.match(heading)
        if num:
            numbers.append(num[1])
        slug = _slug(heading)
        k = seen.get(slug, 0)
        seen[slug] = k + 1
        anchors.add(slug if k == 0 else f"{slug}-{k}")
    return tuple(numbers), frozenset(anchors)


def _slug(heading: str) -> str:
    """GitHub's heading anchor: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # link text only
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _section_present(number: str, numbers: tuple[str, ...]) -> bool:
    """``§2.6`` needs a heading numbered 2.6; a whole section ``§2`` a heading numbered 2 or 2.x."""
    return any(n == number or ("." not in number and n.startswith(number + ".")) for n in numbers)


def _expand(a: str, b: str | None) -> list[str]:
    """``5.1``–``5.4`` -> 5.1, 5.2, 5.3, 5.4 (ranges over the last component, same prefix)."""
    if b is None:
        return [a]
    pa, pb = a.split("."), b.split(".")
    if len(pb) == 1 and len(pa) > 1:  # "§5.1–4"
        pb = [*pa[:-1], pb[0]]
    assert pa[:-1] == pb[:-1] and int(pa[-1]) <= int(pb[-1]), f"odd section range {a}–{b}"
    return [".".join([*pa[:-1], str(k)]) for k in range(int(pa[-1]), int(pb[-1]) + 1)]


def _erratum_ids(errata: str) -> list[str]:
    ids = []
    for m in ERRATUM_RANGE.finditer(errata):
        a, b = m["a"], m["b"]
        if b is None:
            ids.append(a)
            continue
        assert a[0] == b[0] and int(a[1:]) <= int(b[1:]), f"odd errata range {a}–{b}"
        ids += [f"{a[0]}{k}" for k in range(int(a[1:]), int(b[1:]) + 1)]
    return ids


def citation_problems(text: str, where: str) -> list[str]:
    """Every citation of a docs page in ``text`` that does not resolve, as ``where:line: reason``."""
    problems = []
    for m in CITATION.finditer(text):
        at = f"{where}:{_lineno(text, m.start())}"
        page = ROOT / "docs" / m["path"]
        if not page.is_file():
            problems.append(f"{at}: docs/{m['path']} does not exist")
            continue
        numbers, _ = _headings(page)
        for s in SECTION.finditer(m["sections"]):
            for number in _expand(s["a"], s["b"]):
                if not _section_present(number, numbers):
                    problems.append(f"{at}: docs/{m['path']} has no heading '## {number} ...'")
        if m["errata"]:
            body = page.read_text(encoding="utf-8")
            for eid in _erratum_ids(m["errata"]):
                if not re.search(rf"\*\*{eid}\b", body):
                    problems.append(f"{at}: docs/{m['path']} lists no erratum **{eid}")
    return problems


def link_problems(text: str, page: Path) -> list[str]:
    """Relative links (and images) of a markdown page whose file or anchor is missing."""
    problems = []
    body = FENCE.sub(lambda f: "\n" * f[0].count("\n"), text)
    body = re.sub(r"`[^`\n]*`", lambda c: " " * len(c[0]), body)  # inline code is not a link
    for m in [*LINK.finditer(body), *IMAGE.finditer(body)]:
        target = m["target"].strip("<>")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, ...
            continue
        at = f"{_rel(page)}:{_lineno(body, m.start())}"
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{at}: link target {target} does not exist")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in _headings(dest)[1]:
            problems.append(f"{at}: {_rel(dest)} has no heading with anchor #{anchor}")
    return problems


# ------------------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("path", [*_code_files(), *_md_files()], ids=_rel)
def test_docs_citations_resolve(path):
    assert citation_problems(path.read_text(encoding="utf-8"), _rel(path)) == []


def test_no_source_file_cites_the_external_reference():
    hits = [
        f"{_rel(p)}:{n}"
        for d in NO_REFERENCE_DIRS
        for p in sorted((ROOT / d).rglob("*"))
        if p.is_file() and p.suffix in {".py", ".md", ".toml", ".cfg", ".txt", ".html", ".js", ".css"}
        and "__pycache__" not in p.parts
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if EXTERNAL_REFERENCE in line
    ]
    assert hits == []


@pytest.mark.parametrize("page", _md_files(), ids=_rel)
def test_markdown_links_resolve(page):
    assert link_problems(page.read_text(encoding="utf-8"), page) == []


def test_the_checks_catch_bad_citations_and_links():
    """The checker itself: wrong pages, sections, ranges, errata, links and anchors are reported."""
    good = "see docs/methods/dbk.md §2.6 and docs/methods/cagp.md §5.1–5.4, docs/methods/common.md §1.3, §1.5"
    assert citation_problems(good, "x") == []
    errata = "docs/methods/softki.md §4, errata S1–S8; docs/methods/dbk.md §2.11, erratum D1"
    assert citation_problems(errata, "x") == []
    assert citation_problems("docs/methods/softki.md §4.2 with S1–S3 and docs/metrics.md §7", "x") == []
    bad = {
        "docs/methods/nosuch.md": "does not exist",
        "docs/methods/dbk.md §2.99": "no heading '## 2.99",
        "docs/methods/cagp.md §5.5–5.9": "no heading '## 5.7",
        "docs/methods/common.md §1.3, §8.1": "no heading '## 8.1",
        "docs/methods/dbk.md §2.11, erratum D99": "no erratum **D99",
        "docs/methods/cagp.md §5, errata C1–C9": "no erratum **C6",
        "docs/metrics.md\n    §7.9": "no heading '## 7.9",
    }
    for text, reason in bad.items():
        found = citation_problems(text, "x")
        assert any(reason in p for p in found), (text, found)
    page = ROOT / "docs" / "methods" / "common.md"
    assert link_problems("[a](dbk.md) [b](dbk.md#21-model) [c](https://x.org/y.md) `[d](nope.md)`", page) == []
    assert any("does not exist" in p for p in link_problems("[a](nope.md)", page))
    assert any("no heading with anchor" in p for p in link_problems("[a](dbk.md#no-such-heading)", page))
    assert any("does not exist" in p for p in link_problems("![img](../img/none.png)", page))
