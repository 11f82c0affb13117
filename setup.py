"""Build: `make -C native lib` builds libgdrpy (static + shared) and the
libgdrapi.so.2 drop-in; the Cython extension links libgdrpy.a statically; the
shared libraries and headers are shipped inside the package (gdrpy/lib,
gdrpy/include) so that `python -m gdrpy libdir` can point users at them."""

import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = os.path.join(HERE, "native")
NBUILD = os.path.join(NATIVE, "build")
SHIPPED_LIBS = ["libgdrpy.so.0", "libgdrapi.so.2"]
SHIPPED_HEADERS = ["gdrpy.h", "gdrpy_host.h", "gdrapi.h"]


class BuildWithNative(build_ext):
    def run(self):
        jobs = str(max(1, min(8, os.cpu_count() or 1)))
        subprocess.check_call(["make", "-C", NATIVE, "-j", jobs, "lib", "tools"])
        super().run()
        targets = [os.path.join(self.build_lib, "gdrpy")]
        if self.inplace or getattr(self, "editable_mode", False):
            targets.append(os.path.join(HERE, "gdrpy"))
        for pkg in targets:
            libdir = os.path.join(pkg, "lib")
            incdir = os.path.join(pkg, "include")
            os.makedirs(libdir, exist_ok=True)
            os.makedirs(incdir, exist_ok=True)
            for name in SHIPPED_LIBS:
                src = os.path.join(NBUILD, name)
                shutil.copy2(src, os.path.join(libdir, name))
                # Link names (libgdrapi.so, libgdrpy.so) as real files: wheels
                # carry no symlinks.
                shutil.copy2(src, os.path.join(libdir, name.rsplit(".", 1)[0]))
            for name in SHIPPED_HEADERS:
                shutil.copy2(os.path.join(NATIVE, "include", name), os.path.join(incdir, name))


ext = Extension(
    "gdrpy._core",
    sources=["gdrpy/_core.pyx"],
    include_dirs=["native/include", "native/src/core", "native/src/copy"],
    extra_objects=[os.path.join("native", "build", "libgdrpy.a")],
    libraries=["dl", "pthread"],
    extra_compile_args=["-O2"],
)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": BuildWithNative},
    package_data={"gdrpy": ["lib/*", "include/*.h", "*.pyx", "*.pxd", "*.pxi"]},
)
