"""gdrpy.Channel and Mapping.put_many on the sim backend: a CPU thread inside
libgdrpy (gdrpy_chan_sim_consumer) stands in for the GPU kernel, checks
every message's payload and tag, and answers each with {seq, checksum, len}.
The GPU versions of these tests are in test_channel_gpu.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import gdrpy
from gdrpy.errors import (
    ArgumentTypeError,
    BusyError,
    ChannelClosedError,
    ChannelFullError,
    ChannelTimeoutError,
    ClosedError,
    GdrError,
    InvalidArgumentError,
    OutOfRangeError,
)
from gdrpy.tools.chancheck import checksum, checksums, pattern, patterns

COMP = np.dtype([("seq", "<u8"), ("csum", "<u4"), ("len", "<u4")])


@pytest.fixture
def sctx():
    c = gdrpy.open(0, "sim")
    yield c
    c.close()


@pytest.mark.parametrize("plain", [False, True], ids=["LL", "PLAIN"])
def test_send_recv_roundtrip_answers_each_message(sctx, plain):
    with gdrpy.Channel(sctx, nslots=16, slot_size=64, comp_size=16, plain=plain) as ch:
        assert ch.plain == plain
        h = ch._sim_consumer(check=True, complete=True)
        for i in range(100):
            payload = pattern(i, 1 + i % 64)
            ch.send(payload, tag=i)
            r = np.frombuffer(ch.recv(timeout=5), dtype=COMP)[0]
            assert (int(r["seq"]), int(r["csum"]), int(r["len"])) == \
                (i + 1, checksum(payload), len(payload)), f"message {i}"
            assert ch.last_tag == i
        st = ch.shutdown()
        assert st["status"] == "stopped" and st["final_consumed"] == 100
        assert ch._sim_join(h) == (100, 0, 2**64 - 1)


@pytest.mark.parametrize("plain", [False, True], ids=["LL", "PLAIN"])
def test_tag_answers_without_completion_payloads(sctx, plain):
    """comp_size 0: the reference consumer answers with the checksum as the
    completion's tag (as the GPU ping-pong kernel does), singles and
    batches; recv_many hands the tags over in ``tags``."""
    with gdrpy.Channel(sctx, nslots=16, slot_size=64, comp_size=0, plain=plain) as ch:
        h = ch._sim_consumer(check=True, complete=True)
        for i in range(50):
            payload = pattern(i, 1 + i % 64)
            ch.send(payload, tag=i)
            assert ch.recv(timeout=5) == b""
            assert ch.last_tag == checksum(payload), f"message {i}"
        rows = patterns(50, 8, 64)
        ch.send_many(rows, tags=list(range(50, 58)))
        tags = np.zeros(8, dtype=np.uint32)
        assert ch.recv_many(8, 8, None, timeout=5, tags=tags) == 8
        assert tags.tolist() == checksums(rows).tolist()
        ch.shutdown()
        assert ch._sim_join(h) == (58, 0, 2**64 - 1)


def test_recv_many_tags_argument(sctx):
    """``tags``: each completion's tag (with {seq, checksum, len} answers: the
    message's own); a buffer too small or not 4-byte aligned is refused
    before anything is received."""
    with gdrpy.Channel(sctx, nslots=16, slot_size=16, comp_size=16) as ch:
        h = ch._sim_consumer(check=False, complete=True)
        ch.send_many([b"a", b"b", b"c"], tags=[7, 8, 9])
        with pytest.raises(InvalidArgumentError, match="12 needed"):
            ch.recv_many(3, 3, None, tags=np.zeros(2, dtype=np.uint32))
        raw = bytearray(13)
        with pytest.raises(InvalidArgumentError, match="aligned"):
            ch.recv_many(3, 3, None, tags=memoryview(raw)[1:])
        with pytest.raises(ArgumentTypeError):
            ch.recv_many(3, 3, None, tags=5)
        # a huge max_count: the buffers are sized for what C can take (at
        # most comp_nslots), and the size cannot wrap around
        with pytest.raises(InvalidArgumentError, match="needed"):
            ch.recv_many(1, 2**62 + 1, None, tags=np.zeros(1, dtype=np.uint32))
        with pytest.raises(InvalidArgumentError, match="needed"):
            ch.recv_many(1, 2**62 + 1, bytearray(16))
        tags = np.zeros(3, dtype=np.uint32)
        out = np.zeros(3, dtype=COMP)
        assert ch.recv_many(3, 3, out, timeout=5, tags=tags) == 3
        assert tags.tolist() == [7, 8, 9] and out["seq"].tolist() == [1, 2, 3]
        ch.shutdown()
        ch._sim_join(h)


@pytest.mark.parametrize("near", [False, True], ids=["all-slots", "near-slots"])
@pytest.mark.parametrize("plain", [False, True], ids=["LL", "PLAIN"])
def test_ordering_51k_messages_batched_and_checked(sctx, plain, near):
    """send_many (one fence per batch of 32) under a checking consumer; every
    completion checked on the host; nothing torn, lost or reordered.  Near
    slots: the sim consumer chooses the odd physical slots, so both sides go
    through the slot table.  51,200 messages (1600 batches): 800 laps of the
    64-slot ring and of the completion ring; each batch is a hand-over
    between the two threads (a scheduler time slice when the host is
    oversubscribed, as under pytest -n auto)."""
    n, size, batch = 51_200, 48, 32
    with gdrpy.Channel(sctx, nslots=64, slot_size=size, comp_size=16, plain=plain,
                       near=near) as ch:
        h = ch._sim_consumer(check=True, complete=True)
        out = np.zeros(batch, dtype=COMP)
        bad = 0
        for first in range(0, n, batch):
            rows = patterns(first, batch, size)
            ch.send_many(rows, tags=list(range(first, first + batch)), timeout=5)
            got = ch.recv_many(batch, batch, out, timeout=5)
            assert got == batch
            bad += int(np.count_nonzero(out["seq"] != np.arange(first + 1, first + batch + 1)))
            bad += int(np.count_nonzero(out["csum"] != checksums(rows)))
        st = ch.shutdown()
        consumed, errors, first_bad = ch._sim_join(h)
        assert (errors, bad) == (0, 0), f"consumer errors {errors} (first {first_bad}), host {bad}"
        assert consumed == n and st["final_consumed"] == n and st["dropped"] == 0


@pytest.mark.parametrize("plain", [False, True], ids=["LL", "PLAIN"])
def test_echo_long_and_short_payloads_both_directions(sctx, plain):
    """The sim consumer echoes each message: 1..200 bytes (LL words up to 64
    bytes, the slot's plain area beyond), singles and a mixed batch; ring
    laps wrap many times."""
    size = 200
    with gdrpy.Channel(sctx, nslots=8, slot_size=size, comp_size=size, plain=plain) as ch:
        h = ch._sim_consumer(check=False, complete=False, echo=True)
        rng = np.random.default_rng(3)
        for i in range(400):
            msg = rng.integers(0, 256, 1 + (i * 37) % size, dtype=np.uint8).tobytes()
            ch.send(msg, tag=i)
            assert ch.recv(timeout=5) == msg and ch.last_tag == i, i
        msgs = [rng.integers(0, 256, 1 + (j * 61) % size, dtype=np.uint8).tobytes()
                for j in range(8)]
        ch.send_many(msgs, tags=list(range(8)))
        for j in range(8):
            assert ch.recv(timeout=5) == msgs[j] and ch.last_tag == j
        ch.shutdown()
        assert ch._sim_join(h)[:2] == (408, 0)


def test_send_many_accepts_a_list_of_buffers(sctx):
    with gdrpy.Channel(sctx, nslots=8, slot_size=32, comp_size=16) as ch:
        h = ch._sim_consumer(check=True, complete=True)
        msgs = [pattern(i, 1 + i) for i in range(8)]
        assert ch.send_many(msgs, tags=list(range(8))) == 8
        assert ch.recv_many(8, timeout=5) == 8
        with pytest.raises(InvalidArgumentError):
            ch.send_many([b"x"] * 9)              # more than nslots
        with pytest.raises(InvalidArgumentError):
            ch.send_many([b"x"] * 2, tags=[1])    # tag count
        with pytest.raises(InvalidArgumentError):
            ch.send_many(np.zeros(8, np.uint8))   # 1-D
        ch.shutdown()
        assert ch._sim_join(h)[:2] == (8, 0)


def test_ring_full_and_timeouts(sctx):
    with gdrpy.Channel(sctx, nslots=4, slot_size=16, comp_size=16) as ch:
        for i in range(4):
            ch.send(pattern(i, 16), tag=i, timeout=0)
        with pytest.raises(ChannelFullError, match="full"):
            ch.send(pattern(4, 16), tag=4, timeout=0)
        with pytest.raises(ChannelTimeoutError):
            ch.send(pattern(4, 16), tag=4, timeout=20e-6)  # one C call
        assert ch.poll() is None
        with pytest.raises(ChannelTimeoutError):
            ch.recv(timeout=0.005)
        with pytest.raises(ChannelTimeoutError):
            ch.wait_attached(timeout=0.001)
        assert ch.stats()["full_waits"] == 2
        h = ch._sim_consumer(check=True, complete=True)
        ch.send(pattern(4, 16), tag=4, timeout=5)     # unblocked by the consumer
        assert ch.recv_many(4, timeout=5) == 4 and ch.recv(timeout=5)
        st = ch.shutdown()
        assert st["final_consumed"] == 5
        assert ch._sim_join(h)[:2] == (5, 0)
        with pytest.raises(ChannelClosedError):
            ch.send(b"x")


@pytest.mark.parametrize("drain", [True, False])
def test_shutdown_with_messages_in_flight(sctx, drain):
    with gdrpy.Channel(sctx, nslots=16, slot_size=32, comp_size=16) as ch:
        for i in range(10):
            ch.send(pattern(i, 32), tag=i)
        # attached at once, consuming only after 50 ms: all 10 are in flight
        h = ch._sim_consumer(check=True, complete=False, start_delay=0.05)
        st = ch.shutdown(drain=drain, timeout=5)
        consumed, errors, _ = ch._sim_join(h)
        assert errors == 0 and st["status"] == "stopped" and st["sent"] == 10
        if drain:
            assert consumed == 10 and st["final_consumed"] == 10 and st["dropped"] == 0
        else:
            assert consumed == 0 and st["dropped"] == 10


def test_shutdown_timeout_then_retry(sctx):
    ch = gdrpy.Channel(sctx, nslots=4, slot_size=16)
    h = ch._sim_consumer(check=False, complete=False, start_delay=0.3)
    with pytest.raises(ChannelTimeoutError):
        ch.shutdown(timeout=0.001)
    assert ch.shutdown(timeout=5)["status"] == "stopped"
    ch._sim_join(h)
    ch.close()
    ch.close()                                   # idempotent
    with pytest.raises(ClosedError):
        ch.send(b"x")


def test_kernel_watchdog_stop_fails_waits_fast(sctx):
    with gdrpy.Channel(sctx, nslots=4, slot_size=16) as ch:
        h = ch._sim_consumer(check=False, complete=False, idle_timeout=0.02)
        ch._sim_join(h)
        assert ch.stats()["status"] == "timeout"
        with pytest.raises(ChannelClosedError, match="stopped"):
            ch.recv(timeout=None)


def _wait_in_thread(call, out):
    """Runs call() in a thread; out gets (what happened, monotonic end time)."""
    def run():
        try:
            call()
            what = "returned"
        except GdrError as e:
            what = type(e).__name__
        out.append((what, time.monotonic()))
    t = threading.Thread(target=run)
    t.start()
    return t


def _until_waiting(ch: gdrpy.Channel) -> None:
    """Until another thread's call on ch waits without the GIL (10 s at most)."""
    deadline = time.monotonic() + 10
    while ch._calls_inside == 0:
        assert time.monotonic() < deadline, "the other thread never started waiting"
        time.sleep(0.001)


def test_close_from_another_thread_ends_a_waiting_recv_first(sctx):
    """close() while another thread waits in recv() without the GIL: the
    shutdown ends the wait, and close() frees the channel only after the
    waiter has left it (it used to free it under the wait: a heap
    use-after-free that ASan reports, see the CI sanitizer stage)."""
    for _ in range(20):
        ch = gdrpy.Channel(sctx, nslots=8, slot_size=16)
        h = ch._sim_consumer(check=False, complete=False, idle_timeout=5.0)
        ch.send(b"abcd")
        out: list = []
        t = _wait_in_thread(lambda ch=ch: ch.recv(timeout=5.0), out)
        _until_waiting(ch)
        ch.close(timeout=2.0)
        closed_at = time.monotonic()
        t.join(10)
        ch._sim_join(h)
        assert ch.closed
        assert out and out[0][0] == "ChannelClosedError"
        assert out[0][1] <= closed_at, "close() returned while recv() was still inside"
        with pytest.raises(ClosedError):
            ch.recv(timeout=0)


def test_close_waits_bounded_for_a_wait_that_cannot_end(sctx, monkeypatch):
    """No kernel ever attached: nothing ends another thread's send() wait on
    a full ring, so close() gives up after GDRPY_BUSY_WAIT_MS with
    BusyError and leaves the channel open; once the wait times out, close()
    works."""
    monkeypatch.setenv("GDRPY_BUSY_WAIT_MS", "200")
    ch = gdrpy.Channel(sctx, nslots=2, slot_size=16)
    ch.send(b"a", timeout=0)
    ch.send(b"b", timeout=0)
    out: list = []
    t = _wait_in_thread(lambda: ch.send(b"c", timeout=3.0), out)
    _until_waiting(ch)
    # ... and inside the library's wait, past the check of the shutdown that
    # close() is about to request: the send's first wait (with the GIL) and
    # its second (without) each count one full_wait.  Under load the thread
    # can be counted as inside and still not be there yet; it then sees the
    # shutdown and leaves at once (ChannelClosedError), as it should.
    deadline = time.monotonic() + 10
    while ch.stats()["full_waits"] < 2:
        assert time.monotonic() < deadline, "the send never waited without the GIL"
        time.sleep(0.001)
    with pytest.raises(BusyError, match="still waiting"):
        ch.close(timeout=0.1)
    assert not ch.closed
    t.join(10)
    assert out and out[0][0] == "ChannelTimeoutError"
    ch.close()
    assert ch.closed


def test_context_cannot_unmap_under_an_open_channel(sctx):
    ch = gdrpy.Channel(sctx, nslots=4, slot_size=16)
    with pytest.raises(BusyError):
        sctx.close()
    with pytest.raises(BusyError):
        ch.mapping.close()
    ch.close()
    sctx.close()


def test_bad_arguments(sctx):
    with pytest.raises(InvalidArgumentError, match="power of two"):
        gdrpy.Channel(sctx, nslots=3)
    with pytest.raises(InvalidArgumentError):
        gdrpy.Channel(sctx, slot_size=0)
    small = gdrpy.memory.alloc(4096, ctx=sctx)
    with pytest.raises(InvalidArgumentError, match="needs"):
        gdrpy.Channel(sctx, nslots=64, slot_size=64, buffer=small)
    small.close()
    with gdrpy.Channel(sctx, nslots=4, slot_size=16) as ch:
        with pytest.raises(InvalidArgumentError, match="do not fit"):
            ch.send(b"x" * 17)
        with pytest.raises(TypeError):
            ch.send(b"x", timeout="1")
        with pytest.raises(InvalidArgumentError):
            ch.send(b"x", timeout=-1)
        with pytest.raises(TypeError):
            ch.send(12345)
        assert len(ch.desc) == 64
    assert gdrpy.Channel.device_bytes(4, 16, plain=True) == 128 + 4 * 64
    # LL: 2 header words + 4 data words = 48 B -> a 64-byte slot; 200 B: 18
    # LL words (144 B, to the next 64-byte line: 192) + a 200-byte plain area -> 448
    assert gdrpy.Channel.device_bytes(4, 16) == 128 + 4 * 64
    assert gdrpy.Channel.device_bytes(4, 200) == 128 + 4 * 448


def test_put_many_checks_every_range_first(sctx):
    buf = gdrpy.memory.alloc(4096, ctx=sctx)
    with sctx.pin(buf) as pin, pin.map() as m:
        m.write(0, bytes(4096))
        with pytest.raises(OutOfRangeError):
            m.put_many([(0, b"hello"), (4095, b"ab")])
        assert m.read(0, 5) == bytes(5)                       # nothing written
        assert gdrpy.put_many(m, [(0, b"hello"), (100, np.arange(4, dtype=np.uint8)),
                                  (4095, b"z")]) == 10
        assert m.read(0, 5) == b"hello" and m.read(100, 4) == bytes([0, 1, 2, 3])
        assert m.read(4095, 1) == b"z"
        assert m.put_many([]) == 0
        with pytest.raises(TypeError):
            m.put_many([(0, 5)])
    buf.close()


class _ClosesWhenCompared(float):
    """A timeout whose conversion (``timeout < 0``) closes ``target`` first:
    Python code that runs inside a call, as a user type's method or a
    finalizer can, and as another thread could."""
    target = None

    def __lt__(self, other):
        self.target.close()
        return float(self) < other


class _ClosesWhenIndexed:
    """An index whose conversion closes ``target`` first."""
    def __init__(self, target, v):
        self.target, self.v = target, v

    def __index__(self):
        self.target.close()
        return self.v


class _ClosesWhenTested:
    """A ``drain`` flag whose truth test closes ``target`` first."""
    def __init__(self, target):
        self.target = target

    def __bool__(self):
        self.target.close()
        return True


_CLOSING_CALLS = {
    "send_bytes": lambda ch, t: ch.send(b"x", timeout=t),
    "send_buffer": lambda ch, t: ch.send(bytearray(b"x"), timeout=t),
    "send_many": lambda ch, t: ch.send_many([b"x"], timeout=t),
    "recv": lambda ch, t: ch.recv(timeout=t),
    "recv_into_bytearray": lambda ch, t: ch.recv_into(bytearray(16), timeout=t),
    "recv_many": lambda ch, t: ch.recv_many(1, timeout=t),
    "recv_many_count": lambda ch, t: ch.recv_many(_ClosesWhenIndexed(ch, 1)),
    "slot_offset": lambda ch, t: ch.slot_offset(_ClosesWhenIndexed(ch, 0)),
    "wait_attached": lambda ch, t: ch.wait_attached(timeout=t),
    "shutdown": lambda ch, t: ch.shutdown(timeout=t),
    "shutdown_drain": lambda ch, t: ch.shutdown(drain=_ClosesWhenTested(ch)),
}


@pytest.mark.parametrize("call", sorted(_CLOSING_CALLS))
def test_an_argument_whose_conversion_closes_the_channel_gives_closed_error(sctx, call):
    """Every argument is converted before the channel's last readiness
    check, so a conversion that closes the channel ends the call with
    ClosedError (not a C call on the freed channel: "channel is NULL")."""
    ch = gdrpy.Channel(sctx, nslots=4, slot_size=16)
    t = _ClosesWhenCompared(1.0)
    t.target = ch
    with pytest.raises(ClosedError):
        _CLOSING_CALLS[call](ch, t)


def test_close_converts_its_timeout_before_its_checks(sctx):
    """close()'s timeout conversion may run Python code: one that takes a
    host_block() view makes the close refuse (BusyError, nothing freed
    under the view); one that closes the channel itself leaves the outer
    close nothing to do."""
    ch = gdrpy.Channel(sctx, nslots=4, slot_size=16)
    views = []

    class TakesAView(float):
        def __lt__(self, other):
            views.append(np.frombuffer(ch.host_block(), dtype=np.uint8))
            return float(self) < other

    with pytest.raises(BusyError, match="live buffer"):
        ch.close(timeout=TakesAView(1.0))
    assert views[0][:8].tolist() == [0] * 8     # still the channel's, still readable
    views.clear()
    t = _ClosesWhenCompared(1.0)
    t.target = ch
    ch.close(timeout=t)
    assert ch.closed


def test_put_many_index_that_unmaps_is_refused(sctx):
    """put_many converts every offset and exports every buffer first, then
    looks at the mapping once more: an offset whose conversion unmaps it
    ends in ClosedError, nothing stored through the unmapped range."""
    buf = gdrpy.memory.alloc(4096, ctx=sctx)
    with sctx.pin(buf) as pin:
        m = pin.map()
        with pytest.raises(ClosedError):
            m.put_many([(0, b"a" * 64), (_ClosesWhenIndexed(m, 64), b"b" * 64)])
        assert m.closed
        with pin.map() as m2:
            assert m2.read(0, 128) == bytes(128)
    buf.close()


# ---- near slots (GDRPY_CHAN_NEAR) --------------------------------------------------


def ring_words(ch: gdrpy.Channel) -> np.ndarray:
    """The device block as u64 words, read through the mapping (sim: host memory)."""
    return np.frombuffer(ch.mapping, dtype=np.uint64)


def near_slots(n: int, stride: int) -> int:
    """Physical slots of a near ring: twice nslots, and at least 64 KiB of them."""
    return max(2 * n, -(-65536 // stride))


def test_near_channel_has_twice_the_slots_and_a_table():
    for plain in (False, True):
        for n, size in ((32, 100), (256, 4096)):
            one = gdrpy.Channel.device_bytes(nslots=n, slot_size=size, plain=plain)
            near = gdrpy.Channel.device_bytes(nslots=n, slot_size=size, plain=plain, near=True)
            stride = (one - 128) // n
            np_ = near_slots(n, stride)
            # the slots, then np_ u32 (rounded up to 64 bytes)
            assert near == 128 + np_ * stride + -(-4 * np_ // 64) * 64, (plain, n, size)
        assert near_slots(256, stride) == 512
    with pytest.raises(InvalidArgumentError, match="at most 65536"):
        gdrpy.Channel.device_bytes(nslots=1 << 17, slot_size=8, near=True)


@pytest.mark.parametrize("plain", [False, True], ids=["LL", "PLAIN"])
def test_near_channel_sends_wait_for_the_kernel_and_use_only_its_slots(sctx, plain):
    with gdrpy.Channel(sctx, nslots=8, slot_size=64, comp_size=16, plain=plain, near=True) as ch:
        d = ch.device_pointers()
        assert ch.near and d["place_nslots"] == near_slots(8, d["slot_stride"]) > 16
        with pytest.raises(ChannelFullError, match="no kernel has attached yet"):
            ch.send(b"abcd", timeout=0)
        with pytest.raises(ChannelTimeoutError, match="near-slot"):
            ch.send_many([b"abcd"], timeout=0.002)
        assert ch.stats()["sent"] == 0
        with pytest.raises(GdrError, match="once the kernel has attached"):
            ch.slot_offset(0)
        h = ch._sim_consumer(check=True, complete=True)
        ch.wait_attached(timeout=5)
        stride = ch.device_pointers()["slot_stride"]
        assert [ch.slot_offset(i) for i in range(10)] == [(2 * (i % 8) + 1) * stride
                                                          for i in range(10)]
        for i in range(40):
            ch.send(pattern(i, 1 + i % 64), tag=i, timeout=5)
            r = np.frombuffer(ch.recv(timeout=5), dtype=COMP)[0]
            assert int(r["seq"]) == i + 1
        st = ch.shutdown()
        assert st["final_consumed"] == 40 and ch._sim_join(h) == (40, 0, 2**64 - 1)
        words = ring_words(ch)
        used = {2 * k + 1 for k in range(8)}  # the sim consumer's table
        for p in range(d["place_nslots"]):  # no other physical slot was written
            slot = words[(128 + p * stride) // 8:(128 + (p + 1) * stride) // 8]
            assert bool(slot.any()) == (p in used), f"physical slot {p}"
        del words, slot


def stand_in_kernel(ch: gdrpy.Channel, table: list[int] | None) -> None:
    """Attach as a kernel would: the slot table and PLACED (when given), then RUNNING."""
    hb = np.frombuffer(ch.host_block(), dtype=np.uint32)
    if table is not None:
        d = ch.device_pointers()
        start = (128 + d["comp_nslots"] * d["comp_stride"]) // 4
        hb[start:start + len(table)] = table
        hb[80 // 4] = 1
    hb[64 // 4] = 1  # GDRPY_CHAN_ST_RUNNING


def test_near_channel_without_a_choice_uses_the_first_slots(sctx):
    """A kernel that attaches without choosing (not the header's attach)."""
    with gdrpy.Channel(sctx, nslots=4, slot_size=8, near=True) as ch:
        stand_in_kernel(ch, None)
        ch.wait_attached(timeout=1)
        stride = ch.device_pointers()["slot_stride"]
        assert [ch.slot_offset(i) for i in range(4)] == [i * stride for i in range(4)]
        hb = np.frombuffer(ch.host_block(), dtype=np.uint32)
        hb[64 // 4] = 2  # stopped, so that close() frees the memory
        del hb           # close() refuses while a view of the host block lives


@pytest.mark.parametrize("table", [[0, 1, 2, -1], [3, 1, 3, 0]], ids=["out-of-range", "repeated"])
def test_near_channel_refuses_an_invalid_slot_table(sctx, table):
    with gdrpy.Channel(sctx, nslots=4, slot_size=8, near=True) as ch:
        np_ = ch.device_pointers()["place_nslots"]
        stand_in_kernel(ch, [np_ if p < 0 else p for p in table])  # -1: one past the last
        with pytest.raises(GdrError, match="slot table is not valid"):
            ch.wait_attached(timeout=1)
        with pytest.raises(GdrError, match="slot table is not valid"):
            ch.send(b"x", timeout=0)
        assert ch.stats()["sent"] == 0
        with pytest.raises(GdrError, match="once the kernel has attached"):
            ch.slot_offset(0)  # nothing of the refused table was taken
        np.frombuffer(ch.host_block(), dtype=np.uint32)[64 // 4] = 2


def test_the_binding_channel_takes_its_buffer_from_the_python_layer(sctx):
    # the binding allocates nothing: gdrpy.Channel (gdrpy/channel.py) does
    from gdrpy import _core
    with pytest.raises(ArgumentTypeError, match="buffer="):
        _core.Channel(sctx, nslots=4, slot_size=16)
    buf = gdrpy.memory.alloc(_core.Channel.device_bytes(4, 16), ctx=sctx)
    ch = _core.Channel(sctx, nslots=4, slot_size=16, buffer=buf)
    ch.close()
    assert not buf.closed          # the caller's buffer stays the caller's
    buf.close()
    ch = gdrpy.Channel(sctx, nslots=4, slot_size=16)
    own = ch.buffer
    assert isinstance(ch, _core.Channel) and not own.closed
    assert ch.pin_thread_near_gpu() is None    # sim: no GPU to be near
    ch.close()
    assert own.closed              # the buffer it allocated is freed with it
