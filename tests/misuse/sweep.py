"""Hostile-input sweep: every case of :mod:`tests.misuse.cases` in its own
subprocess, counted as crash (killed by a signal or died without a verdict),
hang (past ``--timeout``), clear error (a GdrError, or a non-zero return of the C
ABI, where one was expected), ok (no error where none was expected), or
unexpected (an error that is not a GdrError, or a call accepted that should have
been refused).

    python -m tests.misuse.sweep [--backend sim|auto|nvrm] [--jobs N]
                                 [--timeout S] [--only SUBSTR] [--json FILE]

(from the repository root, with the gdrpy to test importable: built in place
or installed).

``--backend sim`` (the default) needs no GPU; ``auto`` (or ``nvrm``) runs the same
cases on the GPU with device memory from cuMemCreate (Python) and cuMemAlloc (C
ABI).  Exit status 0 when there are no crashes, hangs or unexpected outcomes.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time

from .cases import Case, all_cases

_PY_PRELUDE = """
import errno, gc, os, sys, threading, time
import numpy as np
import gdrpy
BACKEND = os.environ["SWEEP_BACKEND"]
SIZE = 1 << 20
ctx = gdrpy.open(0, BACKEND)
buf = gdrpy.memory.alloc(SIZE, ctx=ctx)
pin = ctx.pin(buf)
m = pin.map()
"""

_C_PRELUDE = """
import ctypes, os, sys, threading, time
import gdrpy
BACKEND = os.environ["SWEEP_BACKEND"]
MB = 1 << 20
path = os.environ.get("SWEEP_GDRAPI") or os.path.join(gdrpy.libdir(), "libgdrapi.so.2")
lib = ctypes.CDLL(path)
V, U, S = ctypes.c_void_p, ctypes.c_ulong, ctypes.c_size_t
class MH(ctypes.Structure):
    _fields_ = [("h", ctypes.c_ulong)]
lib.gdr_open.restype = V
lib.gdr_open.argtypes = []
for name, args in {
        "gdr_close": [V], "gdr_pin_buffer": [V, U, S, ctypes.c_uint64, ctypes.c_uint32, V],
        "gdr_pin_buffer_v2": [V, U, S, ctypes.c_uint32, V], "gdr_unpin_buffer": [V, MH],
        "gdr_map": [V, MH, V, S], "gdr_map_v2": [V, MH, V, S, ctypes.c_int],
        "gdr_unmap": [V, MH, V, S], "gdr_copy_to_mapping": [MH, V, V, S],
        "gdr_copy_from_mapping": [MH, V, V, S], "gdr_get_info": [V, MH, V],
        "gdr_get_info_v2": [V, MH, V], "gdr_get_attribute": [V, ctypes.c_int, V],
        "gdr_get_mapping_type_string": [ctypes.c_int, V],
        "gdr_driver_get_version": [V, V, V], "gdr_get_callback_flag": [V, MH, V]}.items():
    f = getattr(lib, name)
    f.argtypes = args
    f.restype = ctypes.c_int

def device_alloc(n):
    if BACKEND == "sim":
        p = ctypes.c_uint64()
        assert lib.gdrpy_sim_alloc(ctypes.c_size_t(n), ctypes.byref(p)) == 0
        return p.value
    cu = ctypes.CDLL("libcuda.so.1")
    global _cu_ready
    if not globals().get("_cu_ready"):
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        assert cu.cuInit(0) == 0
        assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        assert cu.cuCtxSetCurrent(ctx) == 0
        _cu_ready = True
    p = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n + 65536)) == 0
    return (p.value + 65535) & ~65535

if BACKEND == "sim":
    os.environ["GDRPY_BACKEND"] = "sim"
d = device_alloc(MB)
d2 = device_alloc(MB)
g = lib.gdr_open()
assert g, "gdr_open failed"
mh, mh2, h2, h3 = MH(), MH(), MH(), MH()
assert lib.gdr_pin_buffer(g, d, MB, 0, 0, ctypes.byref(mh)) == 0
vp = ctypes.c_void_p()
assert lib.gdr_map(g, mh, ctypes.byref(vp), MB) == 0
va = vp.value
assert lib.gdr_pin_buffer(g, d2, MB, 0, 0, ctypes.byref(mh2)) == 0
host = ctypes.create_string_buffer(MB)
big = ctypes.create_string_buffer(MB)
junk = ctypes.create_string_buffer(4096)
p2, iv, cp = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_char_p()
info = ctypes.create_string_buffer(48)
"""

_WRAP = """
_code = {code!r}
try:
    _ns = globals()
    exec(compile(_code, {name!r}, "exec"), _ns)
    if {kind!r} == "c" and _ns.get("RC", 0) != 0:
        print("SWEEP-RESULT gdrerror", "rc", _ns["RC"], flush=True)
    else:
        print("SWEEP-RESULT ok", flush=True)
except gdrpy.GdrError as e:
    print("SWEEP-RESULT gdrerror", type(e).__name__, str(e)[:300].replace("\\n", " "),
          flush=True)
except BaseException as e:
    print("SWEEP-RESULT other", type(e).__name__, str(e)[:300].replace("\\n", " "), flush=True)
"""


def _script(case: Case) -> str:
    prelude = _PY_PRELUDE if case.kind == "py" else _C_PRELUDE
    return prelude + _WRAP.format(code=case.code, name=case.name, kind=case.kind)


def run_case(case: Case, backend: str, timeout: float) -> dict:
    env = dict(os.environ)
    env.update(case.env)
    env["SWEEP_BACKEND"] = backend
    env.setdefault("PYTHONFAULTHANDLER", "1")
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", _script(case)], env=env, timeout=timeout,
                           check=False, capture_output=True, text=True)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"name": case.name, "kind": case.kind, "outcome": "hang",
                "detail": f"no verdict within {timeout:.0f} s; {out[-200:]}",
                "seconds": time.monotonic() - t0}
    dt = time.monotonic() - t0
    verdict = ""
    for line in p.stdout.splitlines():
        if line.startswith("SWEEP-RESULT "):
            verdict = line[len("SWEEP-RESULT "):]
    if p.returncode < 0 or not verdict:
        sig = -p.returncode if p.returncode < 0 else 0
        what = signal.Signals(sig).name if sig else f"exit {p.returncode} without a verdict"
        return {"name": case.name, "kind": case.kind, "outcome": "crash",
                "detail": f"{what}; {p.stderr[-400:]}", "seconds": dt}
    head = verdict.partition(" ")[0]
    if head == "gdrerror":
        outcome = "clear_error" if case.expect in ("error", "any") else "unexpected"
    elif head == "ok":
        outcome = "ok" if case.expect in ("ok", "any") else "unexpected"
    else:
        outcome = "unexpected"
    return {"name": case.name, "kind": case.kind, "outcome": outcome, "expect": case.expect,
            "detail": verdict[:300], "seconds": dt}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.misuse.sweep",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="sim", help="sim (default), auto or nvrm")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--json", default="", help="write every case's outcome here")
    a = ap.parse_args(argv)
    cases = [c for c in all_cases() if a.only in c.name]
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        results = list(ex.map(lambda c: run_case(c, a.backend, a.timeout), cases))
    el = time.monotonic() - t0
    counts: dict[str, dict[str, int]] = {}
    for r in results:
        k = counts.setdefault(r["kind"], {"cases": 0, "crash": 0, "hang": 0, "clear_error": 0,
                                          "ok": 0, "unexpected": 0})
        k["cases"] += 1
        k[r["outcome"]] += 1
        if r["outcome"] in ("crash", "hang", "unexpected"):
            print(f"  {r['outcome'].upper():10s} {r['name']}: {r['detail']}")
    for kind, label in (("py", "Python API"), ("c", "C ABI (libgdrapi.so.2)")):
        if kind in counts:
            k = counts[kind]
            print(f"misuse sweep [{a.backend}] {label}: {k['cases']} cases: crashes "
                  f"{k['crash']}, hangs {k['hang']}, clear errors {k['clear_error']}, "
                  f"ok {k['ok']}, unexpected {k['unexpected']}")
    bad = sum(k["crash"] + k["hang"] + k["unexpected"] for k in counts.values())
    print(f"misuse sweep [{a.backend}]: {len(results)} cases in {el:.0f} s, "
          f"{'PASS' if not bad else 'FAIL'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"backend": a.backend, "counts": counts, "cases": results}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
