"""Byte sizes, one parser and one formatter for the whole package (CLI options, the
threshold overrides, tables and reports).

Units are binary (powers of 1024), case-insensitive, with or without ``B``/``iB``:
``8``, ``8B``, ``4K``, ``4KB``, ``4KiB``, ``4 kib``, ``1M``, ``64MiB``, ``2G``.
"""

from __future__ import annotations

import re

__all__ = ["format_size", "parse_size", "parse_sizes"]

_SIZE_RE = re.compile(r"^\s*(\d+)\s*(?:([kmg])(?:i?b)?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
EXAMPLES = "e.g. 8, 4K, 64KiB, 1M"


def parse_size(text: object, *, minimum: int = 1) -> int:
    """``'4K'`` -> 4096; an int passes through. Raises ValueError naming the text
    when it is not a size or is below ``minimum``."""
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise ValueError(f"not a size: {text!r} ({EXAMPLES})")
        n = int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if n < minimum:
        raise ValueError(f"size {text!r} must be at least {minimum} byte"
                         f"{'' if minimum == 1 else 's'}")
    return n


def parse_sizes(text: str) -> list[int]:
    """``'8,64,4K,1M'`` -> sorted unique byte counts (at least one)."""
    out = {parse_size(tok) for tok in str(text).split(",") if tok.strip()}
    if not out:
        raise ValueError(f"no sizes in {text!r} ({EXAMPLES})")
    return sorted(out)


def format_size(n: int) -> str:
    """4096 -> ``'4 KiB'``, 3 << 20 -> ``'3 MiB'``, 1536 -> ``'1536 B'``: the largest
    binary unit that divides ``n`` exactly."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
