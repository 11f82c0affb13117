"""Cases of the hostile-input sweep (``python -m tests.misuse.sweep``).

A case is a snippet of Python run in a fresh subprocess after a prelude that
opens a context (``ctx``), allocates 1 MiB (``buf``), pins (``pin``) and maps
it (``m``); the C-ABI cases get ``lib`` (libgdrapi.so.2 through ctypes), an
open ``g``, a pinned and mapped handle ``mh`` at ``va`` and helpers.  Each
case says what it expects: ``error`` (a GdrError, or a non-zero return of
the C ABI), ``ok`` (no error) or ``any`` (either, e.g. races whose outcome
depends on timing; the snippet asserts the invariants itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    name: str
    kind: str              # "py" or "c"
    code: str
    expect: str = "error"  # "error", "ok" or "any"
    env: dict[str, str] = field(default_factory=dict)


# ---- Python API -------------------------------------------------------------

_BAD = [("neg", "-1"), ("u64", "2**64"), ("i63", "2**63"), ("float", "1.5"), ("str", "'8'"),
        ("none", "None"), ("bytes", "b'x'"), ("object", "object()"), ("bool", "True"),
        ("nan", "float('nan')"), ("list", "[1]"), ("npneg", "np.int64(-5)")]

_TARGETS = [
    ("write.offset", "m.write({v}, b'x')"),
    ("read.offset", "m.read({v}, 4)"),
    ("read.n", "m.read(0, {v})"),
    ("write_u64.offset", "m.write_u64({v}, 1)"),
    ("write_u64.value", "m.write_u64(0, {v})"),
    ("read_u64.offset", "m.read_u64({v})"),
    ("ce_write.offset", "pin.ce_write({v}, b'x')"),
    ("ce_read.offset", "pin.ce_read({v}, 4)"),
    ("ce_read.n", "pin.ce_read(0, {v})"),
    ("memcpy_dtoh.dptr", "ctx.memcpy_dtoh({v}, 8)"),
    ("memcpy_dtoh.n", "ctx.memcpy_dtoh(buf.ptr, {v})"),
    ("memcpy_htod.dptr", "ctx.memcpy_htod({v}, b'x')"),
    ("open.device", "gdrpy.open({v}, BACKEND)"),
    ("pin.size", "ctx.pin(buf, size={v})"),
    ("ce_write.stream", "pin.ce_write(0, b'x', stream={v})"),
    ("put.offset", "m.transfer().put({v}, b'x')"),
    ("get.n", "m.transfer().get(0, {v})"),
    ("alloc.nbytes", "gdrpy.memory.alloc({v}, ctx=ctx)"),
]

# (target, value) pairs that are valid calls
_VALID = {("pin.size", "none"), ("ce_write.stream", "none"), ("write_u64.value", "i63")}


def _py_generated() -> list[Case]:
    out = []
    for tname, tmpl in _TARGETS:
        for vname, v in _BAD:
            exp = "ok" if (tname, vname) in _VALID else "error"
            out.append(Case(f"py.{tname}={vname}", "py", tmpl.format(v=v), exp))
    return out


_THREAD_HELPER = '''
def loop_in_thread(fn, stop):
    errs = []
    def run():
        while not stop.is_set():
            try:
                fn()
            except gdrpy.GdrError:
                pass
            except BaseException as e:
                errs.append(e)
                return
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errs
'''

_TEARDOWN = '''
stop = threading.Event()
big = np.ones(SIZE, np.uint8)
t, errs = loop_in_thread(lambda: {copy}, stop)
time.sleep(0.05)
deadline = time.monotonic() + 10
while True:
    try:
        {teardown}
        break
    except gdrpy.BusyError:
        assert time.monotonic() < deadline, "teardown still busy after 10 s"
        time.sleep(0.001)
stop.set()
t.join(10)
assert not t.is_alive(), "copy thread hung"
assert not errs, errs
'''

_COPIES = {
    "write1M": "m.write(0, big)",
    "read1M": "m.read(0, SIZE)",
    "write8": "m.write(0, b'12345678')",
    "ce_write1M": "pin.ce_write(0, big)",
    "ce_read1M": "pin.ce_read(0, SIZE)",
    "put8": "m.transfer().put(0, b'12345678')",
    "htod1M": "ctx.memcpy_htod(buf.ptr, big)",
}
_TEARDOWNS = {"mapping": "m.close()", "pin": "pin.close()", "context": "ctx.close()"}


# An index whose conversion closes the mapping: the call must notice (the
# conversion runs Python code, as a user __index__ or a collection may, and
# another thread could have unmapped meanwhile) and raise, never store or
# load through the unmapped range.
_INDEX_CLOSES = "class I:\n    def __index__(self): m.close(); return {v}\n"
_INDEX_CLOSES_CALLS = {
    "write_u64_value": "m.write_u64(0, I())",
    "write_u64_offset": "m.write_u64(I(), 1)",
    "read_u64": "m.read_u64(I())",
    "write_bytes": "m.write(I(), b'x' * 64)",
    "read": "m.read(I(), 64)",
}


def _py_named() -> list[Case]:
    c = [Case(f"py.index_closes_mapping_{name}", "py", _INDEX_CLOSES.format(v=0) + call)
         for name, call in _INDEX_CLOSES_CALLS.items()]
    c += [
        Case("py.channel_close_with_host_block_view", "py",
             "ch = gdrpy.Channel(ctx, nslots=4, slot_size=16)\n"
             "v = memoryview(ch.host_block())\n"
             "ch.close()"),
        Case("py.channel_host_block_after_close", "py",
             "ch = gdrpy.Channel(ctx, nslots=4, slot_size=16)\n"
             "hb = ch.host_block()\n"
             "ch.close()\n"
             "memoryview(hb)"),
        Case("py.channel_sim_join_twice", "py",
             "ch = gdrpy.Channel(ctx, nslots=4, slot_size=16)\n"
             "h = ch._sim_consumer(check=False)\n"
             "ch.shutdown()\n"
             "ch._sim_join(h)\n"
             "ch._sim_join(h)"),
        # issue 45: a channel's hold on its pin is released once, whatever the
        # order of closes; a mapping's teardown still waits for copies after
        Case("py.channel_close_twice_then_teardown", "py",
             "for _ in range(20):\n"
             "    ch = gdrpy.Channel(ctx, nslots=4, slot_size=16)\n"
             "    ch.close(); ch.close()\n"
             "m.close(); pin.close(); ctx.close(); assert ctx.closed", "ok"),
        Case("py.ctx_close_with_channel_alive", "py",
             "ch = gdrpy.Channel(ctx, nslots=4, slot_size=16)\n"
             "try:\n    ctx.close()\nfinally:\n    ch.close(); ch.close()\n"
             "ctx.close(); assert ctx.closed", "any"),
        Case("py.channels_beside_copies_and_unmap", "py",
             "stop = threading.Event()\n"
             "def copy():\n"
             "    while not stop.is_set():\n"
             "        try:\n            m.write(0, b'x' * 4096)\n"
             "        except gdrpy.GdrError:\n            return\n"
             "t = threading.Thread(target=copy, daemon=True); t.start()\n"
             "for _ in range(20):\n"
             "    ch = gdrpy.Channel(ctx, nslots=4, slot_size=16); ch.close()\n"
             "m.close(); stop.set(); t.join(10); assert not t.is_alive()\n"
             "pin.close(); ctx.close(); assert ctx.closed", "ok"),
        Case("py.use_after_unmap", "py", "m.close(); m.write(0, b'x')"),
        Case("py.use_after_unpin", "py", "pin.close(); pin.ce_write(0, b'x')"),
        Case("py.map_after_unpin", "py", "pin.close(); pin.map()"),
        Case("py.use_after_ctx_close", "py", "ctx.close(); m.read(0, 1)"),
        Case("py.pin_after_ctx_close", "py", "ctx.close(); ctx.pin(buf)"),
        Case("py.asarray_closed_mapping", "py", "m.close(); np.asarray(m)"),
        Case("py.memoryview_closed_mapping", "py", "m.close(); memoryview(m)"),
        Case("py.close_with_view_alive", "py", "v = np.asarray(m); m.close()"),
        Case("py.ctx_close_with_view_alive", "py", "v = memoryview(m); ctx.close()"),
        Case("py.double_close", "py", "m.close(); m.close(); pin.close(); pin.close(); "
             "ctx.close(); ctx.close()", "ok"),
        Case("py.free_buffer_while_pinned", "py", "buf.close(); m.write(0, b'x'); "
             "assert m.read(0, 1) == b'x'", "ok"),
        Case("py.write_past_end", "py", "m.write(SIZE - 1, b'xy')"),
        Case("py.read_past_end", "py", "m.read(SIZE, 1)"),
        Case("py.write_noncontiguous", "py", "m.write(0, np.zeros(16)[::2])"),
        Case("py.read_into_readonly", "py",
             "r = np.zeros(8, np.uint8); r.flags.writeable = False; m.read(0, 8, out=r)"),
        Case("py.read_into_bytes", "py", "m.read(0, 4, out=b'xxxx')"),
        Case("py.read_into_short", "py", "m.read(0, 8, out=bytearray(4))"),
        Case("py.write_not_buffer", "py", "m.write(0, 12345)"),
        Case("py.write_u64_unaligned", "py", "m.write_u64(3, 1)"),
        Case("py.ce_read_huge_no_out", "py", "pin.ce_read(0, 2**40)"),
        Case("py.memcpy_dtoh_huge", "py", "ctx.memcpy_dtoh(buf.ptr, 2**40)"),
        Case("py.memcpy_dtoh_wrap", "py", "ctx.memcpy_dtoh(2**64 - 8, 64)"),
        Case("py.backend_nul", "py", "gdrpy.open(0, BACKEND + '\\0x')"),
        Case("py.backend_unknown", "py", "gdrpy.open(0, 'bogus')"),
        Case("py.backend_type", "py", "gdrpy.open(0, 3)"),
        Case("py.device_absent", "py", "gdrpy.open(4096, BACKEND)"),
        Case("py.env_backend_bogus", "py", "gdrpy.open()", "error", {"GDRPY_BACKEND": "bogus"}),
        Case("py.env_backend_explicit_wins", "py",
             "c2 = gdrpy.open(0, BACKEND); assert c2.backend != 'bogus'; c2.close()", "ok",
             {"GDRPY_BACKEND": "bogus"}),
        Case("py.env_copy_isa_bogus", "py", "m.write(0, b'x'); assert m.read(0, 1) == b'x'",
             "ok", {"GDRPY_COPY_ISA": "bogus"}),
        Case("py.set_copy_isa_bogus", "py", "gdrpy.set_copy_isa('bogus')"),
        Case("py.set_copy_isa_nul", "py", "gdrpy.set_copy_isa('generic\\0')"),
        Case("py.stream_fake_protocol", "py",
             "class S:\n    def __cuda_stream__(self): return 'junk'\n"
             "pin.ce_write(0, b'x', stream=S())"),
        Case("py.stream_ptr_attr_only", "py",
             "class S: ptr = 0xdeadbeef\npin.ce_write(0, b'x', stream=S())"),
        Case("py.stream_raw_negative", "py", "pin.ce_write(0, b'x', stream=gdrpy.RawStream(-1))"),
        Case("py.stream_raw_default", "py",
             "pin.ce_write(0, b'x', stream=gdrpy.RawStream(0))", "ok"),
        Case("py.stream_default_values", "py",
             "for s in (0, 1, 2): pin.ce_write(0, b'x', stream=s)", "ok"),
        Case("py.put_stream_int", "py", "m.transfer().put(0, b'x', stream=0xdeadbeef)"),
        Case("py.get_stream_str", "py", "m.transfer().get(0, 8, stream='default')"),
        Case("py.pin_host_address", "py", "ctx.pin(12345, size=10)"),
        Case("py.pin_bytearray", "py", "ctx.pin(bytearray(10))"),
        Case("py.pin_numpy", "py", "ctx.pin(np.zeros(10))"),
        Case("py.pin_bool", "py", "ctx.pin(True, size=8)"),
        Case("py.map_twice", "py", "pin.map()"),
        Case("py.mapping_ctor", "py", "gdrpy.Mapping()"),
        Case("py.fork_child_objects", "py", _FORK_CHILD.format(body=(
            "try:\n            m.write(0, b'x')\n            bad = 1\n        except "
            "gdrpy.WrongProcessError:\n            bad = 0")), "ok"),
        Case("py.fork_child_prefork_view", "py", _FORK_CHILD.format(body=(
            "bad = int(bytes(v[:6]) != bytes(6)); v[:3] = 7")) +
             "\nassert bytes(v[:6]) == b'secret'", "ok"),
        Case("py.fork_child_new_context", "py", _FORK_CHILD.format(body=(
            "bad = 0\n        if BACKEND == 'sim':  # CUDA cannot be used in a forked child\n"
            "            c2 = gdrpy.open(0, BACKEND); b2 = gdrpy.memory.alloc(65536, ctx=c2)\n"
            "            with c2.pin(b2) as p2, p2.map() as m2:\n"
            "                m2.write(0, b'child')\n"
            "                bad = int(m2.read(0, 5) != b'child')")), "ok"),
        Case("py.fork_child_buffer", "py", _FORK_CHILD.format(body=(
            "try:\n            buf.ptr\n            bad = 1\n        except "
            "gdrpy.WrongProcessError:\n            bad = 0")), "ok"),
    ]
    for cname, copy in _COPIES.items():
        for tname, td in _TEARDOWNS.items():
            c.append(Case(f"py.teardown_{tname}_during_{cname}", "py",
                          _THREAD_HELPER + _TEARDOWN.format(copy=copy, teardown=td), "ok"))
    return c


_FORK_CHILD = '''
m.write(0, b'secret')
v = np.asarray(m)
pid = os.fork()
if pid == 0:
    bad = 99
    try:
        {body}
    finally:
        os._exit(bad)
_, st = os.waitpid(pid, 0)
assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, f"child status {{st:#x}}"
'''

# ---- C ABI (libgdrapi.so.2 through ctypes) -------------------------------------

_C_ERR = [
    ("close_null", "RC = lib.gdr_close(None)"),
    ("close_bogus", "RC = lib.gdr_close(ctypes.addressof(junk))"),
    ("close_twice", ("lib.gdr_unmap(g, mh, va, MB); lib.gdr_unpin_buffer(g, mh); "
     "lib.gdr_close(g); RC = lib.gdr_close(g)")),
    ("pin_null_g", "RC = lib.gdr_pin_buffer(None, d2, MB, 0, 0, ctypes.byref(h2))"),
    ("pin_bogus_g", ("RC = lib.gdr_pin_buffer(ctypes.addressof(junk), d2, MB, 0, 0, "
     "ctypes.byref(h2))")),
    ("pin_size0", "RC = lib.gdr_pin_buffer(g, d2, 0, 0, 0, ctypes.byref(h2))"),
    ("pin_addr0", "RC = lib.gdr_pin_buffer(g, 0, MB, 0, 0, ctypes.byref(h2))"),
    ("pin_null_out", "RC = lib.gdr_pin_buffer(g, d2, MB, 0, 0, None)"),
    ("pin_token", "RC = lib.gdr_pin_buffer(g, d2, MB, 7, 0, ctypes.byref(h2))"),
    ("pin_v2_flags", "RC = lib.gdr_pin_buffer_v2(g, d2, MB, 0xf0, ctypes.byref(h2))"),
    ("pin_host_memory", ("RC = lib.gdr_pin_buffer(g, ctypes.addressof(junk), 4096, 0, 0, "
     "ctypes.byref(h2))")),
    ("pin_wraps", "RC = lib.gdr_pin_buffer(g, 2**64 - 4096, 8192, 0, 0, ctypes.byref(h2))"),
    ("pin_after_close", ("lib.gdr_close(g); RC = lib.gdr_pin_buffer(g, d2, MB, 0, 0, "
     "ctypes.byref(h2))")),
    ("map_bogus_handle", "RC = lib.gdr_map(g, MH(0x1234567800000001), ctypes.byref(p2), MB)"),
    ("map_zero_handle", "RC = lib.gdr_map(g, MH(0), ctypes.byref(p2), MB)"),
    ("map_null_out", "RC = lib.gdr_map(g, mh2, None, MB)"),
    ("map_size0", "RC = lib.gdr_map(g, mh2, ctypes.byref(p2), 0)"),
    ("map_size_big", "RC = lib.gdr_map(g, mh2, ctypes.byref(p2), 2 * MB)"),
    ("map_flags", "RC = lib.gdr_map_v2(g, mh2, ctypes.byref(p2), MB, 9)"),
    ("map_twice", "RC = lib.gdr_map(g, mh, ctypes.byref(p2), MB)"),
    ("map_unaligned_pin", ("lib.gdr_pin_buffer(g, d2 + 4096, 4096, 0, 0, ctypes.byref(h3)); "
     "RC = lib.gdr_map(g, h3, ctypes.byref(p2), 4096)")),
    ("map_other_gdr", "g2 = lib.gdr_open(); RC = lib.gdr_map(g2, mh2, ctypes.byref(p2), MB)"),
    ("unmap_not_mapped", "RC = lib.gdr_unmap(g, mh2, va, MB)"),
    ("unmap_wrong_va", "RC = lib.gdr_unmap(g, mh, va + 4096, MB)"),
    ("unmap_wrong_size", "RC = lib.gdr_unmap(g, mh, va, 4096)"),
    ("unmap_twice", "lib.gdr_unmap(g, mh, va, MB); RC = lib.gdr_unmap(g, mh, va, MB)"),
    ("unmap_bogus_handle", "RC = lib.gdr_unmap(g, MH(0xffffffff), va, MB)"),
    ("unpin_bogus", "RC = lib.gdr_unpin_buffer(g, MH(0x0000000500000003))"),
    ("unpin_twice", "lib.gdr_unpin_buffer(g, mh2); RC = lib.gdr_unpin_buffer(g, mh2)"),
    ("unpin_other_gdr", "g2 = lib.gdr_open(); RC = lib.gdr_unpin_buffer(g2, mh2)"),
    ("copy_to_bogus", "RC = lib.gdr_copy_to_mapping(MH(0x77), va, host, 8)"),
    ("copy_from_bogus", "RC = lib.gdr_copy_from_mapping(MH(0x77), host, va, 8)"),
    ("copy_to_after_unmap", ("lib.gdr_unmap(g, mh, va, MB); "
     "RC = lib.gdr_copy_to_mapping(mh, va, host, 8)")),
    ("copy_from_after_unpin", ("lib.gdr_unmap(g, mh, va, MB); lib.gdr_unpin_buffer(g, mh); "
     "RC = lib.gdr_copy_from_mapping(mh, host, va, 8)")),
    ("copy_after_close", "lib.gdr_close(g); RC = lib.gdr_copy_to_mapping(mh, va, host, 8)"),
    ("copy_before_va", "RC = lib.gdr_copy_to_mapping(mh, va - 1, host, 8)"),
    ("copy_past_end", "RC = lib.gdr_copy_to_mapping(mh, va + MB - 4, host, 8)"),
    ("copy_huge", "RC = lib.gdr_copy_to_mapping(mh, va, host, 2**63)"),
    ("copy_null_host", "RC = lib.gdr_copy_to_mapping(mh, va, None, 8)"),
    ("copy_other_mapping_ptr", "RC = lib.gdr_copy_to_mapping(mh2, va, host, 8)"),
    ("copy_stale_generation", ("lib.gdr_unmap(g, mh, va, MB); lib.gdr_unpin_buffer(g, mh); "
     "lib.gdr_pin_buffer(g, d, MB, 0, 0, ctypes.byref(h3)); "
     "RC = lib.gdr_copy_to_mapping(mh, va, host, 8)")),
    ("info_null", "RC = lib.gdr_get_info_v2(g, mh, None)"),
    ("info_bogus", "RC = lib.gdr_get_info_v2(g, MH(99), ctypes.byref(info))"),
    ("info_v1_bogus", "RC = lib.gdr_get_info(g, MH(99), ctypes.byref(info))"),
    ("attr_unknown", "RC = lib.gdr_get_attribute(g, 99, ctypes.byref(iv))"),
    ("attr_null", "RC = lib.gdr_get_attribute(g, 1, None)"),
    ("attr_bogus_g", "RC = lib.gdr_get_attribute(ctypes.addressof(junk), 1, ctypes.byref(iv))"),
    ("type_string_bad", "RC = lib.gdr_get_mapping_type_string(9, ctypes.byref(cp))"),
    ("type_string_null", "RC = lib.gdr_get_mapping_type_string(1, None)"),
    ("driver_version_null", "RC = lib.gdr_driver_get_version(g, None, None)"),
    # issue 45: gdr_map never maps more than gdr_get_info reports
    ("map_past_info_size", ("lib.gdr_get_info_v2(g, mh2, ctypes.byref(info)); "
     "ms = int.from_bytes(info.raw[8:16], 'little'); "
     "RC = lib.gdr_map(g, mh2, ctypes.byref(p2), ms + 1)")),
    ("copy_past_info_size", ("lib.gdr_get_info_v2(g, mh, ctypes.byref(info)); "
     "ms = int.from_bytes(info.raw[8:16], 'little'); "
     "RC = lib.gdr_copy_to_mapping(mh, va + ms - 4, host, 8)")),
    ("callback_flag_null", "RC = lib.gdr_get_callback_flag(g, mh, None)"),
    ("callback_flag_bogus", "RC = lib.gdr_get_callback_flag(g, MH(5), ctypes.byref(iv))"),
]

_C_OK = [
    ("copy_size0", "RC = lib.gdr_copy_to_mapping(mh, va, None, 0)"),
    ("unpin_while_mapped", ("RC = lib.gdr_unpin_buffer(g, mh); "
     "assert lib.gdr_copy_to_mapping(mh, va, host, 8) != 0")),
    ("close_with_live_pins", "RC = lib.gdr_close(g)"),
    ("open_close_many", ("hs = [lib.gdr_open() for _ in range(50)]\n"
     "assert all(hs)\nRC = sum(lib.gdr_close(x) for x in hs)")),
    # issue 45: the reported range is the mapped one, to its last byte
    ("map_and_copy_to_info_size", ("lib.gdr_get_info_v2(g, mh2, ctypes.byref(info))\n"
     "iva = int.from_bytes(info.raw[0:8], 'little'); ms = int.from_bytes(info.raw[8:16], "
     "'little')\nassert iva <= d2 and iva + ms >= d2 + MB, (hex(iva), ms)\n"
     "assert lib.gdr_map(g, mh2, ctypes.byref(p2), ms) == 0\n"
     "assert lib.gdr_copy_to_mapping(mh2, p2.value + ms - 8, host, 8) == 0\n"
     "RC = lib.gdr_unmap(g, mh2, p2, ms)")),
    ("roundtrip", ("ctypes.memmove(host, b'abcdefgh', 8)\n"
     "lib.gdr_copy_to_mapping(mh, va, host, 8)\n"
     "out = ctypes.create_string_buffer(8); lib.gdr_copy_from_mapping(mh, out, va, 8)\n"
     "assert out.raw == b'abcdefgh'; RC = 0")),
]

_C_RACE = '''
stop = threading.Event()
results = []
def copier():
    n = 0
    while not stop.is_set():
        rc = lib.{fn}(mh, {args}, MB)
        assert rc in (0, 22), rc       # 0 or EINVAL once the mapping is gone
        n += 1
        if rc:
            break
    results.append(n)
ts = [threading.Thread(target=copier, daemon=True) for _ in range({threads})]
for t in ts:
    t.start()
time.sleep({delay})
rc = {teardown}
assert rc in (0, 16), rc               # done, or EBUSY after the bounded wait
stop.set()
for t in ts:
    t.join(10)
    assert not t.is_alive(), "copy thread hung"
RC = 0
'''


def _c_cases() -> list[Case]:
    out = [Case(f"c.{n}", "c", code, "error") for n, code in _C_ERR]
    out += [Case(f"c.{n}", "c", code, "ok") for n, code in _C_OK]
    tds = {"unmap": "lib.gdr_unmap(g, mh, va, MB)", "unpin": "lib.gdr_unpin_buffer(g, mh)",
           "close": "lib.gdr_close(g)"}
    fns = {"to": ("gdr_copy_to_mapping", "va, big"), "from": ("gdr_copy_from_mapping",
                                                             "big, va")}
    for tname, td in tds.items():
        for fname, (fn, args) in fns.items():
            for threads, delay in ((1, 0.01), (4, 0.05)):
                out.append(Case(f"c.race_{tname}_during_copy_{fname}_{threads}t", "c",
                                _C_RACE.format(fn=fn, args=args, threads=threads,
                                               delay=delay, teardown=td), "ok"))
    return out


def all_cases() -> list[Case]:
    return _py_generated() + _py_named() + _c_cases()
