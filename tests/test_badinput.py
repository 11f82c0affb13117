"""Bad input across the public API gives TypeError / ValueError / GdrError
with a message, never a crash; plus a property-based test that drives random
call sequences against a simple model of pins, mappings and bytes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

import gdrpy
from gdrpy import errors

BAD_ERRORS = (TypeError, ValueError, errors.GdrError)


@pytest.mark.parametrize("device", [-1, 2**40, None, "0", 1.5, True])
def test_open_rejects_bad_devices(device):
    with pytest.raises(BAD_ERRORS) as ei:
        gdrpy.open(device, "sim")
    assert str(ei.value)


@pytest.mark.parametrize("backend", ["", "cuda", "SIM", 3, None.__class__])
def test_open_rejects_bad_backends(backend):
    with pytest.raises(BAD_ERRORS) as ei:
        gdrpy.Context(0, backend)
    assert str(ei.value)


def test_open_sim_on_a_second_device_names_the_device():
    with pytest.raises(errors.GdrError) as ei:
        gdrpy.open(1, "sim")
    assert "1" in str(ei.value)


def test_auto_never_selects_sim(monkeypatch):
    monkeypatch.delenv("GDRPY_BACKEND", raising=False)
    try:
        with gdrpy.open(0, "auto") as c:
            assert c.backend != "sim"
    except errors.BackendUnavailableError as e:
        assert "sim" in str(e)  # tells the user how to get the sim backend
    except errors.DeviceNotFoundError:
        pass


def test_gdrpy_backend_env_selects_sim_and_it_is_reported(monkeypatch):
    monkeypatch.setenv("GDRPY_BACKEND", "sim")
    with gdrpy.open() as c:
        assert c.backend == "sim" and c.is_sim
        assert "host memory" in repr(c)


def test_bad_gdrpy_backend_env_is_an_error(monkeypatch):
    monkeypatch.setenv("GDRPY_BACKEND", "bogus")
    with pytest.raises(errors.InvalidArgumentError, match="bogus"):
        gdrpy.open()


@pytest.mark.parametrize("obj,size", [
    (None, None), ("abc", 10), (1.0, 10), (b"host bytes", None), (np.zeros(8), None),
    (0, 10), (12345, None), (12345, 0), (12345, -1), (12345, "8"), (2**64 + 1, 8),
    (True, 8), ([1, 2], None),
])
def test_pin_rejects_bad_objects(sim_ctx, obj, size):
    with pytest.raises(BAD_ERRORS) as ei:
        sim_ctx.pin(obj, size) if size is not None else sim_ctx.pin(obj)
    assert str(ei.value)


def test_pin_of_memory_that_is_not_device_memory_is_refused(sim_ctx):
    host = np.zeros(4096, np.uint8)
    with pytest.raises(errors.GdrError):
        sim_ctx.pin(host.ctypes.data, size=4096)


def test_pin_beyond_the_allocation_is_refused(sim_ctx):
    with gdrpy.memory.alloc(65536, ctx=sim_ctx) as buf:
        with pytest.raises(errors.GdrError):
            sim_ctx.pin(buf.ptr + 65000, size=1000)
        with pytest.raises(errors.InvalidArgumentError):
            sim_ctx.pin(buf, size=65537)


@pytest.mark.parametrize("flags", [-1, 2, 1 << 40, "1", None])
def test_pin_rejects_bad_flags(sim_ctx, flags):
    with gdrpy.memory.alloc(4096, ctx=sim_ctx) as buf, pytest.raises(BAD_ERRORS):
        sim_ctx.pin(buf, flags=flags)


@pytest.mark.parametrize("offset,data", [
    (None, b"x"), ("0", b"x"), (0.0, b"x"), (0, None), (0, "text"), (0, 5), (0, [1, 2]),
    (0, np.zeros((4, 4), np.uint8)[:, ::2]),  # non-contiguous
])
def test_write_rejects_bad_arguments(sim_ctx, offset, data):
    with gdrpy.memory.alloc(4096, ctx=sim_ctx) as buf, sim_ctx.pin(buf) as pin, pin.map() as m:
        with pytest.raises(BAD_ERRORS) as ei:
            m.write(offset, data)
        assert str(ei.value)


@pytest.mark.parametrize("offset,n,out", [
    (None, 1, None), (0, None, None), (0, "1", None), (0, 8, bytearray(4)), (0, 8, b"readonly"),
    (0, 8, "str"), (0, 8, np.zeros(16, np.uint8)[::2]),
])
def test_read_rejects_bad_arguments(sim_ctx, offset, n, out):
    with (gdrpy.memory.alloc(4096, ctx=sim_ctx) as buf, sim_ctx.pin(buf) as pin,
          pin.map() as m, pytest.raises(BAD_ERRORS)):
        m.read(offset, n, out=out)


def test_stream_argument_is_validated(sim_ctx):
    with gdrpy.memory.alloc(4096, ctx=sim_ctx) as buf, sim_ctx.pin(buf) as pin:
        for bad in ("s", 1.5, -3, object()):
            with pytest.raises(BAD_ERRORS):
                pin.ce_write(0, b"x", stream=bad)


def test_errors_pickle_with_code_and_message():
    for cls in (errors.GdrError, errors.OutOfRangeError, errors.BackendUnavailableError):
        e = cls("what happened", 34)
        e2 = pickle.loads(pickle.dumps(e))
        assert type(e2) is cls and e2.code == 34 and e2.message == "what happened"
        assert "ERANGE" in str(e2)


def test_error_classes_are_also_standard_exceptions():
    assert issubclass(errors.OutOfRangeError, ValueError)
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.ClosedError, errors.GdrError)


def test_sim_free_of_unknown_pointer_is_an_error():
    with pytest.raises(errors.InvalidArgumentError):
        gdrpy._core.sim_free(0x1234)


def test_set_copy_isa_rejects_unknown_names():
    with pytest.raises(errors.InvalidArgumentError):
        gdrpy.set_copy_isa("sse9000")
    with pytest.raises(TypeError):
        gdrpy.set_copy_isa(5)
    gdrpy.set_copy_isa("auto")


# ---------------------------------------------------------------------------
# Property-based: random sequences of operations against a model.

SIZE = 3 * 65536


class PinModel(RuleBasedStateMachine):
    """Model: the device buffer is a bytearray; each pin is a sub-range; each
    pin has at most one mapping; closed objects raise ClosedError; out of
    range copies raise OutOfRangeError and change nothing."""

    pins = Bundle("pins")

    def __init__(self):
        super().__init__()
        self.ctx = gdrpy.open(0, "sim")
        self.buf = gdrpy.memory.alloc(SIZE, ctx=self.ctx)
        self.model = bytearray(SIZE)
        self.ctx.memcpy_htod(self.buf.ptr, bytes(SIZE))
        self.mappings = {}   # pin -> Mapping
        self.closed_pins = []

    @rule(target=pins, start=st.integers(0, SIZE - 1), size=st.integers(1, 70000))
    def pin(self, start, size):
        if start + size > SIZE:
            with pytest.raises(errors.GdrError):
                self.ctx.pin(self.buf.ptr + start, size=size)
            return self.ctx.pin(self.buf.ptr, size=1)
        return self.ctx.pin(self.buf.ptr + start, size=size)

    @rule(p=pins)
    def map(self, p):
        if p in self.closed_pins:
            with pytest.raises(errors.ClosedError):
                p.map()
        elif p in self.mappings:
            with pytest.raises(errors.AlreadyMappedError):
                p.map()
        else:
            self.mappings[p] = p.map()

    @rule(p=pins)
    def unmap(self, p):
        m = self.mappings.pop(p, None)
        if m is not None:
            m.close()
            assert p.mapping is None

    @rule(p=consumes(pins))
    def unpin(self, p):
        m = self.mappings.pop(p, None)
        p.close()
        if m is not None:
            assert m.closed
            with pytest.raises(errors.ClosedError):
                m.read(0, 1)
        self.closed_pins.append(p)

    @rule(p=pins, off=st.integers(0, 70001), data=st.binary(min_size=0, max_size=300))
    def write(self, p, off, data):
        m = self.mappings.get(p)
        if m is None:
            return
        base = p.addr - self.buf.ptr
        if off + len(data) > p.size:
            with pytest.raises(errors.OutOfRangeError):
                m.write(off, data)
        else:
            m.write(off, data)
            self.model[base + off: base + off + len(data)] = data

    @rule(p=pins, off=st.integers(0, 70001), n=st.integers(0, 300))
    def read(self, p, off, n):
        m = self.mappings.get(p)
        if m is None:
            return
        base = p.addr - self.buf.ptr
        if off + n > p.size:
            with pytest.raises(errors.OutOfRangeError):
                m.read(off, n)
        else:
            assert m.read(off, n) == bytes(self.model[base + off: base + off + n])

    @precondition(lambda self: len(self.mappings) > 0)
    @rule(data=st.data())
    def device_side_agrees(self, data):
        p = data.draw(st.sampled_from(sorted(self.mappings, key=id)))
        base = p.addr - self.buf.ptr
        assert self.ctx.memcpy_dtoh(p.addr, p.size) == bytes(self.model[base:base + p.size])

    @invariant()
    def whole_buffer_matches_model(self):
        assert self.ctx.memcpy_dtoh(self.buf.ptr, SIZE) == bytes(self.model)

    def teardown(self):
        self.ctx.close()
        for m in self.mappings.values():
            assert m.closed
        self.buf.close()


TestPinModel = PinModel.TestCase
TestPinModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow])
