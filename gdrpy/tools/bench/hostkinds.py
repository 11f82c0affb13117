"""``bench bandwidth``, host-memory kinds: Transfer.put/get from and to page-locked
(gdrpy host_alloc), registered (ctx.register) and one-shot pageable memory, next to
cuda-python cuMemcpy and PyTorch copies from pinned and pageable memory, in the same
run; plus the <= 64 KiB latency table of the same run (no-regression check)."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from .common import DIRECTIONS, _fmt, _table, format_size
from .timing import Op, _Env

KIB = 1 << 10
MIB = 1 << 20

#: The issue-14 targets: (kinds, smallest size, % of the pinned cuMemcpy rate).
TARGETS = ((("pinned", "registered"), MIB, 90.0), (("pageable",), 4 * MIB, 70.0))
LATENCY_SIZES = (8, 64, 512, 4 * KIB, 64 * KIB)


class HostKinds:
    """The host buffers of every kind (each ``env.size`` bytes) and the ops
    over them; torch ops where PyTorch sees the GPU."""

    def __init__(self, ctx, env: _Env, torch_ok: bool = True):
        import gdrpy
        self.ctx, self.env = ctx, env
        self.t = env.m.transfer()             # what gdrpy.put/get use
        # the same pickers with the kind machinery switched off (never classify,
        # never stage): the pre-issue-14 path, for the same-run latency comparison
        from gdrpy.staging import NEVER, StagingPlan
        self.t_plain = gdrpy.Transfer(env.m, self.t.picker, self.t.picker,
                                      StagingPlan(staged_min={"h2d": NEVER, "d2h": NEVER},
                                                  locked_gain_min=NEVER,
                                                  threads=self.t.plan.threads))
        self.hb = gdrpy.memory.host_alloc(env.size, ctx=ctx)
        self.pinned = self.hb.numpy()
        self.reg_arr = np.zeros(env.size, np.uint8)
        self.reg = ctx.register(self.reg_arr)
        # pageable, never registered; filled so every page is present before timing, as
        # a caller's buffer would be (np.zeros maps the shared zero page until written)
        self.page = np.full(env.size, 1, np.uint8)
        self.cu = None
        self.torch: Any = None
        self.notes: list = []
        if not ctx.is_sim:
            from gdrpy.memory import cuda_driver, primary_context
            self.cu = cuda_driver()
            primary_context(ctx.device)
            self.dptr = int(env.buf.ptr)
            if torch_ok:
                try:
                    self._torch_setup()
                except Exception as e:  # reported; the rest still runs
                    self.notes.append(f"torch not compared: {type(e).__name__}: {e}")
                    self.torch = None

    def _torch_setup(self) -> None:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        torch.cuda.set_device(self.ctx.device)
        dev = torch.from_dlpack(self.env.buf)
        if dev.data_ptr() != int(self.env.buf.ptr):
            raise RuntimeError("torch.from_dlpack did not alias the buffer")
        self.torch = torch
        self.tdev = dev
        self.tpin = torch.empty(self.env.size, dtype=torch.uint8, pin_memory=True)
        self.tpin_np = self.tpin.numpy()
        self.tpage_np = np.full(self.env.size, 1, np.uint8)   # present pages, as self.page
        self.tpage = torch.from_numpy(self.tpage_np)

    def kinds_text(self) -> str:
        from gdrpy.hostmem import kind_of
        return ", ".join(f"{name}: {kind_of(a[:4096], self.ctx)}" for name, a in
                         (("host_alloc", self.pinned), ("registered", self.reg_arr),
                          ("pageable", self.page)))

    def _check(self, res):
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise RuntimeError(f"cuMemcpy failed: {err}")

    def ops(self, d: str, n: int) -> list:
        t = self.t
        out = []
        for kind, host in (("pinned", self.pinned), ("registered", self.reg_arr),
                           ("pageable", self.page)):
            hv = host[:n]
            if d == "h2d":
                out.append(Op(f"put_{kind}", f"gdrpy put from {kind}", f"put {kind}", "gdrpy",
                              d, n, t.put, (0, hv), hv, extra={"host_kind": kind}))
            else:
                out.append(Op(f"get_{kind}", f"gdrpy get into {kind}", f"get {kind}", "gdrpy",
                              d, n, t.get, (0, hv), hv, extra={"host_kind": kind}))
        if self.cu is not None:
            cu = self.cu
            for kind, host in (("pinned", self.pinned), ("pageable", self.page)):
                hp = int(host.ctypes.data)
                if d == "h2d":
                    out.append(Op(f"cumemcpy_{kind}", f"cuda-python cuMemcpyHtoD ({kind})",
                                  f"cuMemcpy {kind}", "cuda-python", d, n, cu.cuMemcpyHtoD,
                                  (self.dptr, hp, n), host[:n], self._check,
                                  extra={"host_kind": kind}))
                else:
                    out.append(Op(f"cumemcpy_{kind}", f"cuda-python cuMemcpyDtoH ({kind})",
                                  f"cuMemcpy {kind}", "cuda-python", d, n, cu.cuMemcpyDtoH,
                                  (hp, self.dptr, n), host[:n], self._check,
                                  extra={"host_kind": kind}))
        if self.torch is not None:
            dv = self.tdev[:n]
            for kind, th, hn in (("pinned", self.tpin, self.tpin_np),
                                 ("pageable", self.tpage, self.tpage_np)):
                hv = th[:n]
                if d == "h2d":
                    out.append(Op(f"torch_{kind}", f"torch t.copy_({kind})", f"torch {kind}",
                                  "torch", d, n, dv.copy_, (hv,), hn[:n],
                                  extra={"host_kind": kind}))
                else:
                    out.append(Op(f"torch_{kind}", f"torch {kind}.copy_(t)", f"torch {kind}",
                                  "torch", d, n, hv.copy_, (dv,), hn[:n],
                                  extra={"host_kind": kind}))
        return out

    def latency_ops(self, d: str, n: int) -> list:
        """Small messages as an application sends them: put of bytes / a numpy
        slice, get into a numpy slice, next to the bare mapping copy."""
        t, m = self.t, self.env.m
        hv = self.page[:n]
        if d == "h2d":
            return [Op("lat_put_bytes", "gdrpy put(bytes)", "put bytes", "gdrpy", d, n,
                       t.put, (0, hv.tobytes()), hv),
                    Op("lat_put", "gdrpy put(numpy)", "put numpy", "gdrpy", d, n,
                       t.put, (0, hv), hv),
                    Op("lat_put_plain", "gdrpy put(numpy), kinds off", "put plain", "gdrpy",
                       d, n, self.t_plain.put, (0, hv), hv),
                    Op("lat_write", "gdrpy Mapping.write(numpy)", "write", "gdrpy", d, n,
                       m.write, (0, hv), hv)]
        return [Op("lat_get", "gdrpy get(numpy out)", "get numpy", "gdrpy", d, n,
                   t.get, (0, hv), hv),
                Op("lat_get_plain", "gdrpy get(numpy out), kinds off", "get plain", "gdrpy",
                   d, n, self.t_plain.get, (0, hv), hv),
                Op("lat_read", "gdrpy Mapping.read(out)", "read", "gdrpy", d, n,
                   m.read, (0, n, hv), hv)]

    def close(self) -> None:
        self.torch = None
        self.tdev = self.tpin = self.tpage = None
        with contextlib.suppress(Exception):
            self.reg.close()
        self.pinned = None
        import gc
        gc.collect()
        with contextlib.suppress(Exception):
            self.hb.close()


def verify_bytes_op(op: Op, env: _Env) -> None:
    """lat_put_bytes carries its own bytes: check that exactly they arrived."""
    try:
        assert op.fn is not None
        op.fn(*op.args)
        op.verified = env.pin.ce_read(0, op.nbytes) == op.args[1]
    except Exception as e:  # reported with the row
        op.error = f"{type(e).__name__}: {e}"
        op.verified = False


def kinds_summary(rows: list, sizes: list, sim: bool) -> tuple[str, dict]:
    """The % of the pinned cuMemcpy rate per kind and size, and the verdicts."""
    cell = {(r["direction"], r["size"], r["key"]): r for r in rows}

    def g(d, n, key):
        r = cell.get((d, n, key))
        return r.get("gbps_median") if r and not r.get("error") else None

    out: list = []
    verdict: dict = {}
    for d in DIRECTIONS:
        op = "put" if d == "h2d" else "get"
        cols = [f"{op}_pinned", f"{op}_registered", f"{op}_pageable", "cumemcpy_pinned",
                "cumemcpy_pageable", "torch_pinned", "torch_pageable"]
        labels = [f"{op} pinned", f"{op} registered", f"{op} pageable", "cuMemcpy pinned",
                  "cuMemcpy pageable", "torch pinned", "torch pageable"]
        body = []
        for n in sizes:
            ref = g(d, n, "cumemcpy_pinned")
            line = [format_size(n)]
            for k in cols:
                v = g(d, n, k)
                pct = f" {100 * v / ref:5.1f}%" if v and ref and k != "cumemcpy_pinned" else ""
                line.append(f"{_fmt(v)}{pct}")
            body.append(line)
        out.append(f"{d}: GB/s from medians (% of cuda-python cuMemcpy from pinned memory, "
                   f"same run){' [SIM: no GPU numbers]' if sim else ''}")
        out.append(_table(["size"] + labels, body))
        out.append("")
        for kinds, lo, target in TARGETS:
            for kind in kinds:
                pcts = []
                for n in sizes:
                    ref, v = g(d, n, "cumemcpy_pinned"), g(d, n, f"{op}_{kind}")
                    if n >= lo and ref and v:
                        pcts.append((100 * v / ref, n))
                key = f"{op}_{kind}"
                if not pcts:
                    verdict[key] = {"min_pct": None, "target_pct": target, "from": lo,
                                    "ok": None}
                    out.append(f"  {op} {kind} >= {format_size(lo)}: not measured "
                               f"(no cuMemcpy reference or no size >= {format_size(lo)})")
                    continue
                worst, at = min(pcts)
                ok = worst >= target
                verdict[key] = {"min_pct": worst, "at": at, "target_pct": target, "from": lo,
                                "ok": ok}
                out.append(f"  {op} {kind} >= {format_size(lo)}: worst {worst:.1f}% of pinned "
                           f"cuMemcpy (at {format_size(at)}); target {target:.0f}%: "
                           f"{'PASS' if ok else 'FAIL'}")
        out.append("")
    return "\n".join(out).rstrip(), verdict


def latency_table(rows: list) -> str:
    cell = {(r["direction"], r["size"], r["key"]): r for r in rows}
    body = []
    for d, keys in (("h2d", ("lat_put_bytes", "lat_put", "lat_put_plain", "lat_write")),
                    ("d2h", ("lat_get", "lat_get_plain", "lat_read"))):
        for n in LATENCY_SIZES:
            line = [d, format_size(n)]
            for k in keys:
                r = cell.get((d, n, k))
                line.append(f"{_fmt(r['median_us'])} / {_fmt(r['p99_us'])}"
                            if r and not r.get("error") else "-")
            if d == "d2h":
                line.insert(2, "")
            body.append(line)
    return ("<= 64 KiB latencies, same run (median / p99 us). 'kinds off': the same pickers "
            "with host-memory classification and staging disabled (the path before issue 14)."
            "\n"
            + _table(["dir", "size", "put(bytes)", "put | get (numpy)", "kinds off",
                      "write | read"], body))
