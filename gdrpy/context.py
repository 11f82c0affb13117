"""Opening a device: :func:`open` -> :class:`~gdrpy.Context` (``gdrpy.open``)."""

from __future__ import annotations

import os

from ._core import Context, backend_names
from .errors import InvalidArgumentError

__all__ = ["open"]


def open(device: int = 0, backend: str | None = None) -> Context:
    """Open GPU ``device`` with ``backend`` (default: ``$GDRPY_BACKEND`` or
    ``"auto"``, which picks the first real GPU backend that works and never
    ``sim``).  Raises BackendUnavailableError naming why each backend failed."""
    if backend is None:
        backend = os.environ.get("GDRPY_BACKEND") or "auto"
        if backend not in backend_names():
            raise InvalidArgumentError(
                f"GDRPY_BACKEND={backend!r} is not one of {', '.join(backend_names())}: fix or "
                "unset it, or pass backend= explicitly")
    return Context(device, backend)
