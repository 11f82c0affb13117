"""Build: `make -C native lib tools` builds libgdrpy (static + shared), the
libgdrapi.so.2 drop-in and the C tools; the Cython extension links libgdrpy.a
statically; the shared libraries, headers and C tools are shipped inside the
package (gdrpy/lib, gdrpy/include, gdrpy/bin) so that `python -m gdrpy libdir`,
`includedir` and `bindir` can point users at them.  The wheel ships what runs:
each shared library once, under its soname, and none of the extension's sources
(the sdist has them).

The version comes from gdrpy/_version.py (pyproject.toml: dynamic version); the
build stops if native/include/gdrpy.h says otherwise."""

import os
import re
import shlex
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
# GDRCopy's link name, which NCCL and aws-ofi-nccl dlopen and `cc -lgdrapi` links: a
# stub, not a copy (wheels carry no symlinks, and a copy would be a second gdrpy core in
# a process that opens both names; UCX links the soname).  See _link_stub.
LINK_STUBS = {"libgdrapi.so": "libgdrapi.so.2"}
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
        stubs = {name: self._link_stub(name, soname) for name, soname in LINK_STUBS.items()}
        targets = [os.path.join(self.build_lib, "gdrpy")]
        if self.inplace or getattr(self, "editable_mode", False):
            targets.append(os.path.join(HERE, "gdrpy"))
        for pkg in targets:
            libdir = os.path.join(pkg, "lib")
            incdir = os.path.join(pkg, "include")
            bindir = os.path.join(pkg, "bin")
            for d in (libdir, incdir, bindir):
                # built afresh: nothing an earlier build shipped outlives its source
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
            for name in SHIPPED_LIBS:
                shutil.copy2(os.path.join(NBUILD, name), os.path.join(libdir, name))
            for name, stub in stubs.items():
                shutil.copy2(stub, os.path.join(libdir, name))
            for name in SHIPPED_HEADERS:
                shutil.copy2(os.path.join(NATIVE, "include", name), os.path.join(incdir, name))
            for name in _tools():
                built = os.path.join(NBUILD, name)
                if not os.path.isfile(built):
                    raise SystemExit(f"native/tools/{name}.c was not built by `make tools`: "
                                     f"add $(BUILD)/{name} to TOOLS in native/Makefile")
                shutil.copy2(built, os.path.join(bindir, name))

    def _link_stub(self, name, soname):
        """`name` as a filter of `soname` (ld --filter, DT_FILTER): empty functions under
        the names `soname` exports, so that programs link against it, while the dynamic
        loader loads `soname` beside it ($ORIGIN) and resolves each of those names
        there, for programs linked so and for dlopen + dlsym alike.  The same compiler
        as native/ ($CC, else cc) and its nm."""
        cc = shlex.split(os.environ.get("CC") or "cc")
        nm = subprocess.check_output(cc + ["-print-prog-name=nm"], text=True).strip()
        table = subprocess.check_output([nm, "-D", "--defined-only",
                                         os.path.join(NBUILD, soname)], text=True)
        funcs = []
        for line in table.splitlines():
            kind, sym = line.split()[-2:]
            if kind in ("T", "W", "i"):
                funcs.append(sym.split("@")[0])
            elif kind != "A" and kind.isupper():
                raise SystemExit(f"{soname} exports {sym} (nm type {kind}): the stub {name} "
                                 "stands in for functions only")
        os.makedirs(self.build_temp, exist_ok=True)
        out = os.path.join(self.build_temp, name)
        subprocess.run(cc + ["-shared", "-fPIC", "-o", out, "-x", "c", "-",
                             f"-Wl,-soname,{name}", f"-Wl,--filter={soname}",
                             "-Wl,-rpath,$ORIGIN"],
                       input="".join(f"void {f}(void) {{}}\n" for f in sorted(set(funcs))),
                       text=True, check=True)
        return out


ext = Extension(
    "gdrpy._core",
    sources=["gdrpy/_core.pyx"],
    include_dirs=["native/include", "native/src/core", "native/src/copy"],
    extra_objects=[os.path.join("native", "build", "libgdrpy.a")],
    # rebuild when a unit of the binding, its C declarations or a public header
    # changes, and relink when the C core does
    depends=[os.path.join("native", "build", "libgdrpy.a"), "gdrpy/_cgdrpy.pxd",
             *(f"gdrpy/_binding/{u}.pxi" for u in
               ("common", "library", "interop", "context", "pin", "mapping", "hostmem",
                "transfer", "dlpack", "channel")),
             *(os.path.join("native", "include", h) for h in
               ("gdrpy.h", "gdrpy_host.h", "gdrpy_channel.h"))],
    libraries=["dl", "pthread"],
    extra_compile_args=["-O2"],
)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": BuildWithNative},
    package_data={"gdrpy": ["lib/*", "include/*.h", "include/*.cuh", "bin/*", "*.pyi", "py.typed"],
                  "gdrpy.tools": ["channel_kernels.cu"]},
    # The extension's sources are in the sdist (MANIFEST.in), not in the wheel.
    exclude_package_data={"gdrpy": ["*.pyx", "*.pxd", "*.pxi", "*.c", "_binding/*.pxi"]},
)
