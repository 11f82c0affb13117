"""Build: `make -C native lib tools` builds libgdrpy (static + shared), the
libgdrapi.so.2 drop-in and the C tools; the Cython extension links libgdrpy.a
statically; the shared libraries, headers and C tools are shipped inside the
package (gdrpy/lib, gdrpy/include, gdrpy/bin) so that `python -m gdrpy libdir`,
`includedir` and `bindir` can point users at them.

The version comes from gdrpy/_version.py (pyproject.toml: dynamic version); the
build stops if native/include/gdrpy.h says otherwise."""

import os
import re
import shutil
import subprocess

import setuptools
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

if int(setuptools.__version__.split(".")[0]) < 77:
    # pyproject.toml's license is an SPDX expression (PEP 639), which older ones reject
    raise SystemExit(f"gdrpy builds with setuptools >= 77 (this is {setuptools.__version__}): "
                     "pip install 'setuptools>=77', or build with build isolation")

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = os.path.join(HERE, "native")
NBUILD = os.path.join(NATIVE, "build")
SHIPPED_LIBS = ["libgdrpy.so.0", "libgdrapi.so.2"]
SHIPPED_HEADERS = ["gdrpy.h", "gdrpy_host.h", "gdrapi.h", "gdrpy_channel.h", "gdrpy_channel.cuh"]


def _check_versions():
    """gdrpy/_version.py and gdrpy.h's GDRPY_VERSION_* must agree."""
    with open(os.path.join(HERE, "gdrpy", "_version.py")) as f:
        py = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
    with open(os.path.join(NATIVE, "include", "gdrpy.h")) as f:
        h = f.read()
    c = ".".join(re.search(rf"#define GDRPY_VERSION_{k}\s+(\d+)", h).group(1)
                 for k in ("MAJOR", "MINOR", "PATCH"))
    if py != c:
        raise SystemExit(f"version mismatch: gdrpy/_version.py says {py}, "
                         f"native/include/gdrpy.h says {c}; change both")


def _tools():
    """The C tools: one per native/tools/*.c, built by `make tools`."""
    return sorted(os.path.splitext(n)[0] for n in os.listdir(os.path.join(NATIVE, "tools"))
                  if n.endswith(".c"))


class BuildWithNative(build_ext):
    def run(self):
        _check_versions()
        jobs = str(max(1, min(8, os.cpu_count() or 1)))
        subprocess.check_call(["make", "-C", NATIVE, "-j", jobs, "lib", "tools"])
        super().run()
        targets = [os.path.join(self.build_lib, "gdrpy")]
        if self.inplace or getattr(self, "editable_mode", False):
            targets.append(os.path.join(HERE, "gdrpy"))
        for pkg in targets:
            libdir = os.path.join(pkg, "lib")
            incdir = os.path.join(pkg, "include")
            bindir = os.path.join(pkg, "bin")
            for d in (libdir, incdir, bindir):
                os.makedirs(d, exist_ok=True)
            for name in SHIPPED_LIBS:
                src = os.path.join(NBUILD, name)
                shutil.copy2(src, os.path.join(libdir, name))
                # Link names (libgdrapi.so, libgdrpy.so) as real files: wheels
                # carry no symlinks.
                shutil.copy2(src, os.path.join(libdir, name.rsplit(".", 1)[0]))
            for name in SHIPPED_HEADERS:
                shutil.copy2(os.path.join(NATIVE, "include", name), os.path.join(incdir, name))
            for name in _tools():
                built = os.path.join(NBUILD, name)
                if not os.path.isfile(built):
                    raise SystemExit(f"native/tools/{name}.c was not built by `make tools`: "
                                     f"add $(BUILD)/{name} to TOOLS in native/Makefile")
                shutil.copy2(built, os.path.join(bindir, name))


ext = Extension(
    "gdrpy._core",
    sources=["gdrpy/_core.pyx"],
    include_dirs=["native/include", "native/src/core", "native/src/copy"],
    extra_objects=[os.path.join("native", "build", "libgdrpy.a")],
    # relink when the C core changes, not only when _core.pyx does
    depends=[os.path.join("native", "build", "libgdrpy.a"), "gdrpy/_cgdrpy.pxd",
             "gdrpy/_channel.pxi", "native/include/gdrpy_channel.h"],
    libraries=["dl", "pthread"],
    extra_compile_args=["-O2"],
)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": BuildWithNative},
    package_data={"gdrpy": ["lib/*", "include/*.h", "include/*.cuh", "bin/*", "*.pyx", "*.pxd",
                            "*.pxi", "*.pyi", "py.typed"],
                  "gdrpy.tools": ["*.cu", "*.cuh"]},
)
