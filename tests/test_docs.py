"""The documentation is user documentation: its links resolve, it stays small
enough to read, and it is not organised as a log of work rounds.

Checks README.md and docs/*.md: every relative link and #anchor resolves (a
file that exists, a heading that exists in it), docs/ stays within 3,500
lines with every page under 500, no heading is a "Round N" log entry, and
the README's Documentation section lists every page of docs/ once.
"""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
MAX_TOTAL_LINES = 3500
MAX_PAGE_LINES = 500

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ROUND_HEADING = re.compile(r"\bround\s+\d+", re.IGNORECASE)


def doc_pages() -> list[str]:
    return sorted(os.path.join(DOCS, n) for n in os.listdir(DOCS) if n.endswith(".md"))


def all_pages() -> list[str]:
    return [os.path.join(ROOT, "README.md"), *doc_pages()]


def outside_fences(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for no, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        m = re.match(r"(`{3,}|~{3,})", stripped)
        if m:
            if fence is None:
                fence = m.group(1)[0] * 3
            elif stripped.startswith(fence):
                fence = None
            continue
        if fence is None:
            yield no, line


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks, inline code removed."""
    for no, line in outside_fences(text):
        yield no, re.sub(r"`[^`]*`", "", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [h.group(2) for _no, line in outside_fences(text) if (h := HEADING.match(line))]


def anchors(path: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path):
        base = slug(h)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: str) -> list[tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # inline code is removed before matching, so a link written inside
    # backticks (an example, not a link) is not checked
    return [(no, m.group(1)) for no, line in prose_lines(text) for m in LINK.finditer(line)]


def broken_links(path: str) -> list[str]:
    bad = []
    here = os.path.dirname(path)
    for no, target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(here, file_part)) if file_part else path
        where = f"{os.path.relpath(path, ROOT)}:{no}: {target}"
        if not os.path.exists(dest):
            bad.append(f"{where} (no such file)")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            bad.append(f"{where} (no heading with anchor #{anchor})")
    return bad


def test_slug_matches_github():
    assert slug("Ping-pong: `python -m gdrpy bench pingpong`") == \
        "ping-pong-python--m-gdrpy-bench-pingpong"
    assert slug("GDRCopy's own tests on libgdrapi.so.2") == "gdrcopys-own-tests-on-libgdrapiso2"
    assert slug("fork()") == "fork"
    assert slug("Answers that are only a tag (`comp_size=0`)") == \
        "answers-that-are-only-a-tag-comp_size0"


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Part two\n\n[ok](b.md#the-end) "
                                   "[self](#part-two) [gone](missing.md) [bad](b.md#nowhere)\n"
                                   "```\n[in code](missing2.md)\n```\n"
                                   "`[inline](missing3.md)` ![img](pic.png)\n")
    (tmp_path / "b.md").write_text("# The end\n")
    bad = broken_links(str(tmp_path / "a.md"))
    assert len(bad) == 3, bad
    assert any("missing.md" in b for b in bad)
    assert any("#nowhere" in b for b in bad)
    assert any("pic.png" in b for b in bad)


@pytest.mark.parametrize("path", all_pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_links_resolve(path):
    assert broken_links(path) == []


def test_docs_stay_small():
    sizes = {}
    for path in doc_pages():
        with open(path, encoding="utf-8") as f:
            sizes[os.path.basename(path)] = len(f.read().splitlines())
    too_long = {n: k for n, k in sizes.items() if k >= MAX_PAGE_LINES}
    assert not too_long, f"pages of {MAX_PAGE_LINES} lines or more: {too_long}"
    total = sum(sizes.values())
    assert total <= MAX_TOTAL_LINES, f"docs/*.md total {total} lines > {MAX_TOTAL_LINES}: {sizes}"


@pytest.mark.parametrize("path", all_pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_round_log_headings(path):
    bad = [h for h in headings(path) if ROUND_HEADING.search(h)]
    assert not bad, f"headings organised by work round: {bad}"


def test_readme_lists_every_doc_page_once():
    """The README's "Documentation" section links every page of docs/, once."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Documentation\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert m, "README.md has no '## Documentation' section"
    listed = [os.path.normpath(os.path.join(ROOT, t.group(1).partition("#")[0]))
              for t in LINK.finditer(m.group(1))]
    missing = [os.path.relpath(p, ROOT) for p in doc_pages() if p not in listed]
    assert not missing, f"README.md's Documentation section does not list: {missing}"
    twice = sorted({os.path.relpath(p, ROOT) for p in listed if listed.count(p) > 1})
    assert not twice, f"listed more than once: {twice}"
