"""The layers import only downwards (docs/architecture.md, "Layers"), checked on the
source, without importing anything:

* the binding (gdrpy/_core.pyx and the units it includes) imports nothing of the
  Python layer but the leaf gdrpy.errors, and cimports only gdrpy._cgdrpy;
* gdrpy.errors imports nothing of gdrpy;
* the import graph of the Python modules (every import, also those inside
  functions) has no cycle.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest
from graphs import cycles

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "gdrpy"

# `import gdrpy...`, `from gdrpy... import`, `from . import` / `from .x import`, and the
# same with cimport, at the start of a line (docstrings' prose does not start that way).
_CY_IMPORT = re.compile(
    r"^\s*(?:(?:c?import)\s+(?P<mod>gdrpy\S*)|from\s+(?P<frm>gdrpy\S*|\.\S*)\s+(?P<kw>c?import)\b)",
    re.M)


def binding_files() -> list[pathlib.Path]:
    files = sorted(PKG.glob("*.pyx")) + sorted(PKG.rglob("*.pxi"))
    assert PKG / "_core.pyx" in files
    return files


def binding_imports(path: pathlib.Path) -> list[tuple[str, str]]:
    """(kind, module) of every gdrpy import in a Cython file: kind 'import' or 'cimport'."""
    out = []
    for m in _CY_IMPORT.finditer(path.read_text()):
        if m.group("mod"):
            line = m.group(0).strip()
            out.append(("cimport" if line.startswith("cimport") else "import", m.group("mod")))
        else:
            out.append((m.group("kw"), m.group("frm")))
    return out


def test_the_binding_imports_only_gdrpy_errors():
    bad = []
    for f in binding_files():
        for kind, mod in binding_imports(f):
            if (kind, mod) not in (("import", "gdrpy.errors"), ("cimport", "gdrpy._cgdrpy")):
                bad.append(f"{f.relative_to(ROOT)}: {kind} {mod}")
    assert not bad, "the binding imports upwards:\n" + "\n".join(bad)


def test_the_binding_scan_sees_imports(tmp_path):
    # the scan itself can fail: a sample with every form it must catch
    sample = tmp_path / "sample.pxi"
    sample.write_text("import gdrpy.memory\nfrom gdrpy.transfer import x\n"
                      "    from gdrpy import numa\nfrom . import staging\n"
                      "from gdrpy._cgdrpy cimport *\n"
                      '"""prose: import gdrpy.memory is not at a line start"""\n')
    got = binding_imports(sample)
    assert got == [("import", "gdrpy.memory"), ("import", "gdrpy.transfer"),
                   ("import", "gdrpy"), ("import", "."), ("cimport", "gdrpy._cgdrpy")]


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    for p in PKG.glob("*.pyx"):          # the extension: a leaf of this graph
        mods["gdrpy." + p.stem] = p
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the gdrpy modules it imports (anywhere in the file).  Importing a
    submodule is an edge to it alone (its package is initialised first, but that is
    not a dependency of the importer's)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        if path.suffix != ".py":
            continue
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                    base += [node.module] if node.module else []
                    frm = ".".join(base)
                else:
                    frm = node.module or ""
                for a in node.names:
                    sub = f"{frm}.{a.name}"
                    targets.append(sub if sub in mods else frm)
            for t in targets:
                while t and t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != name:
                    graph[name].add(t)
    return graph


def test_the_python_modules_import_without_loops():
    graph = import_graph()
    assert {"gdrpy", "gdrpy._core", "gdrpy.transfer", "gdrpy.threshold"} <= set(graph)
    found = cycles(graph)
    lines = [f"{' <-> '.join(c)}: " + "; ".join(
        f"{a} -> {', '.join(sorted(graph[a] & set(c)))}" for a in c) for c in found]
    assert not found, "import loops:\n" + "\n".join(lines)


def test_errors_is_a_leaf():
    assert import_graph()["gdrpy.errors"] == set()


@pytest.mark.parametrize("graph, loops", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}, [["a", "b", "c"]]),
])
def test_the_cycle_finder_finds_cycles(graph, loops):
    assert cycles(graph) == loops


def test_every_binding_unit_is_included_and_a_build_dependency():
    units = sorted(p.name for p in (PKG / "_binding").glob("*.pxi"))
    included = re.findall(r'^include "_binding/(\w+\.pxi)"', (PKG / "_core.pyx").read_text(),
                          re.M)
    assert sorted(included) == units and len(set(included)) == len(included)
    setup = (ROOT / "setup.py").read_text()     # setup.py's depends name each unit
    missing = [u for u in units if f'"{u[:-4]}"' not in setup]
    assert not missing, f"setup.py's depends lack {missing}"
