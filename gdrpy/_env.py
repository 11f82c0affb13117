"""Checks of GDRPY_* environment values at import: a value gdrpy cannot use
is reported with a warning instead of being ignored silently.  (The C
library reports GDRPY_COPY_ISA and GDRPY_BUSY_WAIT_MS itself, on stderr.)"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable


def _int_in(lo: int, hi: int) -> Callable[[str], bool]:
    def ok(v: str) -> bool:
        try:
            return lo <= int(v) <= hi
        except ValueError:
            return False
    return ok


def check_environment(backend_names: Iterable[str]) -> list[str]:
    """Warns (UserWarning) about each GDRPY_* value that cannot be used;
    returns the messages."""
    names = list(backend_names)
    rules: dict[str, tuple[Callable[[str], bool], str]] = {
        "GDRPY_BACKEND": (lambda v: v in names, "one of " + ", ".join(names)),
        "GDRPY_DEVICE": (_int_in(0, 63), "a device ordinal 0..63"),
        "GDRPY_LOG_LEVEL": (_int_in(0, 6), "a level 1 (debug) .. 4 (error)"),
    }
    out = []
    for name, (ok, want) in rules.items():
        v = os.environ.get(name)
        if v and not ok(v):
            msg = f"{name}={v!r} cannot be used: expected {want}; fix or unset it"
            warnings.warn(msg, UserWarning, stacklevel=3)
            out.append(msg)
    return out
