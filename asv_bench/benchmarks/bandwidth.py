"""Bandwidth (GB/s from the median time of one copy) of the mapping and the
copy engine, 1 MiB and 64 MiB."""

from .common import BANDWIDTH_SIZES, Fixture, gbps
from .common import close_fixture as _close


def _unit(fn):
    fn.unit = "GB/s"
    return fn


class Bandwidth:
    params = [BANDWIDTH_SIZES]
    param_names = ["nbytes"]
    timeout = 300

    def setup(self, nbytes):
        self.f = Fixture(nbytes)

    def teardown(self, nbytes):
        _close(self)

    @_unit
    def track_write_gbps(self, nbytes):
        return gbps(nbytes, self.f.m.write, (0, self.f.src))

    @_unit
    def track_read_gbps(self, nbytes):
        return gbps(nbytes, self.f.m.read, (0, nbytes, self.f.host))

    @_unit
    def track_ce_write_gbps(self, nbytes):
        return gbps(nbytes, self.f.pin.ce_write, (0, self.f.src))

    @_unit
    def track_ce_read_gbps(self, nbytes):
        return gbps(nbytes, self.f.pin.ce_read, (0, nbytes, self.f.host))
