"""Benchmarks: ``python -m gdrpy bench latency | bandwidth | transfer | pingpong``.

Modules: :mod:`.common` (sizes, statistics, tables), :mod:`.timing` (the timing core),
:mod:`.session` (device, header, environment), :mod:`.alternatives` (cuda-python, CuPy,
PyTorch), :mod:`.native` (the C benchmark), :mod:`.plot`, one module per command
(:mod:`.latency`, :mod:`.bandwidth`, :mod:`.transfer`) and :mod:`.cli`.

Every command opens one device (``--backend``, default ``$GDRPY_BACKEND`` or
``auto``), prints one header line (backend, GPU, driver, copy kernel, CPU model,
date) and, on the ``sim`` backend, a loud note that host memory stands in for
the GPU, so that no sim number is ever mistaken for a GPU number.

Commands
--------
latency
    Per size and direction, side by side in one run: gdrpy ``Mapping.write`` /
    ``Mapping.read`` (BAR1 path), ``Transfer.put`` / ``get`` (automatic path),
    ``Pin.ce_write`` / ``ce_read`` (our C cuMemcpy path), and what a Python user
    would pick instead: cuda-python ``cuMemcpyHtoD`` / ``cuMemcpyDtoH`` from a
    numpy (pageable) buffer, CuPy ``ndarray.set`` / ``.get(out=)`` on
    ``cupy.asarray(buf)``, PyTorch ``t.copy_(pinned)`` / ``pinned.copy_(t)`` on
    a tensor over the same memory (each only where importable and on a real
    GPU backend).  ``--c`` also runs the C benchmark ``gdrpy_copylat`` and
    merges its rows (our kernel incl. sfence, with read-back, cuMemcpy from a
    pinned buffer, raw non-temporal store/load loops).
bandwidth
    GB/s (from medians) of Mapping.write/read, Pin.ce_write/ce_read and
    cuda-python cuMemcpy for large sizes; with ``--c`` our C kernel next to
    the raw non-temporal loop of the same run, and their ratio.
transfer
    Per size and direction: ``Transfer.put/get`` with the default (calibrated)
    picker next to Transfers whose pickers are fixed to "always-mapping" and
    "always-ce", measured interleaved, and the regret of the automatic choice,
    ``auto_median / min(fixed medians) - 1``.
pingpong
    Provided by :mod:`gdrpy.tools.pingpong` (imported only when present).

Methodology (printed by every run)
----------------------------------
* Clock: ``time.perf_counter_ns`` (CLOCK_MONOTONIC).  The garbage collector is
  disabled while timing.  Host buffers are numpy arrays (pageable), device
  buffers come from ``gdrpy.memory.alloc`` (sim: host memory).  In latency
  and bandwidth every method copies between the same host buffer and offset 0
  of the same device buffer, except PyTorch, which copies from/to a pinned
  host tensor as its users do; cuda-python gets the host address as an int
  (its cheapest form).
* Each method is first checked once for correctness (a pattern written by the
  method is read back through another path, or the other way round); a
  mismatch is reported in the ``ok`` column and in the JSON.
* Warm-up: an untimed first call, then up to ``--warmup`` individually timed
  calls (bounded in time); their median is the per-call estimate ``e``.
* Samples: ``--iters`` samples per method (fewer where a method would exceed
  ``--max-time`` seconds; never fewer than a handful).  For a method with
  ``e < 2 us`` one sample is a batch of ``B`` back-to-back calls (B chosen so
  that a batch takes about 10 us; ``--batch`` forces it) and the sample is the
  batch mean: this keeps the clock's own cost (~50 ns) from dominating, but
  the p99 of batch means is smoother than the p99 of single calls (the C
  benchmark, ``--c``, times every call with RDTSCP).  Slower methods are
  timed call by call (``B = 1``).  ``B`` is printed for every row.
* Drift: the methods of one size and direction are measured in interleaved
  rounds, so a change of clocks, PCIe traffic or a noisy neighbour hits all
  of them alike.  latency, bandwidth: 5 (3) rounds, each method takes a chunk
  of its samples per round after a short re-warm.  transfer: one sample of
  each variant per round, cycling through every order of the three, all with
  the same number of samples and the same B (that of the fastest); each
  variant copies between its own host and device regions, so one variant's
  cache state never lands on another (on sim, a memcpy right after
  non-temporal stores to the same lines would pay for them).
* Timer overhead is measured in the same run and printed: a back-to-back
  clock pair, an empty Python call timed alone, and the same call in a
  batch.  It is included in every number, not subtracted.
* Reported: median and p99 (nearest rank) in microseconds, also mean, min,
  max, the number of samples, B; GB/s are ``size / median``.

Output: aligned text tables (the short summary last), ``--json FILE`` (every
sample statistic and the metadata), ``--plot FILE.png`` (matplotlib, Agg).
See docs/benchmarks.md.
"""


from __future__ import annotations

from ..._sizes import format_size, parse_size, parse_sizes
from .cli import add_arguments, add_common_arguments, main
from .common import SIM_NOTE, stats
from .session import open_context, print_header
from .timing import Cfg, Op, measure_group, time_calls, timer_overhead

__all__ = ["add_arguments", "main", "add_common_arguments", "parse_size", "parse_sizes",
           "format_size", "stats", "time_calls", "timer_overhead", "SIM_NOTE",
           "open_context", "print_header", "Cfg", "Op", "measure_group"]
