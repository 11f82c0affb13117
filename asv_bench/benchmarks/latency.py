"""Latency (median microseconds per call) per size and path.

* MappingLatency: ``Mapping.write`` / ``Mapping.read`` (the BAR1 path, CPU
  stores + sfence / streaming loads).
* CopyEngineLatency: ``Pin.ce_write`` / ``Pin.ce_read`` (cuMemcpy from C).
* TransferLatency: ``Transfer.put`` / ``Transfer.get`` with the default picker
  ("auto": whatever this host's calibration picks) and with pickers fixed to
  one path.
"""

from .common import LATENCY_SIZES, Fixture, median_us
from .common import close_fixture as _close


class MappingLatency:
    params = [LATENCY_SIZES]
    param_names = ["nbytes"]
    unit = "us"
    timeout = 180

    def setup(self, nbytes):
        self.f = Fixture(nbytes)

    def teardown(self, nbytes):
        _close(self)

    def track_write_us(self, nbytes):
        return median_us(self.f.m.write, (0, self.f.src))

    def track_read_us(self, nbytes):
        return median_us(self.f.m.read, (0, nbytes, self.f.host))


class CopyEngineLatency:
    params = [LATENCY_SIZES]
    param_names = ["nbytes"]
    unit = "us"
    timeout = 180

    def setup(self, nbytes):
        self.f = Fixture(nbytes)

    def teardown(self, nbytes):
        _close(self)

    def track_ce_write_us(self, nbytes):
        return median_us(self.f.pin.ce_write, (0, self.f.src))

    def track_ce_read_us(self, nbytes):
        return median_us(self.f.pin.ce_read, (0, nbytes, self.f.host))


class TransferLatency:
    params = [LATENCY_SIZES, ["auto", "always-mapping", "always-ce"]]
    param_names = ["nbytes", "picker"]
    unit = "us"
    timeout = 180

    def setup(self, nbytes, picker):
        self.f = Fixture(nbytes)
        self.t = self.f.transfer(picker)

    def teardown(self, nbytes, picker):
        self.t = None
        _close(self)

    def track_put_us(self, nbytes, picker):
        return median_us(self.t.put, (0, self.f.src))

    def track_get_us(self, nbytes, picker):
        return median_us(self.t.get, (0, self.f.src))
