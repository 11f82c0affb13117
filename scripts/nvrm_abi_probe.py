"""Evaluates integer constant expressions (sizeof, offsetof, #defines) with a C
compiler, without running anything: the expressions become the initialisers of
one array, the compiler writes assembly (``-S``), and the array's data
directives are read back.  Works for cross compilers too (``--cc
aarch64-linux-gnu-gcc`` or ``--cc "clang --target=aarch64-linux-gnu"``).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile

_SYM = "gdrpy_abi_probe_vals"
_SIZES = {".quad": 8, ".xword": 8, ".8byte": 8, ".dword": 8}


def _parse_asm(asm: str, count: int) -> list[int]:
    vals: list[int] = []
    lines = asm.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == f"{_SYM}:")
    except StopIteration:
        raise RuntimeError(f"probe: symbol {_SYM} not found in the assembly") from None
    for ln in lines[start + 1:]:
        if len(vals) >= count:
            break
        parts = ln.split(None, 1)
        if not parts:
            continue
        d = parts[0]
        if d in _SIZES:
            vals.append(int(parts[1].split("#")[0].split("//")[0].strip(), 0) % (1 << 64))
        elif d in (".zero", ".space", ".skip"):
            n = int(parts[1].split(",")[0].strip(), 0)
            if n % 8:
                raise RuntimeError(f"probe: unexpected {d} {n}")
            vals.extend([0] * (n // 8))
        elif d.endswith(":") or d.startswith((".size", ".text")):
            break
    if len(vals) != count:
        raise RuntimeError(f"probe: read {len(vals)} values, expected {count}")
    return vals


def evaluate(prelude: str, exprs: list[str], cc: str = "cc",
             cflags: list[str] | None = None) -> list[int]:
    """Values of ``exprs`` (integer constant expressions) after ``prelude``."""
    body = ",\n".join(f"    (unsigned long long)({e})" for e in exprs)
    src = (f"{prelude}\n#include <stddef.h>\n"
           f"const unsigned long long {_SYM}[{len(exprs)}] = {{\n{body}\n}};\n")
    with tempfile.TemporaryDirectory(prefix="gdrpy-abi-") as tmp:
        path = os.path.join(tmp, "probe.c")
        with open(path, "w") as f:
            f.write(src)
        cmd = [*shlex.split(cc), "-S", "-O0", "-w", "-fno-asynchronous-unwind-tables",
               *(cflags or []), "-o", "-", path]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"probe: {' '.join(cmd)} failed:\n{r.stderr[-4000:]}")
    return _parse_asm(r.stdout, len(exprs))


def target_of(cc: str = "cc", cflags: list[str] | None = None) -> str:
    """The compiler's target triple (e.g. x86_64-linux-gnu)."""
    r = subprocess.run([*shlex.split(cc), *(cflags or []), "-dumpmachine"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def arch_of(triple: str) -> str:
    m = re.match(r"([a-z0-9_]+)", triple)
    return m.group(1) if m else triple
