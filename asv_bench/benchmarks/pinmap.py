"""What pinning and mapping cost (median microseconds), 64 KiB and 64 MiB."""

import time

from .common import open_context

REPEATS = 20


class PinMap:
    params = [[64 << 10, 64 << 20]]
    param_names = ["nbytes"]
    unit = "us"
    timeout = 180

    def setup(self, nbytes):
        import gdrpy
        self.ctx = open_context()
        try:
            self.buf = gdrpy.memory.alloc(nbytes, ctx=self.ctx)
        except BaseException:
            self.ctx.close()
            raise
        # first pin/map outside the measurement (lazy driver state)
        p = self.ctx.pin(self.buf)
        p.map().close()
        p.close()

    def teardown(self, nbytes):
        # asv calls teardown also after a setup that raised (skipped benchmark)
        if getattr(self, "buf", None) is not None:
            self.buf.close()
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()

    def _cycle(self):
        pc = time.perf_counter_ns
        pin_map, unmap_unpin = [], []
        for _ in range(REPEATS):
            t0 = pc()
            p = self.ctx.pin(self.buf)
            m = p.map()
            t1 = pc()
            m.close()
            p.close()
            t2 = pc()
            pin_map.append(t1 - t0)
            unmap_unpin.append(t2 - t1)
        pin_map.sort()
        unmap_unpin.sort()
        return pin_map[REPEATS // 2] / 1e3, unmap_unpin[REPEATS // 2] / 1e3

    def track_pin_map_us(self, nbytes):
        """ctx.pin(buf) + pin.map()."""
        return self._cycle()[0]

    def track_unmap_unpin_us(self, nbytes):
        """mapping.close() + pin.close()."""
        return self._cycle()[1]
