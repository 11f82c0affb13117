"""The C library's rooms stay sealed (docs/architecture.md): includes and
calls go down only.  src/core/ (contexts, pins, mappings, errors, the libcuda
loader) knows nothing of the layers built on it: src/staging/ (page-locked
host memory, the staging ring) and src/channel/ (the message channel,
gdrpy_writev) use the core through internal.h and cudadrv.h, never each
other, and the core tears their per-context state down through a hook.

Two graphs are checked: the `#include "..."` graph of native/src (resolved as
the compiler resolves it: the including file's folder, then the Makefile's -I
folders), and the call graph between the library's objects (who uses a
symbol another object defines, from nm)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest
from conftest import make
from graphs import cycles

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = os.path.join(os.path.dirname(HERE), "native")
SRC = os.path.join(NATIVE, "src")

# folder -> folders of native/src it must never include or call into
FORBIDDEN = {
    "core": {"staging", "channel", "gdrapi"},
    "staging": {"channel", "gdrapi"},
    "channel": {"staging", "gdrapi"},
}
SEALED = tuple(FORBIDDEN)


def _room(path: str) -> str:
    """The top folder under native/src ('core', 'staging', ...), or ''."""
    rel = os.path.relpath(path, SRC)
    return rel.split(os.sep)[0] if not rel.startswith("..") else ""


def _include_dirs() -> list[str]:
    """The -I folders of the Makefile's BASE_CFLAGS, in order."""
    with open(os.path.join(NATIVE, "Makefile")) as f:
        text = f.read().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("BASE_CFLAGS"))
    return [os.path.join(NATIVE, d) for d in re.findall(r"-I(\S+)", line)]


def _sources() -> list[str]:
    out = []
    for root, _dirs, files in os.walk(SRC):
        out += [os.path.join(root, f) for f in files if f.endswith((".c", ".h"))]
    return sorted(out)


def _include_graph() -> dict[str, set[str]]:
    dirs = _include_dirs()
    graph: dict[str, set[str]] = {}
    for path in _sources():
        edges = graph.setdefault(path, set())
        with open(path, errors="replace") as f:
            names = re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read(), re.M)
        for name in names:
            for d in [os.path.dirname(path)] + dirs:
                cand = os.path.normpath(os.path.join(d, name))
                if os.path.isfile(cand):
                    edges.add(cand)
                    break
            else:
                pytest.fail(f"{os.path.relpath(path, NATIVE)} includes {name!r}, "
                            f"which no include folder holds")
    return graph


def _short(paths) -> list[str]:
    return sorted(os.path.relpath(p, NATIVE) for p in paths)


def test_no_source_includes_a_c_file():
    bad = [(os.path.relpath(p, NATIVE), os.path.basename(q))
           for p, qs in _include_graph().items() for q in qs if q.endswith(".c")]
    assert not bad, f"a .c file is compiled once, never included: {bad}"


def test_includes_go_down_only():
    bad = []
    for path, incs in _include_graph().items():
        room = _room(path)
        bad += [(os.path.relpath(path, NATIVE), os.path.relpath(q, NATIVE))
                for q in incs if _room(q) in FORBIDDEN.get(room, ())]
    assert not bad, f"includes that go up or sideways: {bad}"


def test_include_graph_has_no_loop():
    loops = [_short(c) for c in cycles(_include_graph())]
    assert not loops, f"headers that include each other: {loops}"


@pytest.fixture(scope="module")
def call_graph() -> dict[str, set[str]]:
    """{source: sources whose global symbols its object uses}, over the
    objects of libgdrpy.a."""
    r = make("-C", NATIVE, "-j2", "lib")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # the archive's members as the Makefile lists them (stale objects of
    # files that moved away are not among them)
    r = make("-C", NATIVE, "-n", "-B", "lib")
    assert r.returncode == 0, r.stderr[-4000:]
    ar = next(ln for ln in r.stdout.splitlines() if re.match(r"\S*ar rcs ", ln))
    objs = [w for w in shlex.split(ar) if w.endswith(".o")]
    source = {o: os.path.join(NATIVE, re.sub(r"^.*?obj/(src/.*)\.o$", r"\1.c", o))
              for o in objs}
    used: dict[str, set[str]] = {}
    defined: dict[str, str] = {}
    for o in objs:
        nm = subprocess.run(["nm", "-P", os.path.join(NATIVE, o)], capture_output=True,
                            text=True, check=True).stdout
        for f in (ln.split() for ln in nm.splitlines()):
            if len(f) >= 2 and f[1] == "U":
                used.setdefault(source[o], set()).add(f[0])
            elif len(f) >= 2 and f[1].isupper():
                defined.setdefault(f[0], source[o])
    graph = {src: {defined[s] for s in used.get(src, ()) if s in defined} - {src}
             for src in source.values()}
    for room in SEALED:  # the rooms this test guards are in the library
        assert any(_room(s) == room for s in graph), (room, sorted(graph))
    return graph


def test_calls_go_down_only(call_graph):
    bad = [(os.path.relpath(s, NATIVE), os.path.relpath(d, NATIVE))
           for s, ds in call_graph.items() for d in ds if _room(d) in FORBIDDEN.get(_room(s), ())]
    assert not bad, f"calls that go up or sideways: {bad}"


def test_no_call_loop_touches_the_core_staging_or_channel(call_graph):
    loops = [_short(c) for c in cycles(call_graph)
             if any(_room(s) in SEALED for s in c)]
    assert not loops, f"files that call each other: {loops}"


def test_no_call_loop_spans_two_folders(call_graph):
    """Anywhere in the library: core, backends, copy, staging, channel and
    gdrapi call each other in one direction only (a folder's own files,
    e.g. a dispatch table and its kernels, are its own business)."""
    loops = [_short(c) for c in cycles(call_graph) if len({_room(s) for s in c}) > 1]
    assert not loops, f"folders that call each other: {loops}"


def test_one_libcuda_loader():
    """Only src/core/cudadrv.c opens libcuda (dlopen); everything else asks
    it (libgdrapi's look-up of a libcuda already loaded included)."""
    openers = []
    for path in (p for p in _sources() if p.endswith(".c")):
        with open(path, errors="replace") as f:
            text = f.read()
        if re.search(r"\bdlopen\s*\(", text) and "libcuda" in text:
            openers.append(os.path.relpath(path, NATIVE))
    assert openers == ["src/core/cudadrv.c"], openers
