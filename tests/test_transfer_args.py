"""The argument forms of put/get and Mapping.write/read, on both paths.

The hot paths recognise the common buffers (ndarray, bytearray, memoryview,
bytes) and exact ints before the general checks; these tests pin down that
every form still means what it meant, and that every bad form still gets its
GdrError subclass, whichever check catches it."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import gdrpy
from gdrpy import errors
from gdrpy.threshold import ThresholdPicker

PATHS = ["always-mapping", "always-ce"]


@pytest.fixture
def mapped(ctx, alloc):
    buf = alloc(1 << 16)
    pin = ctx.pin(buf)
    m = pin.map()
    yield buf, pin, m
    m.close()
    pin.close()


def _transfer(m, path):
    return gdrpy.Transfer(m, ThresholdPicker(h2d=path, d2h=path, identity=None, env={}))


def _sources(payload: bytes):
    a = np.frombuffer(payload, np.uint8).copy()
    return {
        "bytes": payload,
        "bytearray": bytearray(payload),
        "memoryview": memoryview(bytearray(payload)),
        "ndarray": a,
        "ndarray slice": np.concatenate([a, a])[: len(payload)],
        "ndarray uint32": np.frombuffer(payload, np.uint32).copy(),
        "read-only ndarray": np.frombuffer(payload, np.uint8),
    }


@pytest.mark.parametrize("path", PATHS)
def test_put_and_write_take_every_contiguous_buffer(alloc, mapped, path):
    buf, _, m = mapped
    t = _transfer(m, path)
    payload = bytes(range(64))
    for name, src in _sources(payload).items():
        for off in (0, 3):
            alloc.device_write(buf.ptr + off, b"\0" * 64)
            assert t.put(off, src) == 64, name
            assert alloc.device_read(buf.ptr + off, 64) == payload, (name, off)
            alloc.device_write(buf.ptr + off, b"\0" * 64)
            assert m.write(off, src) == 64, name
            assert alloc.device_read(buf.ptr + off, 64) == payload, (name, off)


@pytest.mark.parametrize("path", PATHS)
def test_get_and_read_fill_every_writable_buffer(alloc, mapped, path):
    buf, _, m = mapped
    t = _transfer(m, path)
    payload = bytes(range(100, 164))
    alloc.device_write(buf.ptr + 5, payload)
    outs = {"bytearray": bytearray(64), "memoryview": memoryview(bytearray(64)),
            "ndarray": np.zeros(64, np.uint8), "ndarray uint16": np.zeros(32, np.uint16)}
    for name, out in outs.items():
        assert t.get(5, out) is out, name
        assert bytes(out) == payload, name
    for name, out in {"bytearray": bytearray(64), "ndarray": np.zeros(64, np.uint8)}.items():
        assert m.read(5, 64, out) is out, name
        assert bytes(out) == payload, name


@pytest.mark.parametrize("path", PATHS)
def test_get_counts_in_every_integer_form(alloc, mapped, path):
    buf, _, m = mapped
    t = _transfer(m, path)
    alloc.device_write(buf.ptr + 8, b"\x05\x06\x07")
    for n in (3, np.int64(3), np.uint8(3), np.array(3), np.array(3, np.int32)):
        assert t.get(8, n) == b"\x05\x06\x07", repr(n)


@pytest.mark.parametrize("path", PATHS)
def test_bad_buffers_get_gdr_errors_and_leave_no_pending_error(alloc, mapped, path):
    buf, _, m = mapped
    t = _transfer(m, path)
    alloc.device_write(buf.ptr, b"\x11" * 64)
    strided = np.zeros(128, np.uint8)[::2]
    read_only = np.frombuffer(b"\0" * 64, np.uint8)
    cases = [
        (lambda: t.put(0, strided), errors.InvalidArgumentError, ValueError),
        (lambda: m.write(0, strided), errors.InvalidArgumentError, ValueError),
        (lambda: t.put(0, "text"), errors.ArgumentTypeError, TypeError),
        (lambda: m.write(0, 12), errors.ArgumentTypeError, TypeError),
        (lambda: t.get(0, read_only), errors.InvalidArgumentError, ValueError),
        (lambda: t.get(0, b"immutable"), errors.InvalidArgumentError, ValueError),
        (lambda: t.get(0, strided), errors.InvalidArgumentError, ValueError),
        (lambda: m.read(0, 64, read_only), errors.InvalidArgumentError, ValueError),
        (lambda: m.read(0, 64, bytearray(8)), errors.InvalidArgumentError, ValueError),
        (lambda: m.read(0, 64, np.zeros(8, np.uint8)), errors.InvalidArgumentError, ValueError),
        (lambda: t.get(0, 2.0), errors.ArgumentTypeError, TypeError),
        (lambda: t.get(0, np.array(2.0)), TypeError, TypeError),
    ]
    for i, (call, cls, builtin) in enumerate(cases):
        with pytest.raises(cls) as ei:
            call()
        assert isinstance(ei.value, builtin), (i, ei.value)
        assert sys.exc_info() == (None, None, None)
        # the next call works: no error was left pending by a fast path
        assert t.get(0, 4) == b"\x11" * 4, i
    assert alloc.device_read(buf.ptr, 64) == b"\x11" * 64   # nothing was written


@pytest.mark.parametrize("path", PATHS)
def test_offsets_and_counts_are_checked_in_every_form(alloc, mapped, path):
    _, _, m = mapped
    t = _transfer(m, path)
    for bad, cls in ((-1, errors.OutOfRangeError), (-5, errors.OutOfRangeError),
                     (1 << 70, errors.OutOfRangeError), (-(1 << 70), errors.OutOfRangeError),
                     (True, errors.ArgumentTypeError), (1.0, errors.ArgumentTypeError),
                     (None, errors.ArgumentTypeError)):
        with pytest.raises(cls):
            t.put(bad, b"x")
        with pytest.raises(cls):
            t.get(bad, 1)
        with pytest.raises(cls):
            m.write(bad, b"x")
        with pytest.raises(cls):
            m.read(bad, 1)
        with pytest.raises(cls):
            m.read(0, bad)
    for n in (-1, 1 << 70):
        with pytest.raises(errors.OutOfRangeError):
            t.get(0, n)
    assert t.put(np.int64(4), b"ab") == 2 and t.get(np.int32(4), 2) == b"ab"


def test_stream_and_mapping_path_store_from_the_first_export(alloc, mapped):
    buf, _, m = mapped
    t = _transfer(m, "always-mapping")
    src = np.arange(32, dtype=np.uint8)
    assert t.put(16, src, stream=0) == 32
    assert alloc.device_read(buf.ptr + 16, 32) == src.tobytes()
    out = np.zeros(32, np.uint8)
    assert t.get(16, out, stream=0) is out and out.tobytes() == src.tobytes()


def test_put_and_get_refuse_a_mapping_closed_meanwhile(ctx, alloc):
    buf = alloc(4096)
    pin = ctx.pin(buf)
    m = pin.map()
    t = _transfer(m, "always-mapping")
    src = np.ones(8, np.uint8)
    assert t.put(0, src) == 8
    m.close()
    for call in (lambda: t.put(0, src), lambda: t.get(0, np.zeros(8, np.uint8)),
                 lambda: t.get(0, 8), lambda: m.write(0, src), lambda: m.read(0, 8)):
        with pytest.raises(errors.ClosedError):
            call()
    pin.close()
