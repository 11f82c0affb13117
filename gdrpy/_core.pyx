# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Binding of libgdrpy: Context > Pin > Mapping, Transfer, Channel, host memory.

One extension module, one unit per object kind (textual includes, so Cython
sees, and inlines, across them; every C declaration is in _cgdrpy.pxd):

  _binding/common.pxi    _check, integer and buffer conversions, bounded waits
  _binding/library.pxi   version, backends, probes, copy kernels, sim allocator
  _binding/interop.pxi   other libraries' device memory and stream objects
  _binding/context.pxi   Context
  _binding/pin.pxi       Pin and its copy-engine copies
  _binding/mapping.pxi   Mapping (stores, loads, exports, vectored puts)
  _binding/hostmem.pxi   HostBuffer, Registration, host-memory kinds, staging ring
  _binding/transfer.pxi  Transfer (put/get with the path chosen per message)
  _binding/dlpack.pxi    DLPack export, host-memory views
  _binding/channel.pxi   Channel

Contract of this wrapper:

* It imports nothing of gdrpy but the leaf gdrpy.errors: what comes from the
  Python layer is handed in.  A Transfer takes its pickers and staging plan
  as arguments; Mapping.transfer() makes its Transfer through the factory
  that gdrpy.transfer installs at import (``set_transfer_factory``); a
  Channel given no buffer asks ``self._new_buffer(nbytes)``, which
  gdrpy.Channel (gdrpy/channel.py) implements.
* Every C call's status goes through ``_check()``, which raises the
  :mod:`gdrpy.errors` class for the code with libgdrpy's message.
* Objects own their C handles.  A Context tracks its pins and a Pin its
  mapping, so ``Context.close()`` unmaps and unpins in the right order; a
  child keeps its parent alive.  ``close()`` is idempotent; every other
  method of a closed object raises :class:`~gdrpy.errors.ClosedError`.
* A Mapping that still has buffer exports (memoryview / numpy views) cannot
  be unmapped: ``close()`` raises BusyError instead of leaving dangling views.
* After ``fork()`` every object of the parent raises WrongProcessError in the
  child (the child never sees the parent's memory).
* ``Mapping.write/read`` hold the GIL for small copies (tens of ns; releasing
  it would cost more) and release it from ``NOGIL_BYTES`` up; copy-engine
  copies always release it.
"""

from libc.stdint cimport uint64_t, uintptr_t
from gdrpy._cgdrpy cimport *
cimport cython

import errno as _errno
import weakref as _weakref

from gdrpy.errors import (error_for_code, GdrError, ClosedError, BusyError, WrongProcessError,
                          InvalidArgumentError, OutOfRangeError, ArgumentTypeError,
                          NotSupportedError, ChannelFullError, ChannelTimeoutError,
                          ChannelClosedError)

include "_binding/common.pxi"
include "_binding/library.pxi"
include "_binding/interop.pxi"
include "_binding/context.pxi"
include "_binding/pin.pxi"
include "_binding/mapping.pxi"
include "_binding/hostmem.pxi"
include "_binding/transfer.pxi"
include "_binding/dlpack.pxi"
include "_binding/channel.pxi"
