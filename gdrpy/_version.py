"""The one version source: pyproject.toml reads it (setuptools dynamic version), setup.py
checks native/include/gdrpy.h's GDRPY_VERSION_* against it at build time, and
tests/test_packaging.py checks the built C library's version against it."""

__version__ = "0.1.0"
