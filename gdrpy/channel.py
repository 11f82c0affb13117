"""gdrpy.Channel: the binding's message channel (see there) with its ring's GPU
memory allocated here when no ``buffer`` is given, and the calling thread's
placement near the GPU."""

from __future__ import annotations

from . import _core, memory, numa

__all__ = ["Channel"]


class Channel(_core.Channel):
    __doc__ = _core.Channel.__doc__

    __slots__ = ()

    def _new_buffer(self, nbytes: int) -> memory.DeviceBuffer:
        """The ring's GPU memory when no ``buffer`` is given (the channel owns
        it: closing the channel frees it)."""
        return memory.alloc(nbytes, ctx=self.context)

    def pin_thread_near_gpu(self, cpu: int | None = None) -> int | None:
        """Restrict the calling thread to one CPU on the GPU's NUMA node
        (gdrpy.numa.pin_thread_near_gpu); returns the CPU or None (sim, no
        locality information)."""
        return numa.pin_thread_near_gpu(self.context, cpu)
