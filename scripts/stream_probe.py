"""What the CUDA driver does with a bogus stream handle (informational; issue 17).

Runs cuStreamQuery / cuStreamGetCtx / cuMemcpyHtoDAsync on 0xdeadbeef, each in its
own subprocess, and prints whether the call returned an error or killed the
process.  gdrpy never makes these calls on unproven handles (gdrpy.streams); this
records why: if any of them crashes, a driver-side validation of raw handles is not
possible.  Always exits 0."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import ctypes
from cuda.bindings import driver as cu
cu.cuInit(0)
err, dev = cu.cuDeviceGet(0)
err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
cu.cuCtxSetCurrent(ctx)
bogus = cu.CUstream(0xdeadbeef)
call = {call!r}
if call == "cuStreamQuery":
    r = cu.cuStreamQuery(bogus)
elif call == "cuStreamGetCtx":
    r = cu.cuStreamGetCtx(bogus)
else:
    err, d = cu.cuMemAlloc(64)
    buf = ctypes.create_string_buffer(64)
    r = cu.cuMemcpyHtoDAsync(d, ctypes.addressof(buf), 64, bogus)
print("returned", r[0] if isinstance(r, tuple) else r, flush=True)
"""

for call in ("cuStreamQuery", "cuStreamGetCtx", "cuMemcpyHtoDAsync"):
    p = subprocess.run([sys.executable, "-c", CHILD.format(call=call)], capture_output=True,
                       text=True, timeout=120, check=False)
    if p.returncode < 0:
        print(f"{call}(0xdeadbeef): killed by signal {-p.returncode}")
    else:
        out = (p.stdout.strip() or p.stderr.strip()[-200:])
        print(f"{call}(0xdeadbeef): exit {p.returncode}: {out}")
