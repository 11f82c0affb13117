"""Exceptions raised by gdrpy.

Every error from the C core arrives as a :class:`GdrError` subclass carrying
``.code`` (the errno-style status from libgdrpy, e.g. ``errno.EINVAL``) and a
message naming what was attempted and why it failed (NV status / CUresult
names included when a driver call failed).  Exceptions pickle and unpickle
with their code and message intact.
"""

from __future__ import annotations

import errno as _errno

# The Linux kernel's ENOTSUPP (not in errno's table): GDRCopy's code for a pin
# flag the platform cannot honour (FORCE_PCIE, Context.pin flags=1, on a GPU
# without a coherent CPU-GPU link).
ENOTSUPP = 524

__all__ = [
    "AlreadyMappedError",
    "ArgumentTypeError",
    "BackendUnavailableError",
    "BusyError",
    "ClosedError",
    "DeviceNotFoundError",
    "DriverError",
    "GdrError",
    "InvalidArgumentError",
    "NotSupportedError",
    "OutOfRangeError",
    "WrongProcessError",
    "error_for_code",
]


class GdrError(Exception):
    """Base class: ``.code`` is the errno-style status, ``.message`` the text."""

    def __init__(self, message: str = "", code: int = _errno.EIO):
        super().__init__(message)
        self.message = message
        self.code = code

    @property
    def code_name(self) -> str:
        if self.code == ENOTSUPP:
            return "ENOTSUPP"
        return _errno.errorcode.get(self.code, f"E{self.code}")

    def __reduce__(self):
        return (self.__class__, (self.message, self.code))

    def __str__(self) -> str:
        return f"[{self.code_name}] {self.message}"


class InvalidArgumentError(GdrError, ValueError):
    """A bad argument value (EINVAL); also a ValueError."""

    def __init__(self, message: str = "", code: int = _errno.EINVAL):
        super().__init__(message, code)


class ArgumentTypeError(GdrError, TypeError):
    """An argument of the wrong type (EINVAL), e.g. a stream that is not a
    stream object; also a TypeError, so both ``except`` styles work."""

    def __init__(self, message: str = "", code: int = _errno.EINVAL):
        super().__init__(message, code)


class OutOfRangeError(GdrError, IndexError, ValueError):
    """An offset/size outside the pinned range (ERANGE); nothing was touched.
    Also an IndexError and (for code written before 0.2) a ValueError."""


class ClosedError(GdrError):
    """Use of a closed, unpinned or unmapped object (EBADF)."""


class AlreadyMappedError(GdrError):
    """The pin already has a mapping (EAGAIN): one mapping per pin."""


class BusyError(GdrError):
    """The object is in use: still mapped, copies in flight, buffers exported (EBUSY)."""


class WrongProcessError(GdrError):
    """The object belongs to another process, e.g. the parent after fork (EACCES)."""


class BackendUnavailableError(GdrError):
    """The requested backend cannot run on this host (ENXIO / ENOENT)."""


class DeviceNotFoundError(GdrError):
    """No such GPU, or the memory belongs to another GPU (ENODEV)."""


class NotSupportedError(GdrError):
    """Memory kind or driver not supported (ENOTSUP); also pin flag
    FORCE_PCIE on a GPU without a coherent CPU-GPU link (ENOTSUPP, 524, the
    code GDRCopy returns)."""


class DriverError(GdrError):
    """A driver call failed (EIO); the message names the NV status or CUresult."""


_BY_CODE = {
    _errno.EINVAL: InvalidArgumentError,
    _errno.ERANGE: OutOfRangeError,
    _errno.EBADF: ClosedError,
    _errno.EAGAIN: AlreadyMappedError,
    _errno.EBUSY: BusyError,
    _errno.EACCES: WrongProcessError,
    _errno.ENXIO: BackendUnavailableError,
    _errno.ENOENT: BackendUnavailableError,
    _errno.ENODEV: DeviceNotFoundError,
    _errno.ENOTSUP: NotSupportedError,
    ENOTSUPP: NotSupportedError,
    _errno.EIO: DriverError,
}


def error_for_code(code: int, message: str) -> GdrError:
    """The exception for a libgdrpy status code."""
    if code == _errno.ENOMEM:
        return GdrError(message, code)
    return _BY_CODE.get(code, GdrError)(message, code)


# ---- channel (gdrpy.Channel) -------------------------------------------------

class ChannelFullError(GdrError):
    """The channel's ring is full and the call was told not to wait (EAGAIN)."""


class ChannelTimeoutError(GdrError, TimeoutError):
    """A channel wait ran out of time (ETIMEDOUT)."""


class ChannelClosedError(GdrError):
    """The channel is shut down, or its kernel stopped (EPIPE)."""


__all__ += ["ChannelFullError", "ChannelTimeoutError", "ChannelClosedError"]
