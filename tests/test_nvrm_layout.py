"""The nvrm backend's one list of files and its layers.

``native/src/backends/nvrm/files.mk`` lists the backend's files, one line each
with what the file serves, lower layers first.  The build takes its sources
from it; the top comment of ``nvrm.h`` and the file table of ``docs/nvrm.md``
repeat it.  These tests fail when the list, the folder, the header, the docs
or the build disagree, and when a .c file calls a function of a file listed
after it (which also rules out two files calling each other).  No GPU needed.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess

import pytest
from conftest import make

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = os.path.join(ROOT, "native")
NVRM = os.path.join(NATIVE, "src", "backends", "nvrm")
DOC = os.path.join(ROOT, "docs", "nvrm.md")


def _listed() -> list[tuple[str, str]]:
    rows = []
    with open(os.path.join(NVRM, "files.mk")) as f:
        for line in f:
            if line.startswith("nvrm_files +="):
                m = re.fullmatch(r"nvrm_files \+= (\S+)\s+# (.+)", line.rstrip("\n"))
                assert m, f"files.mk: a line without '# what it serves': {line!r}"
                rows.append((m.group(1), m.group(2)))
    assert rows, "files.mk lists no files"
    return rows


def _in_header() -> list[tuple[str, str]]:
    with open(os.path.join(NVRM, "nvrm.h")) as f:
        top = f.read().split("*/", 1)[0]
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^ \*   (\S+)\s{2,}(.+)$", top, re.M)]


def _in_docs() -> list[tuple[str, str]]:
    with open(DOC) as f:
        text = f.read()
    head = "| file | what it serves |"
    assert head in text, f"docs/nvrm.md has no table starting {head!r}"
    table = text.split(head, 1)[1].split("\n\n", 1)[0]
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^\| `([^`]+)` \| (.+?) \|$", table, re.M)]


def test_the_list_is_the_folder() -> None:
    names = [n for n, _ in _listed()]
    assert len(names) == len(set(names)), "files.mk lists a file twice"
    on_disk = sorted(n + "/" if os.path.isdir(os.path.join(NVRM, n)) else n
                     for n in os.listdir(NVRM))
    assert sorted(names) == on_disk, (
        "native/src/backends/nvrm/files.mk and the folder disagree: "
        f"not listed {sorted(set(on_disk) - set(names))}, "
        f"listed but absent {sorted(set(names) - set(on_disk))}")


def test_the_header_repeats_the_list() -> None:
    assert _in_header() == _listed(), \
        "nvrm.h's top comment must repeat files.mk (name and what it serves, same order)"


def test_the_docs_repeat_the_list() -> None:
    assert _in_docs() == _listed(), \
        "docs/nvrm.md's file table must repeat files.mk (name and what it serves, same order)"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_the_build_takes_its_sources_from_the_list() -> None:
    with open(os.path.join(NATIVE, "Makefile")) as f:
        mk = f.read()
    assert "include src/backends/nvrm/files.mk" in mk
    assert not re.search(r"^NVRM_SRCS\s*[:+]?=", mk, re.M), \
        "native/Makefile must not define NVRM_SRCS itself"
    r = make("-s", "--no-print-directory", "-C", NATIVE, "nvrm-srcs")
    assert r.returncode == 0, r.stderr
    want = [f"src/backends/nvrm/{n}" for n, _ in _listed() if n.endswith(".c")]
    assert r.stdout.split() == want


def _calls() -> dict[str, set[str]]:
    """File -> the files whose functions it calls, from the built objects."""
    srcs = [n[:-2] for n, _ in _listed() if n.endswith(".c")]
    objs = {s: os.path.join(NATIVE, "build", "obj", "src", "backends", "nvrm", s + ".o")
            for s in srcs}
    r = make("-s", "-C", NATIVE, "BUILD=build",
                        *(os.path.relpath(o, NATIVE) for o in objs.values()))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    defined: dict[str, str] = {}
    used: dict[str, set[str]] = collections.defaultdict(set)
    for s, o in objs.items():
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDBRV":
                defined[p[2]] = s
            elif len(p) == 2 and p[0] == "U":
                used[s].add(p[1])
    return {s: {defined[u] for u in used[s] if u in defined and defined[u] != s}
            for s in srcs}


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("make") is None,
                    reason="needs make and nm (binutils)")
def test_each_file_calls_only_files_listed_before_it() -> None:
    order = [n[:-2] for n, _ in _listed() if n.endswith(".c")]
    calls = _calls()
    bad = [f"{f}.c calls {g}.c, which is listed after it"
           for f in order for g in sorted(calls[f]) if order.index(g) > order.index(f)]
    assert not bad, "layers of native/src/backends/nvrm (files.mk order):\n" + "\n".join(bad)
    # the check can fail: the backend's vtable calls the routes, never the reverse
    assert {"route_a", "route_c", "route_v", "selftest"} <= calls["backend"]
