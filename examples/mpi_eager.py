#!/usr/bin/env python3
"""MPI eager path with gdrpy: device-to-device ping-pong between two ranks (osu_latency style).

    mpirun -n 2 python examples/mpi_eager.py                 # MPI (mpi4py)
    python examples/mpi_eager.py                              # no mpirun: --mode local (below)
    mpirun -n 2 python examples/mpi_eager.py --backend sim    # no GPU: sim backend, labelled

Each message goes GPU -> host -> MPI -> host -> GPU, as an MPI library's
staging path moves it when the network cannot read GPU memory itself:

* **gdrpy** column: messages up to ``--eager-limit`` (default 8 KiB) take the
  eager path: ``Transfer.get`` (GPU -> host through the BAR1 mapping or
  cuMemcpy, as gdrpy's threshold picker decides for the size), MPI
  ``Send``/``Recv`` of the host buffer, ``Transfer.put`` (host -> GPU, picker
  again).  Larger messages take the staged cuMemcpy path (``Pin.ce_read`` /
  ``Pin.ce_write``: cuMemcpyDtoH / cuMemcpyHtoD through a pinned host buffer),
  so above the eager limit both columns measure the same path.
* **channel** column (up to ``--eager-limit``; ``--no-channel`` drops it):
  each rank's GPU runs a persistent echo kernel on a :class:`gdrpy.Channel`
  (``gdrpy_chan_echo``, gdrpy/tools/channel_kernels.cu; sim: libgdrpy's CPU
  stand-in thread).  A received message goes into the GPU with
  ``Channel.send`` (payload, sfence, sequence word into the ring in GPU
  memory), the kernel takes it and hands it back as a completion in
  page-locked host memory, and ``Channel.recv_into`` gives it to the next
  MPI send: every hop passes through a running kernel on each GPU.
* **cuMemcpy-staged** column: every size through cuMemcpyDtoH -> Send/Recv ->
  cuMemcpyHtoD with the same pinned host buffer (gdrpy's ``ce_read`` /
  ``ce_write``, issued from C without the GIL: a little cheaper than calling
  cuda-python yourself, so the comparison favours the baseline).

The latency printed is osu_latency's: total time / (2 x iterations), i.e.
one way, averaged; the JSON also has the median.  Before timing, every size
and path is checked once in both directions (a random pattern written into
one rank's GPU memory must arrive in the other's, read back with cuMemcpy).

Modes
-----
* ``--mode mpi``: mpi4py, launched with ``mpirun -n 2`` (or srun, ...); across
  nodes it is plain MPI (``mpirun -n 2 -H a,b python examples/mpi_eager.py``).
* ``--mode local``: no MPI at all: this script starts two processes connected
  by a ``multiprocessing`` Pipe (a socketpair) that run the same message flow.
  The output is labelled "LOCAL".  Useful where mpi4py or mpirun is missing.
* ``--mode auto`` (default): mpi when started by an MPI launcher (PMI/PMIx/
  Open MPI/Slurm variables present), else local.

GPUs: each rank takes ``local rank % number of GPUs`` unless ``--device`` is
given; on a single-GPU host both ranks share device 0 (each has its own
buffer, pin and mapping; the two ranks' copies then share one copy engine
and PCIe link, so the numbers are a little worse than with two GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import numpy as np

_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                  "MPI_LOCALNRANKS", "HYDRA_CONTROL_FD", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_ID")
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                    "PMI_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK")


def under_mpi_launcher() -> bool:
    if any(v in os.environ for v in _LAUNCHER_VARS[:-1]):
        return True
    return "SLURM_STEP_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1


def local_rank(default: int) -> int:
    for v in _LOCAL_RANK_VARS:
        if v in os.environ:
            try:
                return int(os.environ[v])
            except ValueError:
                pass
    return default


# ---------------------------------------------------------------------------
# Communicators: the same four operations over MPI or over a Pipe

class MPIComm:
    def __init__(self):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        lib = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())[:60]
        self.label = f"MPI via mpi4py {__import__('mpi4py').__version__} ({lib})"
        self.peer = 1 - self.rank if self.rank < 2 else None

    def send(self, buf, n):
        self.comm.Send([buf, n, self.MPI.BYTE], dest=self.peer, tag=7)

    def recv(self, buf, n):
        self.comm.Recv([buf, n, self.MPI.BYTE], source=self.peer, tag=7)

    def barrier(self):
        self.comm.Barrier()

    def exchange(self, obj):
        """Both ranks: send obj to the peer, return the peer's."""
        return self.comm.sendrecv(obj, dest=self.peer, source=self.peer, sendtag=9, recvtag=9)

    def abort(self, code=1):
        self.comm.Abort(code)


class PipeComm:
    """LOCAL mode: two processes, one multiprocessing Pipe (a Unix socketpair)."""

    def __init__(self, rank, conn):
        self.rank, self.size, self.peer, self.conn = rank, 2, 1 - rank, conn
        self.label = "LOCAL: 2 processes over a multiprocessing Pipe (socketpair), NOT MPI"

    def send(self, buf, n):
        self.conn.send_bytes(buf, 0, n)

    def recv(self, buf, n):
        got = self.conn.recv_bytes_into(buf)
        if got != n:
            raise RuntimeError(f"expected a {n}-byte message, got {got}")

    def barrier(self):
        self.exchange(None)

    def exchange(self, obj):
        if self.rank == 0:
            self.conn.send(obj)
            return self.conn.recv()
        other = self.conn.recv()
        self.conn.send(obj)
        return other

    def abort(self, code=1):
        os._exit(code)


# ---------------------------------------------------------------------------
# One rank

def sizes_from(a) -> list[int]:
    out, n = [], max(1, a.min_size)
    while n <= a.max_size:
        out.append(n)
        n *= 2
    return out


def _pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


class Rank:
    def __init__(self, comm, a):
        import gdrpy
        self.comm, self.a = comm, a
        ngpu = 1
        if a.device is not None:
            dev = a.device
        else:
            backend = a.backend or os.environ.get("GDRPY_BACKEND") or "auto"
            if backend != "sim":
                try:
                    from gdrpy.memory import cuda_driver
                    cu = cuda_driver()
                    ngpu = max(1, int(cu.cuDeviceGetCount()[1]))
                except Exception:
                    ngpu = 1
            dev = local_rank(comm.rank) % ngpu
        self.ctx = gdrpy.open(dev, a.backend)
        self.sim = self.ctx.is_sim
        self.ngpu = ngpu
        self.buf = gdrpy.memory.alloc(a.max_size, ctx=self.ctx)
        self.pin = self.ctx.pin(self.buf)
        self.m = self.pin.map()
        self.rt = self.host = None
        if self.sim:
            self._host_store = np.zeros(a.max_size, dtype=np.uint8)
            self.hbuf = self._host_store
        else:
            from gdrpy.tools.cuda_rt import GpuRuntime
            self.rt = GpuRuntime(dev)
            self.host = self.rt.host_alloc(a.max_size)      # pinned staging buffer
            self.hbuf = self.host.array(np.uint8)
        self.hmv = memoryview(self.hbuf)
        self.ch = self.ch_stream = self.ch_module = self.ch_sim = None
        # Calibrate (first use on a GPU host) one rank at a time: two ranks on
        # one GPU must not time copies against each other.
        self.t = None
        for r in range(2):
            if comm.rank == r:
                self.t = self.m.transfer()
            comm.barrier()

    def start_channel(self):
        """A channel whose persistent kernel echoes every message back.  Started
        after the other columns are measured: two ranks on one GPU are two CUDA
        contexts, which the GPU time-slices, so while their persistent kernels
        run every cuMemcpy (calibration, the staged column) waits for a slice."""
        import gdrpy
        lim = self.a.eager_limit
        self.ch = gdrpy.Channel(self.ctx, nslots=64, slot_size=lim, comp_size=lim)
        if self.sim:
            self.ch_sim = self.ch._sim_consumer(check=False, complete=False, echo=True,
                                                idle_timeout=600.0)
        else:
            from gdrpy.tools.cuda_rt import KernelParams, launch
            from gdrpy.tools.pingpong import kernel_source
            self.ch_module = self.rt.compile(kernel_source(), "channel_kernels.cu")
            self.ch_stream = self.rt.stream()
            self.ch_params = KernelParams(("bytes", self.ch.desc), ("u64", 600 * 10**9))
            launch(self.rt, self.ch_module.function("gdrpy_chan_echo"), (1,), (32,),
                   self.ch_params, self.ch_stream, what="cuLaunchKernel(gdrpy_chan_echo)")
        self.ch.wait_attached(timeout=30.0)

    # the two halves of one hop
    def send_side(self, method, n):
        hv = self.hmv[:n]
        if method == "channel":
            self.ch.recv_into(hv, 10.0)          # GPU -> host: the kernel's completion
            self.comm.send(self.hbuf, n)
            return
        if method == "gdrpy" and n <= self.a.eager_limit:
            self.t.get(0, hv)                   # GPU -> host: mapping or cuMemcpy (picker)
        else:
            self.pin.ce_read(0, n, hv)          # cuMemcpyDtoH into the pinned buffer
        self.comm.send(self.hbuf, n)

    def recv_side(self, method, n):
        self.comm.recv(self.hbuf, n)
        hv = self.hmv[:n]
        if method == "channel":
            self.ch.send(hv, 0, 10.0)            # host -> GPU: into the ring, kernel takes it
            return
        if method == "gdrpy" and n <= self.a.eager_limit:
            self.t.put(0, hv)                   # host -> GPU: mapping or cuMemcpy (picker)
        else:
            self.pin.ce_write(0, hv)            # cuMemcpyHtoD from the pinned buffer

    def path_of(self, method, n):
        if method == "channel":
            return "channel+echo kernel"
        if method != "gdrpy" or n > self.a.eager_limit:
            return "staged"
        return f"{self.t.path_for('d2h', n)}/{self.t.path_for('h2d', n)}"

    def _device_write(self, data):
        self.pin.ce_write(0, data)
        self.pin.ce_read(0, 1)      # a synchronous DtoH after the HtoD: the data has landed

    def validate_channel(self, n) -> str | None:
        """A pattern from rank 0's GPU ring goes through rank 1's GPU and
        back; each rank checks what its kernel handed back."""
        p0 = _pattern(n, 3 * n + 5)
        err = None
        back = np.zeros(n, dtype=np.uint8)
        if self.comm.rank == 0:
            self.ch.send(p0, 0, 10.0)
            self.send_side("channel", n)
            if not np.array_equal(self.hbuf[:n], p0):
                err = "rank 0: its echo kernel handed back wrong data"
            self.recv_side("channel", n)
            self.ch.recv_into(back, 10.0)
            if err is None and not np.array_equal(back, p0):
                err = f"rank 0 received wrong data ({int((back != p0).sum())} bytes differ)"
        else:
            self.recv_side("channel", n)
            self.send_side("channel", n)
            if not np.array_equal(self.hbuf[:n], p0):
                err = "rank 1: wrong data through its GPU's channel"
        other = self.comm.exchange(err)
        return err or other

    def validate(self, method, n) -> str | None:
        if method == "channel":
            return self.validate_channel(n)
        p0, p1 = _pattern(n, 2 * n + 1), _pattern(n, 2 * n + 2)
        err = None
        if self.comm.rank == 0:
            self._device_write(p0)
            self.send_side(method, n)
            self.recv_side(method, n)
            got = np.frombuffer(self.pin.ce_read(0, n), dtype=np.uint8)
            if not np.array_equal(got, p1):
                err = f"rank 0 received wrong data ({int((got != p1).sum())} bytes differ)"
        else:
            self.recv_side(method, n)
            got = np.frombuffer(self.pin.ce_read(0, n), dtype=np.uint8)
            if not np.array_equal(got, p0):
                err = f"rank 1 received wrong data ({int((got != p0).sum())} bytes differ)"
            self._device_write(p1)
            self.send_side(method, n)
        other = self.comm.exchange(err)
        return err or other

    def pingpong(self, method, n, iters, skip):
        send_side, recv_side = self.send_side, self.recv_side
        pc = time.perf_counter_ns
        rtt = np.empty(iters, dtype=np.int64)
        self.comm.barrier()
        if self.comm.rank == 0:
            if method == "channel":          # rank 0's GPU holds the first message
                self.ch.send(self.hmv[:n], 0, 10.0)
            for i in range(skip + iters):
                t0 = pc()
                send_side(method, n)
                recv_side(method, n)
                if i >= skip:
                    rtt[i - skip] = pc() - t0
            if method == "channel":          # and hands the last one back
                self.ch.recv_into(self.hmv[:n], 10.0)
        else:
            for _ in range(skip + iters):
                recv_side(method, n)
                send_side(method, n)
        return rtt

    def close(self):
        if self.ch is not None:
            try:
                self.ch.close(timeout=30.0)      # drain, the kernel stops, memory freed
                if self.ch_sim is not None:
                    self.ch._sim_join(self.ch_sim)
                if self.ch_stream is not None:
                    from gdrpy.tools.cuda_rt import wait_stream
                    if wait_stream(self.ch_stream, 30.0):
                        self.ch_stream.close()
                if self.ch_module is not None:
                    self.ch_module.close()
            except Exception as e:
                print(f"mpi_eager: rank {self.comm.rank} channel: {e}", file=sys.stderr)
        for o in (self.m, self.pin, self.buf, self.host, self.ctx):
            try:
                if o is not None:
                    o.close()
            except Exception as e:
                print(f"mpi_eager: rank {self.comm.rank} cleanup: {e}", file=sys.stderr)


def rank_main(comm, a) -> int:
    if comm.size != 2:
        if comm.rank == 0:
            print(f"mpi_eager: needs exactly 2 ranks, got {comm.size} "
                  "(mpirun -n 2 python examples/mpi_eager.py)", file=sys.stderr)
        return 2
    r = Rank(comm, a)
    try:
        me = {"host": socket.gethostname(), "device": r.ctx.device, "backend": r.ctx.backend,
              "gpu": r.ctx.info.get("gpu_name"), "thresholds": r.t.thresholds()}
        peer = comm.exchange(me)
        ranks = [me, peer] if comm.rank == 0 else [peer, me]
        if comm.rank == 0:
            print_header(comm, a, r, ranks)
        rows = [{"size": n} for n in sizes_from(a)]
        # The copy columns first, then (kernels started) the channel column.
        phases = [("gdrpy", "staged")] + ([("channel",)] if a.channel else [])
        for methods in phases:
            if methods == ("channel",):
                r.start_channel()
            for row in rows:
                n = row["size"]
                if methods == ("channel",) and n > a.eager_limit:
                    continue
                for method in methods:
                    if not measure(r, comm, a, method, row):
                        return 1
        if comm.rank == 0:
            for row in rows:
                print_row(row)
            sys.stdout.flush()
        if comm.rank == 0:
            if r.sim:
                print("# *** SIM backend: host memory stands in for GPU memory; "
                      "no GPU was used ***")
            if a.json:
                rep = {"tool": "examples/mpi_eager.py", "mode": comm.label, "ranks": ranks,
                       "sim": r.sim, "eager_limit": a.eager_limit,
                       "latency": "one-way = round trip / 2 (osu_latency)", "rows": rows}
                with open(a.json, "w") as f:
                    json.dump(rep, f, indent=2)
                print(f"# results written to {a.json}")
        return 0
    finally:
        r.close()


def measure(r, comm, a, method, row) -> bool:
    """Checks the data on one path at one size, then times it into row[method]
    (rank 0).  False after a failed data check (reported)."""
    n = row["size"]
    large = n > a.large_from
    iters = a.iters_large if large else a.iters
    skip = a.skip_large if large else a.skip
    err = r.validate(method, n)
    if err:
        if comm.rank == 0:
            print(f"mpi_eager: DATA CHECK FAILED, {method} path, {n} B: {err}", file=sys.stderr)
        return False
    rtt = r.pingpong(method, n, iters, skip)
    if comm.rank == 0:
        row[method] = {"avg_us": float(rtt.sum() / (2 * iters) / 1e3),
                       "median_us": float(np.median(rtt) / 2e3),
                       "p99_us": float(np.percentile(rtt, 99) / 2e3),
                       "iters": iters, "path": r.path_of(method, n)}
    return True


def print_header(comm, a, r, ranks):
    from gdrpy.threshold import format_threshold
    sim = r.sim
    if sim:
        print("# *** SIM backend: host memory stands in for GPU memory; no GPU is used ***")
    print("# gdrpy MPI eager latency test (osu_latency style): GPU -> host -> "
          f"{'pipe' if isinstance(comm, PipeComm) else 'MPI'} -> host -> GPU")
    print(f"# mode: {comm.label}")
    devs = ", ".join(f"rank {i}: {x['host']} device {x['device']} ({x['gpu']})"
                     for i, x in enumerate(ranks))
    print(f"# backend {r.ctx.backend}; {devs}")
    if ranks[0]["host"] == ranks[1]["host"] and ranks[0]["device"] == ranks[1]["device"] \
            and not sim:
        print("# both ranks share one GPU (single-GPU host): their CUDA contexts take turns on it,"
              " so the channel column (one persistent kernel per rank, measured last) waits"
              " for the GPU's time slices; the copy columns are measured before those kernels"
              " start")
    th = ranks[0]["thresholds"]
    print(f"# gdrpy: <= {a.eager_limit} B eager (Transfer.get -> send/recv -> Transfer.put; "
          f"rank 0 picker: get via mapping up to {format_threshold(th['d2h'])}, put up to "
          f"{format_threshold(th['h2d'])}); larger: staged cuMemcpy")
    if sim:
        print("# cuMemcpy-staged: SIM - memcpy stands in for cuMemcpyDtoH/HtoD; the host buffer "
              "is ordinary memory")
    else:
        print("# cuMemcpy-staged: cuMemcpyDtoH -> send/recv -> cuMemcpyHtoD through a pinned "
              "host buffer, every size")
    if a.channel:
        print(f"# channel: <= {a.eager_limit} B: Channel.send into the GPU ring -> echo kernel "
              "-> completion -> Channel.recv_into"
              + (" (SIM: a CPU thread stands in for the kernel)" if sim else ""))
    print("# latency = total / (2 x iterations) (one way, microseconds)")
    print(f"{'# Size':<10s}{'gdrpy (us)':>14s}{'cuMemcpy-staged (us)':>24s}{'speedup':>10s}"
          f"{'channel (us)':>15s}   gdrpy path (get/put)")


def print_row(row):
    g, s = row["gdrpy"], row["staged"]
    sp = s["avg_us"] / max(g["avg_us"], 1e-9)
    ch = f"{row['channel']['avg_us']:15.2f}" if "channel" in row else f"{'-':>15s}"
    print(f"{row['size']:<10d}{g['avg_us']:14.2f}{s['avg_us']:24.2f}{sp:9.1f}x{ch}   "
          f"{g['path']}")


# ---------------------------------------------------------------------------
# Entry points

def _local_child(rank, conn, argv):
    a = parse(argv)
    comm = PipeComm(rank, conn)
    try:
        rc = rank_main(comm, a)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        print(f"mpi_eager: rank {rank}: the other rank went away", file=sys.stderr)
        rc = 1
    except BaseException as e:
        print(f"mpi_eager: rank {rank}: {type(e).__name__}: {e}", file=sys.stderr)
        rc = 1
    finally:
        conn.close()
    sys.stdout.flush()
    os._exit(rc)


def run_local(argv, a) -> int:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")       # never fork a process that holds a CUDA context
    c0, c1 = ctx.Pipe(duplex=True)
    procs = [ctx.Process(target=_local_child, args=(r, c, argv), name=f"mpi_eager-rank{r}")
             for r, c in ((0, c0), (1, c1))]
    for p in procs:
        p.start()
    c0.close()
    c1.close()
    deadline = time.monotonic() + a.timeout
    rc = 0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            print(f"mpi_eager: {p.name} still running after {a.timeout:.0f} s: terminating it",
                  file=sys.stderr)
            p.terminate()
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
            rc = rc or 124
        elif p.exitcode:
            rc = rc or p.exitcode
    return rc


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("auto", "mpi", "local"), default="auto",
                   help="mpi (mpi4py under mpirun), local (2 processes over a pipe), "
                        "auto (mpi when started by an MPI launcher)")
    p.add_argument("--backend", default=None, help="gdrpy backend (default: auto; sim: no GPU)")
    p.add_argument("--device", type=int, default=None,
                   help="CUDA device for this rank (default: local rank %% number of GPUs)")
    p.add_argument("--min-size", type=int, default=1)
    p.add_argument("--max-size", type=int, default=4 << 20, help="default 4 MiB")
    p.add_argument("--eager-limit", type=int, default=8192,
                   help="largest message on the gdrpy eager path (default 8192)")
    p.add_argument("--iters", type=int, default=1000, help="iterations, small sizes (1000)")
    p.add_argument("--skip", type=int, default=100, help="warm-up iterations, small sizes")
    p.add_argument("--iters-large", type=int, default=100, help="iterations above --large-from")
    p.add_argument("--skip-large", type=int, default=10)
    p.add_argument("--large-from", type=int, default=65536,
                   help="sizes above this use --iters-large (default 64 KiB)")
    p.add_argument("--no-channel", dest="channel", action="store_false",
                   help="skip the channel column (persistent echo kernel per rank)")
    p.add_argument("--json", default=None, metavar="PATH", help="write results as JSON (rank 0)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="local mode: kill the ranks after this many seconds (default 300)")
    a = p.parse_args(argv)
    if a.min_size < 1 or a.max_size < a.min_size or a.max_size > 1 << 30:
        p.error("need 1 <= --min-size <= --max-size <= 1 GiB")
    if a.iters < 1 or a.iters_large < 1 or a.skip < 0 or a.skip_large < 0:
        p.error("iterations must be positive")
    return a


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse(argv)
    mode = a.mode
    if mode == "auto":
        mode = "mpi" if under_mpi_launcher() else "local"
    if mode == "local":
        if under_mpi_launcher():
            print("mpi_eager: --mode local under an MPI launcher: start it without mpirun",
                  file=sys.stderr)
            return 2
        return run_local(argv, a)
    try:
        comm = MPIComm()
    except ImportError as e:
        print(f"mpi_eager: mpi4py is not available ({e}); use --mode local, or "
              "pip install mpi4py (and an MPI, e.g. pip install mpich)", file=sys.stderr)
        return 2
    try:
        return rank_main(comm, a)
    except BaseException as e:
        print(f"mpi_eager: rank {comm.rank}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.stderr.flush()
        comm.abort(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
