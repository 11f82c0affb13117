"""Packaging: one version everywhere, the C tools installed beside the package, and an
sdist that carries what it needs to build and test itself."""

from __future__ import annotations

import os
import re
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


def _need_setuptools_77():
    import setuptools
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} cannot read pyproject.toml's "
                    "SPDX license: pip install 'setuptools>=77'")


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
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    for need in ("LICENSE", "native/Makefile", "native/include/gdrpy.h",
                 "native/src/core/core.c", "native/tools/gdrpy_copylat.c",
                 "tests/conftest.py", "gdrpy/_core.pyx", "gdrpy/_version.py"):
        assert need in names, f"{need} missing from the sdist"
    leaked = sorted(n for n in names if n.startswith("native/build/")
                    or n.endswith((".so", ".o")))
    assert not leaked, f"build outputs in the sdist: {leaked[:5]}"
