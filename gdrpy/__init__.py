"""gdrpy: low-latency CPU<->GPU copies through BAR1 mappings.

    import gdrpy
    with gdrpy.open(device=0) as ctx:             # backend="auto": a real GPU backend
        buf = gdrpy.memory.alloc(4096, ctx=ctx)    # or a CuPy array / torch CUDA tensor
        with ctx.pin(buf) as pin, pin.map() as m:
            m.write(0, b"tick")                    # CPU stores into GPU memory
            m.read(0, 4)

Backends: ``nvrm`` (the NVIDIA driver's own interface, no kernel module),
``gdrdrv`` (NVIDIA's gdrdrv module), ``dmabuf``, and ``sim`` (host memory
standing in for a GPU; chosen only when asked for with ``backend="sim"`` or
``GDRPY_BACKEND=sim``, and always reported as such).
"""

from __future__ import annotations

import os as _os

from . import errors
from ._core import (
    Context,
    Mapping,
    Pin,
    backend_names,
    copy_isa,
    copy_isa_available,
    copy_isa_notes,
    nvrm_selftest,
    probe,
    set_copy_isa,
)
from ._core import version as _core_version
from ._version import __version__ as __version__
from .context import open
from .errors import *  # noqa: F403
from .streams import RawStream, unchecked_stream

__all__ = ["open", "Context", "Pin", "Mapping", "errors", "memory", "probe",
           "backend_names", "nvrm_selftest", "copy_isa", "copy_isa_available",
           "copy_isa_notes", "set_copy_isa",
           "library_version", "libdir", "includedir", "bindir", "put", "get",
           "Transfer", "Channel", "put_many", "RawStream",
           "unchecked_stream"] + list(errors.__all__)


def library_version() -> str:
    """Version of the C library (libgdrpy) inside the extension."""
    return _core_version()


def libdir() -> str:
    """Directory holding libgdrapi.so.2 / libgdrpy.so.0 (for LD_LIBRARY_PATH)."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "lib")


def includedir() -> str:
    """Directory holding gdrpy.h, gdrapi.h, gdrpy_channel.h and the CUDA device
    header gdrpy_channel.cuh."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "include")


def bindir() -> str:
    """Directory holding the C tools installed with the package (gdrpy_copylat,
    gdrapi_copylat, ...), as GDRCopy installs gdrcopy_copylat."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "bin")


from ._env import check_environment as _check_environment  # noqa: E402

_check_environment(backend_names())

from . import memory  # noqa: E402
from .channel import Channel  # noqa: E402
from .transfer import Transfer, get, put  # noqa: E402


def put_many(dst, items) -> int:
    """Vectored put into mapping ``dst`` (a Mapping or an object with a
    ``mapping``): ``items`` = [(offset, buffer), ...], every range checked
    first, one store fence at the end.  Returns the total bytes."""
    m = dst if isinstance(dst, Mapping) else getattr(dst, "mapping", None)
    if not isinstance(m, Mapping):
        from .errors import InvalidArgumentError
        raise InvalidArgumentError(f"put_many needs a Mapping, not {type(dst).__name__}", 22)
    return m.put_many(items)
