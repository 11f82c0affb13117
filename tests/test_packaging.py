"""Packaging: one version everywhere, the C tools installed beside the package, each
shared library once, a wheel without the extension's sources, and an sdist that carries
what it needs to build and test itself.  scripts/build_wheel.sh (CI's package stage)
checks the real wheel the same way."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

import gdrpy
from gdrpy.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _header_version() -> str:
    with open(os.path.join(ROOT, "native", "include", "gdrpy.h")) as f:
        h = f.read()
    return ".".join(re.search(rf"#define GDRPY_VERSION_{k}\s+(\d+)", h).group(1)
                    for k in ("MAJOR", "MINOR", "PATCH"))


def test_one_version_python_c_header_and_metadata():
    from gdrpy._version import __version__
    assert gdrpy.__version__ == __version__
    assert gdrpy.library_version() == __version__, "libgdrpy was built from another version"
    assert _header_version() == __version__, "bump native/include/gdrpy.h with _version.py"
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        pp = f.read()
    assert 'dynamic = ["version"]' in pp and "gdrpy._version.__version__" in pp
    project = re.search(r"^\[project\]\n(.*?)^\[", pp, re.M | re.S).group(1)
    assert not re.search(r"^version\s*=", project, re.M), "[project] must not repeat the version"


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert gdrpy.__version__ in out and gdrpy.library_version() in out


def test_bindir_holds_the_c_tools(capsys):
    assert main(["bindir"]) == 0
    d = capsys.readouterr().out.strip()
    assert d == gdrpy.bindir()
    tools = sorted(n[:-2] for n in os.listdir(os.path.join(ROOT, "native", "tools"))
                   if n.endswith(".c"))
    assert {"gdrpy_copylat", "gdrapi_copylat"} <= set(tools)
    for t in tools:
        p = os.path.join(d, t)
        assert os.path.isfile(p) and os.access(p, os.X_OK), f"{p} not installed"
    env = dict(os.environ, GDRPY_BACKEND="sim")
    r = subprocess.run([os.path.join(d, "gdrapi_copylat"), "--help"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert "usage" in (r.stdout + r.stderr).lower(), r    # finds libgdrapi.so.2 in ../lib


SOURCE_SUFFIXES = (".pyx", ".pxd", ".pxi", ".c")


def test_libdir_holds_each_library_once():
    d = gdrpy.libdir()
    names = set(os.listdir(d))
    assert names == {"libgdrpy.so.0", "libgdrapi.so.2", "libgdrapi.so"}, names
    # libgdrapi.so, the name NCCL dlopens, is a stub that defers to libgdrapi.so.2 (a
    # filter): not a second copy, which would be a second gdrpy core in the process
    stub, real = (os.path.join(d, n) for n in ("libgdrapi.so", "libgdrapi.so.2"))
    assert os.path.getsize(stub) < os.path.getsize(real) // 10
    via_stub, via_soname = ctypes.CDLL(stub), ctypes.CDLL(real)
    for fn in ("gdr_open", "gdr_copy_to_mapping", "gdr_runtime_get_version"):
        assert (ctypes.cast(getattr(via_stub, fn), ctypes.c_void_p).value
                == ctypes.cast(getattr(via_soname, fn), ctypes.c_void_p).value), fn
    major, minor = ctypes.c_int(), ctypes.c_int()
    via_stub.gdr_runtime_get_version(ctypes.byref(major), ctypes.byref(minor))
    assert (major.value, minor.value) == (2, 6)


def test_cc_lgdrapi_links_against_libdir(tmp_path):
    """`cc -lgdrapi` against the installed directory, as against GDRCopy's: the program
    runs on libgdrapi.so.2."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.skip("no C compiler")
    src = tmp_path / "prog.c"
    src.write_text("#include <stdio.h>\n#include <gdrapi.h>\n"
                   "int main(void) { int a = -1, b = -1;\n"
                   "  gdr_runtime_get_version(&a, &b); printf(\"%d.%d\\n\", a, b); }\n")
    prog = tmp_path / "prog"
    subprocess.run([cc, str(src), f"-I{gdrpy.includedir()}", f"-L{gdrpy.libdir()}",
                    "-lgdrapi", f"-Wl,-rpath,{gdrpy.libdir()}", "-o", str(prog)],
                   check=True, timeout=120)
    r = subprocess.run([str(prog)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, GDRPY_BACKEND="sim"))
    assert (r.returncode, r.stdout) == (0, "2.6\n"), r


def _need_setuptools_77():
    import setuptools
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} cannot read pyproject.toml's "
                    "SPDX license: pip install 'setuptools>=77'")


def test_wheel_carries_no_sources(tmp_path):
    """The pure part of the wheel (build_py: modules and package data) has the type stub
    and the kernels compiled at run time, none of the extension's sources."""
    _need_setuptools_77()
    lib = tmp_path / "lib"
    r = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base",
                        str(tmp_path), "build_py", "--build-lib", str(lib)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    names = {p.relative_to(lib).as_posix() for p in lib.rglob("*") if p.is_file()}
    for need in ("gdrpy/__init__.py", "gdrpy/_core.pyi", "gdrpy/py.typed",
                 "gdrpy/tools/channel_kernels.cu"):
        assert need in names, f"{need} missing from the wheel"
    sources = sorted(n for n in names if n.endswith(SOURCE_SUFFIXES))
    assert not sources, f"the extension's sources in the wheel: {sources}"


def test_sdist_carries_native_tests_and_license(tmp_path):
    pytest.importorskip("build")
    _need_setuptools_77()
    # --no-isolation --skip-dependency-check: an sdist needs only setuptools (no Cython, no
    # compiler, no network)
    r = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation",
                        "--skip-dependency-check",
                        "--outdir", str(tmp_path), ROOT], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sdist,) = tmp_path.glob("gdrpy-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile() and "/" in m.name}
    for need in ("LICENSE", "native/Makefile", "native/include/gdrpy.h",
                 "native/src/core/core.c", "native/tools/gdrpy_copylat.c",
                 "tests/conftest.py", "gdrpy/_core.pyx", "gdrpy/_version.py"):
        assert need in names, f"{need} missing from the sdist"
    leaked = sorted(n for n in names if n.startswith(("native/build/", "gdrpy/lib/"))
                    or n.endswith((".so", ".o", ".pyc")) or n == "gdrpy/_core.c")
    assert not leaked, f"build outputs in the sdist: {leaked[:5]}"
    # In a git checkout (one the suite has built and run in): every file is one that git
    # does not ignore, or the sdist's own metadata.
    r = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout:
        ours = set(r.stdout.split("\0")) | {"PKG-INFO", "setup.cfg"}
        ignored = sorted(n for n in names - ours if not n.startswith("gdrpy.egg-info/"))
        assert not ignored, f"files git ignores in the sdist: {ignored[:5]}"
