"""gdrpy.Channel on a GPU (marked gpu: skipped only where no GPU exists; with
GDRPY_REQUIRE_GPU=1 nothing skips).  The consumer is the checking persistent
kernel ``gdrpy_chan_check`` (gdrpy/tools/channel_kernels.cu, compiled by
NVRTC): it verifies every message's pattern and tag (errors counted in
page-locked host memory) and answers each with {seq, checksum, len}, which
the host checks in turn.  The sim versions are in test_channel.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gdrpy
from gdrpy.errors import ChannelClosedError, ChannelFullError, ChannelTimeoutError
from gdrpy.tools.chancheck import checksums, patterns

pytestmark = pytest.mark.gpu

BACKEND = os.environ.get("GDRPY_GPU_BACKEND", "nvrm")
ANSWER = np.dtype([("seq", "<u8"), ("csum", "<u4"), ("len", "<u4")])

SERVE_WARP_SRC = r"""
#include "gdrpy_channel.cuh"
/* The header's generic loop: answer each message with its first byte + 1
 * and its length (exercises gdrpy_chan_serve_warp as users would). */
extern "C" __global__ void echo(gdrpy_chan_desc_t d, unsigned long long idle_ns)
{
    if (threadIdx.x >= 32) return;
    gdrpy_chan_serve_warp(d, idle_ns,
        [](unsigned long long i, const volatile unsigned char *msg, unsigned len,
           unsigned tag, unsigned char *out) -> int {
            out[0] = (unsigned char)(msg[0] + 1);
            out[1] = (unsigned char)len;
            return 2;
        });
}
"""


@pytest.fixture(scope="module")
def rt():
    from gdrpy.tools.cuda_rt import GpuRuntime
    return GpuRuntime(0)


@pytest.fixture(scope="module")
def module(rt):
    from gdrpy.tools.pingpong import kernel_source
    m = rt.compile(kernel_source(), "channel_kernels.cu")
    yield m
    m.close()


@pytest.fixture
def gctx():
    c = gdrpy.open(0, BACKEND)
    yield c
    c.close()


class Kernel:
    """gdrpy_chan_check on a channel: launch, errors, wait for its end."""

    def __init__(self, rt, module, ch, complete=True, idle_s=20.0, name="gdrpy_chan_check"):
        from gdrpy.tools.cuda_rt import KernelParams, launch
        self.rt, self.ch = rt, ch
        self.err_mem = rt.host_alloc(4096)
        self.errors = self.err_mem.array(np.uint64, 0, 2)
        self.stream = rt.stream()
        if name == "gdrpy_chan_check":
            self.params = KernelParams(("bytes", ch.desc), ("u64", int(idle_s * 1e9)),
                                       ("u64", self.err_mem.dptr), ("u32", int(complete)))
        else:
            self.params = KernelParams(("bytes", ch.desc), ("u64", int(idle_s * 1e9)))
        launch(rt, module.function(name), (1,), (32,), self.params, self.stream)

    def wait(self, timeout_s=30.0) -> bool:
        from gdrpy.tools.cuda_rt import wait_stream
        ok = wait_stream(self.stream, timeout_s)
        if ok:
            self.stream.synchronize()     # raises on a kernel fault
        return ok

    def close(self):
        if self.wait():
            self.stream.close()
            self.err_mem.close()


def check_near_table(ch: gdrpy.Channel) -> None:
    """A near channel's slot table (host block copy) as the kernel chose it:
    nslots distinct physical slots of place_nslots (twice nslots, at least
    64 KiB of them), in ring order, and the offsets sends use."""
    d = ch.device_pointers()
    n, start, np_ = d["nslots"], 128 + d["comp_nslots"] * d["comp_stride"], d["place_nslots"]
    assert np_ == max(2 * n, -(-65536 // d["slot_stride"]))
    hb = np.frombuffer(ch.host_block(), dtype=np.uint8)
    assert int(hb[80:84].view(np.uint32)[0]) == 1, "the kernel did not choose its slots"
    table = hb[start:start + 4 * n].view(np.uint32).astype(np.int64)
    assert len(set(table.tolist())) == n and int(table.max()) < np_
    assert bool(np.all(np.diff(table) > 0)), "not in ring order"
    assert [ch.slot_offset(i) for i in range(n)] == [int(p) * d["slot_stride"] for p in table]
    # the device's copy, and the cycle counts the choice left after it
    # (physical slots n..np_-1; an atomic that was timed takes well over 50 cycles)
    dev = np.frombuffer(ch.mapping, dtype=np.uint8)
    at = 128 + np_ * d["slot_stride"]
    dt = dev[at:at + 4 * np_].view(np.uint32).astype(np.int64)
    assert dt[:n].tolist() == table.tolist()
    assert int(dt[n:].min()) > 50 and int(dt[n:].max()) <= 4095, dt[n:].tolist()
    del dev


NEAR = pytest.mark.parametrize("near", [False, True], ids=["all-slots", "near-slots"])


@NEAR
@pytest.mark.parametrize("plain", [False, True], ids=["LL", "PLAIN"])
@pytest.mark.parametrize("answer", ["line", "tag"])
def test_gpu_ordering_1e6_messages_checked_by_the_kernel_and_the_host(gctx, rt, module, plain,
                                                                      near, answer):
    """10^6 messages (batches of 32 with varying lengths, then single sends):
    the kernel checks every payload and tag, the host every answer.  Lengths
    1..96: on LL channels both LL messages (<= 64 B) and plain-area ones.
    Near slots: the kernel chose its ring's slots when it attached.  Answers
    (channel_kernels.cu): "line" {seq, checksum, len} (comp_size 16); "tag"
    the checksum as the completion's tag (comp_size 0: the single-message
    fast path answers from its sample, a burst with one store each)."""
    n_batched, n_single, batch, size = 960_000, 40_000, 32, 96
    tag_answers = answer == "tag"
    with gdrpy.Channel(gctx, nslots=256, slot_size=size, comp_size=0 if tag_answers else 16,
                       plain=plain, near=near) as ch:
        k = Kernel(rt, module, ch)
        ch.wait_attached(timeout=20)
        if near:
            check_near_table(ch)
        out = None if tag_answers else np.zeros(batch, dtype=ANSWER)
        tags = np.zeros(batch, dtype=np.uint32)
        bad = 0
        first_bad = None
        for first in range(0, n_batched, batch):
            rows = patterns(first, batch, size)
            lens = (np.arange(first, first + batch) * 7) % size + 1
            ch.send_many([memoryview(rows[j])[:lens[j]] for j in range(batch)],
                         tags=list(range(first, first + batch)), timeout=10)
            assert ch.recv_many(batch, batch, out, timeout=10, tags=tags) == batch
            if tag_answers:
                nb = int(np.count_nonzero(tags != checksums(rows, lens)))
            else:
                nb = int(np.count_nonzero(out["seq"] != np.arange(first + 1, first + batch + 1)))
                nb += int(np.count_nonzero(out["csum"] != checksums(rows, lens)))
                nb += int(np.count_nonzero(out["len"] != lens))
                nb += int(np.count_nonzero(tags != np.arange(first, first + batch)))
            if nb and first_bad is None:
                first_bad = (first, tags.copy() if tag_answers else out.copy())
            bad += nb
        ans = bytearray(16)
        av = np.frombuffer(ans, dtype=ANSWER)
        for i in range(n_batched, n_batched + n_single):
            ln = 1 + (i * 13) % size
            row = patterns(i, 1, size)[0, :ln]
            ch.send(row, tag=i & 0xFFFFFFFF, timeout=10)
            got = ch.recv_into(ans, timeout=10)
            want = int(checksums(row[None, :], np.array([ln]))[0])
            if tag_answers:
                bad += got != 0 or ch.last_tag != want
            elif got != 16 or int(av["seq"][0]) != i + 1 or int(av["len"][0]) != ln or \
                    int(av["csum"][0]) != want:
                bad += 1
        st = ch.shutdown(timeout=20)
        assert k.wait(), "the kernel did not exit after shutdown"
        kernel_errors, kernel_first = int(k.errors[0]), int(k.errors[1])
        k.close()
    n = n_batched + n_single
    assert (kernel_errors, bad) == (0, 0), (
        f"kernel saw {kernel_errors} bad messages (first index {kernel_first - 1}); host saw "
        f"{bad} bad answers (first batch: {first_bad})")
    assert st["status"] == "stopped" and st["final_consumed"] == n and st["dropped"] == 0, st


def test_gpu_ring_full_timeouts_then_progress(gctx, rt, module):
    with gdrpy.Channel(gctx, nslots=8, slot_size=32, comp_size=16) as ch:
        pats = patterns(0, 9, 32)
        for i in range(8):                      # no kernel yet: nothing is consumed
            ch.send(pats[i], tag=i, timeout=0)
        with pytest.raises(ChannelFullError):
            ch.send(pats[8], tag=8, timeout=0)
        with pytest.raises(ChannelTimeoutError):
            ch.send(pats[8], tag=8, timeout=0.01)
        with pytest.raises(ChannelTimeoutError):
            ch.recv(timeout=0.01)
        k = Kernel(rt, module, ch, complete=False)
        ch.wait_attached(timeout=20)
        ch.send(pats[8], tag=8, timeout=10)     # the kernel frees the ring
        with pytest.raises(ChannelTimeoutError):
            ch.recv(timeout=0.01)               # complete=False: no answers
        st = ch.shutdown(timeout=20)
        assert k.wait()
        errs = int(k.errors[0])
        k.close()
    assert errs == 0 and st["final_consumed"] == 9 and st["status"] == "stopped", st


@pytest.mark.parametrize("drain", [True, False])
def test_gpu_shutdown_with_messages_in_flight(gctx, rt, module, drain):
    with gdrpy.Channel(gctx, nslots=16, slot_size=32, comp_size=16) as ch:
        pats = patterns(0, 10, 32)
        for i in range(10):
            ch.send(pats[i], tag=i)
        if not drain:
            ch.shutdown(drain=False, timeout=0)  # requested before the kernel runs
        k = Kernel(rt, module, ch, complete=False)
        ch.wait_attached(timeout=20)
        st = ch.shutdown(drain=drain, timeout=20)
        assert k.wait()
        errs = int(k.errors[0])
        k.close()
        with pytest.raises(ChannelClosedError):
            ch.send(b"x")                        # shut down: no more sends
    assert errs == 0 and st["status"] == "stopped" and st["sent"] == 10
    if drain:
        assert st["final_consumed"] == 10 and st["dropped"] == 0, st
    else:   # stopped at its next check: whatever it did not take is counted
        assert st["final_consumed"] + st["dropped"] == 10, st


def test_gpu_kernel_watchdog_and_closed_waits(gctx, rt, module):
    with gdrpy.Channel(gctx, nslots=4, slot_size=16) as ch:
        k = Kernel(rt, module, ch, complete=True, idle_s=0.05)
        ch.wait_attached(timeout=20)
        assert k.wait(30)
        k.close()
        assert ch.stats()["status"] == "timeout"
        with pytest.raises(ChannelClosedError, match="stopped"):
            ch.recv(timeout=None)


@NEAR
@pytest.mark.parametrize("plain", [False, True], ids=["LL", "PLAIN"])
def test_gpu_header_serve_warp_template(gctx, rt, plain, near):
    mod = rt.compile(SERVE_WARP_SRC, "serve_warp_test.cu")
    try:
        with gdrpy.Channel(gctx, nslots=64, slot_size=16, comp_size=8, plain=plain,
                           near=near) as ch:
            k = Kernel(rt, mod, ch, name="echo")
            ch.wait_attached(timeout=20)
            if near:
                check_near_table(ch)
            for i in range(500):
                ch.send(bytes([i & 0xFF]) * (1 + i % 16), tag=i)
                r = ch.recv(timeout=10)
                assert r == bytes([(i + 1) & 0xFF, 1 + i % 16]) and ch.last_tag == i, (i, r)
            rows = np.full((32, 16), 7, dtype=np.uint8)
            ch.send_many(rows)
            out = bytearray(32 * 8)
            assert ch.recv_many(32, 32, out, timeout=10) == 32
            assert all(out[j * 8:j * 8 + 2] == bytes([8, 16]) for j in range(32))
            st = ch.shutdown(timeout=20)
            assert k.wait()
            k.stream.close()
            k.err_mem.close()
        assert st["final_consumed"] == 532 and st["status"] == "stopped"
    finally:
        mod.close()


@NEAR
@pytest.mark.parametrize("plain", [False, True], ids=["LL", "PLAIN"])
def test_gpu_echo_kernel_long_and_short_payloads(gctx, rt, module, plain, near):
    """gdrpy_chan_echo (the MPI eager example's kernel): every payload comes
    back byte for byte, 1..300 bytes (LL words up to 64 B, the plain area
    beyond, both directions), single sends and batches."""
    size = 300
    with gdrpy.Channel(gctx, nslots=64, slot_size=size, comp_size=size, plain=plain,
                       near=near) as ch:
        k = Kernel(rt, module, ch, name="gdrpy_chan_echo")
        ch.wait_attached(timeout=20)
        if near:
            check_near_table(ch)
        rng = np.random.default_rng(7)
        for i in range(600):
            ln = 1 + (i * 37) % size
            msg = rng.integers(0, 256, ln, dtype=np.uint8).tobytes()
            ch.send(msg, tag=i, timeout=10)
            got = ch.recv(timeout=10)
            assert got == msg and ch.last_tag == i, (i, ln, got[:16], msg[:16])
        msgs = [rng.integers(0, 256, 1 + (j * 61) % size, dtype=np.uint8).tobytes()
                for j in range(32)]
        ch.send_many(msgs, tags=list(range(32)), timeout=10)
        for j in range(32):
            assert ch.recv(timeout=10) == msgs[j] and ch.last_tag == j, j
        st = ch.shutdown(timeout=20)
        assert k.wait()
        k.stream.close()
        k.err_mem.close()
    assert st["final_consumed"] == 632 and st["status"] == "stopped", st


def test_gpu_put_many_lands_in_device_memory(gctx):
    buf = gdrpy.memory.alloc(1 << 16, ctx=gctx)
    try:
        with gctx.pin(buf) as pin, pin.map() as m:
            pin.ce_write(0, bytes(1 << 16))
            items = [(0, b"head"), (4096, bytes(range(200))), ((1 << 16) - 3, b"end")]
            assert m.put_many(items) == 4 + 200 + 3
            got = pin.ce_read(0, 1 << 16)
            for off, data in items:
                assert got[off:off + len(data)] == data
            assert got[4:4096] == bytes(4092)
    finally:
        buf.close()
