"""CPU -> GPU -> CPU round trips through a gdrpy.Channel and a persistent kernel.

``python -m gdrpy bench pingpong`` (or ``python -m gdrpy.tools.pingpong``).

One run measures, on the same GPU and the same thread placement:

* **python**: ``Channel.send(payload)`` (payload stores, sfence, sequence
  word: one call) then ``Channel.recv_into(buf)`` - the answer
  ``{seq, checksum, len}`` that the persistent kernel ``gdrpy_pp_serve``
  (tools/channel_kernels.cu, NVRTC) writes into page-locked host memory.
* **c**: the same through the C API, by the tool ``gdrpy_chanpp`` (built
  with the package; it loads the same NVRTC-compiled cubin through the
  driver API).
* **cuMemcpy**: per message ``cuMemcpyHtoDAsync`` + ``cuLaunchKernel`` of a
  one-shot kernel computing the same checksum + ``cuMemcpyDtoHAsync`` +
  ``cuStreamSynchronize`` on one stream (cuda-python).
* **batch**: ``send_many`` of 32 ticks + ``recv_many(32)`` against one tick
  (send + recv), in Python and in C.

Every answer is checked (sequence number and checksum).  The summary at the
end prints the headline numbers: the Python and C 4 B round trip (median,
p99) and the batch/tick ratio.  ``--near-gpu`` (default on a GPU) pins the
measuring thread (and the C tool) to a CPU on the GPU's NUMA node.

On the ``sim`` backend a CPU thread inside libgdrpy stands in for the kernel
and every table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .._sizes import format_size, parse_size
from .._sizes import parse_sizes as _parse_sizes
from .chancheck import checksum, checksums
from .pingpong_c import c_results, c_roundtrips
from .pingpong_report import (
    SIM_LABEL,
    format_report,
    plot,
    stats_header,
    stats_row,
    summary,
)
from .stats import summarize as _summarize

__all__ = [
    "SIM_LABEL",
    "Server",
    "add_arguments",
    "fmt_size",
    "kernel_source",
    "main",
    "parse_size",
    "parse_sizes",
    "run",
    "stats_header",
    "stats_row",
    "summarize",
]

ANSWER = np.dtype([("seq", "<u8"), ("csum", "<u4"), ("len", "<u4")])
# The server's answer to a message, by the channel's completion size (see
# channel_kernels.cu): "tag" (comp_size 0) - the checksum as the
# completion's tag, a 16-byte completion; "line" (16) - {seq, checksum, len}.
ANSWER_COMP_SIZE = {"tag": 0, "line": 16}

MAX_SIZE = 1 << 20
DEFAULT_SIZES = "4,64,1K,4K"
DEFAULT_ITERS = 10000
QUICK_ITERS = 1000
BATCH = 32
TICK_SIZE = 32


# ---------------------------------------------------------------------------
# Sizes and statistics (gdrpy._sizes, gdrpy.tools.stats: one rule everywhere)

fmt_size = format_size


def parse_sizes(text) -> list[int]:
    """``--sizes`` for argparse: gdrpy._sizes.parse_sizes, errors as usage errors."""
    try:
        return _parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parse_size_arg(text) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def summarize(samples_ns) -> dict:
    """Statistics in microseconds: median, p90, p99, p99.9 (nearest rank:
    gdrpy.tools.stats), max, min, mean and the sample count n."""
    return _summarize(samples_ns, scale=1e3)


# ---------------------------------------------------------------------------
# The kernels and the server (a channel + its consumer)

def kernel_source() -> str:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "channel_kernels.cu")) as f:
        return f.read()


class Server:
    """A Channel answered by ``gdrpy_pp_serve`` (GPU) or libgdrpy's CPU
    consumer thread (sim).  ``close()`` shuts the consumer down (drain) and
    frees the channel; a kernel that does not stop keeps its memory."""

    def __init__(self, ctx, max_size: int, nslots: int = 256, idle_timeout_s: float = 30.0,
                 rt=None, module=None, plain: bool = False, near: bool = True,
                 answer: str = "tag"):
        import gdrpy
        self.ctx = ctx
        self.sim = ctx.is_sim
        self.rt = rt
        self.stream = None
        self.handle = None
        self.ch: gdrpy.Channel | None = gdrpy.Channel(ctx, nslots=nslots, slot_size=max_size,
                                                     comp_size=ANSWER_COMP_SIZE[answer],
                                                     plain=plain, near=near)
        try:
            if self.sim:
                self.handle = self.ch._sim_consumer(check=False, complete=True,
                                                    idle_timeout=idle_timeout_s)
            else:
                from .cuda_rt import KernelParams, launch
                self.stream = rt.stream()
                self.params = KernelParams(("bytes", self.ch.desc),
                                           ("u64", int(idle_timeout_s * 1e9)))
                launch(rt, module.function("gdrpy_pp_serve"), (1,), (32,), self.params,
                       self.stream, what="cuLaunchKernel(gdrpy_pp_serve)")
            self.ch.wait_attached(timeout=20.0)
            self.sm = -1 if self.sim else self.ch.kernel_sm
        except BaseException:
            self.close()
            raise

    def close(self, timeout_s: float = 10.0) -> None:
        if self.ch is None:
            return
        ch, self.ch = self.ch, None
        try:
            ch.close(timeout=timeout_s)
        finally:
            if self.handle is not None:
                ch._sim_join(self.handle)
            if self.stream is not None:
                from .cuda_rt import wait_stream
                if wait_stream(self.stream, timeout_s):
                    self.stream.close()


def answer_ok(ch, n: int, tag: int, ans, seq: int, want: int) -> bool:
    """Whether the completion received (``n`` payload bytes in ``ans``, its
    ``tag``) answers message ``seq`` (1-based) with checksum ``want``."""
    if ch.comp_size == 0:
        return n == 0 and tag == want
    a = np.frombuffer(ans, dtype=ANSWER, count=1)
    return n == 16 and int(a["seq"][0]) == seq and int(a["csum"][0]) == want


def py_roundtrips(ch, size: int, iters: int, warmup: int, rng) -> np.ndarray:
    """Python send + recv_into per message; ns per round trip."""
    variants = min(iters + warmup, 256)
    rows = rng.integers(0, 256, size=(variants, size), dtype=np.uint8)
    expect = [int(c) for c in checksums(rows)]
    pls = [r.tobytes() for r in rows]
    ans = bytearray(16)
    out = np.empty(iters, dtype=np.int64)
    pc = time.perf_counter_ns
    send, recv_into = ch.send, ch.recv_into
    seq0 = ch.stats()["received"]
    for i in range(warmup + iters):
        v = i % variants
        t0 = pc()
        send(pls[v])
        n = recv_into(ans)
        t1 = pc()
        if not answer_ok(ch, n, ch.last_tag, ans, seq0 + i + 1, expect[v]):
            raise RuntimeError(f"wrong answer to message {seq0 + i + 1} ({size} B): {n} bytes "
                               f"{bytes(ans[:n]).hex()}, tag {ch.last_tag:#x} (expected "
                               f"checksum {expect[v]:#x})")
        if i >= warmup:
            out[i - warmup] = t1 - t0
    return out


def py_blocks(ch, size: int, nblocks: int, rng, block: int = 10) -> np.ndarray:
    """Python send + recv_into, timed in blocks of ``block`` round trips (one
    timer pair per block: GDRCopy pplat's method, the timer's own cost
    spread over the block); ns per round trip, one value per block.  Every
    answer is checked after its block."""
    rows = rng.integers(0, 256, size=(block, size), dtype=np.uint8)
    expect = [int(c) for c in checksums(rows)]
    pls = [r.tobytes() for r in rows]
    answers = [bytearray(16) for _ in range(block)]
    lens = [0] * block
    tags = [0] * block
    out = np.empty(nblocks, dtype=np.int64)
    pc = time.perf_counter_ns
    send, recv_into = ch.send, ch.recv_into
    seq = ch.stats()["received"]
    ks = range(block)
    for b in range(nblocks):
        t0 = pc()
        for k in ks:
            send(pls[k])
            lens[k] = recv_into(answers[k])
            tags[k] = ch.last_tag
        t1 = pc()
        for k in ks:
            seq += 1
            if not answer_ok(ch, lens[k], tags[k], answers[k], seq, expect[k]):
                raise RuntimeError(f"wrong answer to message {seq} ({size} B, block)")
        out[b] = (t1 - t0) // block
    return out


def timer_cost_ns() -> float:
    """What one time.perf_counter_ns() costs here (median of 1000 x 100)."""
    pc = time.perf_counter_ns
    best = []
    for _ in range(1000):
        t0 = pc()
        for _ in range(100):
            pc()
        best.append((pc() - t0) / 101)
    return float(np.median(best))


def py_batch(ch, size: int, batch: int, iters: int, warmup: int) -> tuple:
    """One tick (send + recv) vs. ``batch`` ticks (send_many + recv_many),
    interleaved; ns arrays (one, batch)."""
    rows = np.zeros((batch, size), dtype=np.uint8)
    rows[:] = (np.arange(batch, dtype=np.uint8) + 1)[:, None]
    csum = checksums(rows)
    tag_answers = ch.comp_size == 0
    out = None if tag_answers else np.zeros(batch, dtype=ANSWER)
    tags = np.zeros(batch, dtype=np.uint32)   # tag answers: the batch's checksums
    one = np.empty(iters, dtype=np.int64)
    many = np.empty(iters, dtype=np.int64)
    tick = rows[0].tobytes()
    ans = bytearray(16)
    pc = time.perf_counter_ns
    seq = ch.stats()["received"]
    for i in range(warmup + iters):
        t0 = pc()
        ch.send(tick)
        n = ch.recv_into(ans)
        t1 = pc()
        ch.send_many(rows)
        ch.recv_many(batch, batch, out, tags=tags if tag_answers else None)
        t2 = pc()
        seq += 1
        if not answer_ok(ch, n, ch.last_tag, ans, seq, int(csum[0])):
            raise RuntimeError(f"batch run: wrong answer to tick {seq}")
        if out is None:
            bad = (tags != csum).any()
        else:
            bad = (out["csum"] != csum).any() or \
                (out["seq"] != np.arange(seq + 1, seq + batch + 1)).any()
        if bad:
            raise RuntimeError(f"batch run: wrong answers in the batch after message {seq}")
        seq += batch
        if i >= warmup:
            one[i - warmup] = t1 - t0
            many[i - warmup] = t2 - t1
    return one, many


# ---------------------------------------------------------------------------
# The cuMemcpy + launch path

def baseline(ctx, rt, module, size: int, iters: int, warmup: int, rng) -> np.ndarray:
    import gdrpy
    variants = min(iters + warmup, 256)
    rows = rng.integers(0, 256, size=(variants, size), dtype=np.uint8)
    expect = checksums(rows)
    out = np.empty(iters, dtype=np.int64)
    pc = time.perf_counter_ns
    if ctx.is_sim:   # memcpy + a C checksum + memcpy stand in
        buf = gdrpy.memory.alloc(size + 64, ctx=ctx)
        try:
            for i in range(warmup + iters):
                v = i % variants
                t0 = pc()
                ctx.memcpy_htod(buf.ptr, rows[v])
                c = checksum(ctx.memcpy_dtoh(buf.ptr, size))
                t1 = pc()
                if c != int(expect[v]):
                    raise RuntimeError("sim baseline: wrong checksum")
                if i >= warmup:
                    out[i - warmup] = t1 - t0
        finally:
            buf.close()
        return out
    from .cuda_rt import KernelParams
    cu = rt.cu
    rt.make_current()
    stride = (size + 255) // 256 * 256
    staging = rt.host_alloc(stride * variants + 64)
    dev = gdrpy.memory.alloc(stride + 4096, ctx=ctx)
    stream = rt.stream()
    try:
        stg = staging.array(np.uint8)
        for v in range(variants):
            stg[v * stride:v * stride + size] = rows[v]
        resp_host = staging.ptr + stride * variants
        resp = staging.array(ANSWER, stride * variants, 1)
        resp_dev = dev.ptr + stride
        params = KernelParams(("u64", dev.ptr), ("u32", size), ("u64", 0), ("u64", resp_dev))
        f = module.function("gdrpy_pp_once")
        h = stream.handle
        HtoD, Launch, DtoH, Sync = (cu.cuMemcpyHtoDAsync, cu.cuLaunchKernel,
                                    cu.cuMemcpyDtoHAsync, cu.cuStreamSynchronize)
        for i in range(warmup + iters):
            v = i % variants
            params.set(2, i + 1)
            t0 = pc()
            e1, = HtoD(dev.ptr, staging.ptr + v * stride, size, h)
            e2, = Launch(f, 1, 1, 1, 32, 1, 1, 0, h, params.address, 0)
            e3, = DtoH(resp_host, resp_dev, 16, h)
            e4, = Sync(h)
            t1 = pc()
            for e, what in ((e1, "cuMemcpyHtoDAsync"), (e2, "cuLaunchKernel(gdrpy_pp_once)"),
                            (e3, "cuMemcpyDtoHAsync"), (e4, "cuStreamSynchronize")):
                rt.check((e,), what)
            if int(resp["seq"][0]) != i + 1 or int(resp["csum"][0]) != int(expect[v]):
                raise RuntimeError(f"cuMemcpy path: wrong answer to message {i + 1}")
            if i >= warmup:
                out[i - warmup] = t1 - t0
    finally:
        stream.close()
        dev.close()
        staging.close()
    return out


# ---------------------------------------------------------------------------
# One run

def run(ctx, sizes, iters: int, warmup: int, kernel_timeout_s: float = 30.0,
        host_timeout_s: float = 5.0, seed: int = 1234, log=print, with_baseline: bool = True,
        with_c: bool = True, batch: int = BATCH, tick: int = TICK_SIZE,
        near_gpu: bool = True, cpu: int | None = None, plain: bool = False,
        c_alloc: str = "vmm", near: bool = True, answer: str = "tag") -> dict:
    """Everything for every size on an open context; returns the result dict."""
    from ..numa import device_locality, pin_thread_near_gpu
    rng = np.random.default_rng(seed)
    sim = ctx.is_sim
    info = ctx.info
    res: dict = {"tool": "gdrpy pingpong", "backend": ctx.backend, "sim": sim,
                 "device": ctx.device, "gpu": "none (sim)" if sim else info.get("gpu_name"),
                 "driver": info.get("driver_version"), "iters": iters, "warmup": warmup,
                 "sizes": list(sizes), "batch": batch, "tick": tick,
                 "format": "plain" if plain else "ll",
                 "slots": "near" if near else "all", "answer": answer,
                 "consumer": SIM_LABEL if sim else "persistent GPU kernel gdrpy_pp_serve (NVRTC)",
                 "results": [], "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    res["locality"] = device_locality(ctx)
    old_aff = os.sched_getaffinity(0)
    if cpu is not None or (near_gpu and not sim):
        res["cpu"] = pin_thread_near_gpu(ctx, cpu)
    rt = module = None
    try:
        if not sim:
            from .cuda_rt import GpuRuntime, nvrtc_version
            rt = GpuRuntime(ctx.device)
            t0 = time.perf_counter()
            module = rt.compile(kernel_source(), "channel_kernels.cu")
            res.update(arch=module.arch, module=module.kind, nvrtc=nvrtc_version(),
                       compile_s=round(time.perf_counter() - t0, 3))
        srv = Server(ctx, max(max(sizes), tick), idle_timeout_s=kernel_timeout_s, rt=rt,
                     module=module, plain=plain, near=near, answer=answer)
        res["python_sm"] = srv.sm
        try:
            res["python_timer_ns"] = round(timer_cost_ns(), 1)
            for s in sizes:
                res["results"].append({"size": s, "path": "python", "stats_us": summarize(
                    py_roundtrips(srv.ch, s, iters, warmup, rng))})
                res["results"].append({"size": s, "path": "python-avg10", "stats_us": summarize(
                    py_blocks(srv.ch, s, max(10, iters // 10), rng))})
            bi = max(100, iters // 4)
            one, many = py_batch(srv.ch, tick, batch, bi, max(10, warmup // 4))
            res["results"].append({"size": tick, "path": "python-tick",
                                   "stats_us": summarize(one)})
            res["results"].append({"size": tick, "path": f"python-batch{batch}",
                                   "stats_us": summarize(many)})
        finally:
            srv.close()
        if with_c:
            c = c_roundtrips(ctx, sizes, iters, warmup, batch, tick,
                             module.image if module else None, res.get("cpu"), host_timeout_s,
                             alloc=c_alloc, plain=plain, near=near, answer=answer)
            res["c_tool"] = {k: v for k, v in c.items() if k != "rows"}
            res["results"] += c_results(c.get("rows", []), sizes, batch, tick)
        if with_baseline:
            for s in sizes:
                res["results"].append({"size": s, "path": "cuMemcpy", "stats_us": summarize(
                    baseline(ctx, rt, module, s, iters, warmup, rng))})
    finally:
        if module is not None:
            module.close()
        os.sched_setaffinity(0, old_aff)
    res["summary"] = summary(res)
    return res


# ---------------------------------------------------------------------------
# CLI

def _add(parser, *flags, **kw):
    have = getattr(parser, "_option_string_actions", {})
    if any(f in have for f in flags):
        return
    parser.add_argument(*flags, **kw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add(parser, "--device", type=int, default=0, help="CUDA device (default 0)")
    _add(parser, "--backend", default=None,
         help="gdrpy backend (default: $GDRPY_BACKEND or auto; 'sim' runs without a GPU)")
    _add(parser, "--sizes", type=parse_sizes, default=None,
         help=f"payload sizes, comma-separated (default {DEFAULT_SIZES})")
    _add(parser, "--iters", type=int, default=None,
         help=f"round trips per size and path (default {DEFAULT_ITERS}, --quick {QUICK_ITERS})")
    _add(parser, "--warmup", type=int, default=None,
         help="untimed round trips before each size (default iters/10, at least 10)")
    _add(parser, "--json", nargs="?", const="-", default=None, metavar="FILE",
         help="write the results as JSON to FILE ('-' or no FILE: stdout, table omitted)")
    _add(parser, "--plot", default=None, metavar="FILE.png", help="save a plot (needs matplotlib)")
    _add(parser, "--quick", action="store_true", help=f"{QUICK_ITERS} round trips per size")
    _add(parser, "--no-baseline", action="store_true", help="skip the cuMemcpy path")
    _add(parser, "--no-c", action="store_true", help="skip the C tool")
    _add(parser, "--batch", type=int, default=BATCH, help=f"ticks per batch (default {BATCH})")
    _add(parser, "--tick-size", type=_parse_size_arg, default=TICK_SIZE,
         help=f"tick payload for the batch comparison (default {TICK_SIZE} B)")
    _add(parser, "--cpu", type=int, default=None, help="pin the measuring thread to this CPU")
    _add(parser, "--no-near-gpu", action="store_true",
         help="do not pin the measuring thread to a CPU on the GPU's NUMA node")
    _add(parser, "--kernel-timeout", type=float, default=30.0,
         help="the kernel stops after this many idle seconds (default 30)")
    _add(parser, "--timeout", type=float, default=5.0,
         help="the C tool waits at most this long for one answer (default 5 s)")
    _add(parser, "--plain", action="store_true",
         help="channels with GDRPY_CHAN_PLAIN slots (default: LL, see docs/channel.md)")
    _add(parser, "--all-slots", action="store_true",
         help="channels without GDRPY_CHAN_NEAR (default: near slots, docs/channel.md)")
    _add(parser, "--answer", choices=("tag", "line"), default="tag",
         help="the server's answer: tag - the checksum as the completion's tag (comp_size 0, "
              "the default); line - {seq, checksum, len} (comp_size 16)")
    _add(parser, "--c-alloc", choices=("vmm", "cumemalloc"), default="vmm",
         help="the C tool's ring memory (default vmm: cuMemCreate, as the Python run's)")


def main(args) -> int:
    from ..errors import GdrError
    try:
        return _main(args)
    except (GdrError, RuntimeError, TimeoutError) as e:
        print(f"gdrpy pingpong: error: {e}", file=sys.stderr)
        return 1


def _main(args) -> int:
    import gdrpy
    sizes = getattr(args, "sizes", None) or parse_sizes(DEFAULT_SIZES)
    if isinstance(sizes, str):
        sizes = parse_sizes(sizes)
    quick = bool(getattr(args, "quick", False))
    iters = getattr(args, "iters", None) or (QUICK_ITERS if quick else DEFAULT_ITERS)
    warmup = getattr(args, "warmup", None)
    if warmup is None:
        warmup = max(10, iters // 10)
    batch = getattr(args, "batch", BATCH)
    if iters <= 0 or warmup < 0 or not 1 <= batch <= 1024 or max(sizes) > MAX_SIZE:
        print(f"gdrpy pingpong: need --iters > 0, --warmup >= 0, 1 <= --batch <= 1024, sizes "
              f"<= {fmt_size(MAX_SIZE)}", file=sys.stderr)
        return 2
    json_to = getattr(args, "json", None)
    with gdrpy.open(getattr(args, "device", 0) or 0, getattr(args, "backend", None)) as ctx:
        if ctx.is_sim:
            print(f"{SIM_LABEL} (backend sim)", file=sys.stderr)
        res = run(ctx, sizes, iters, warmup,
                  kernel_timeout_s=getattr(args, "kernel_timeout", 30.0),
                  host_timeout_s=getattr(args, "timeout", 5.0),
                  with_baseline=not getattr(args, "no_baseline", False),
                  with_c=not getattr(args, "no_c", False), batch=batch,
                  tick=getattr(args, "tick_size", TICK_SIZE),
                  near_gpu=not getattr(args, "no_near_gpu", False),
                  cpu=getattr(args, "cpu", None), plain=getattr(args, "plain", False),
                  c_alloc=getattr(args, "c_alloc", "vmm"),
                  near=not getattr(args, "all_slots", False),
                  answer=getattr(args, "answer", "tag"))
    if json_to == "-":
        print(json.dumps(res, indent=2))
    else:
        print(format_report(res))
        if json_to:
            with open(json_to, "w") as f:
                json.dump(res, f, indent=2)
            print(f"results written to {json_to}")
    plot_to = getattr(args, "plot", None)
    if plot_to:
        try:
            plot(res, plot_to)
        except RuntimeError as e:
            print(f"gdrpy pingpong: {e}", file=sys.stderr)
            return 2
    return 0


def _standalone(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gdrpy.tools.pingpong",
                                description=(__doc__ or "").split("\n\n")[0])
    from .. import __version__
    p.add_argument("--version", action="version", version=f"gdrpy {__version__}")
    add_arguments(p)
    try:
        return main(p.parse_args(argv))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(_standalone())
