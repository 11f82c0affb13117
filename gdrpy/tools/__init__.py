"""Tools that sit beside the library: ``info``, ``calibrate``, the benchmarks (``bench``)
and the ping-pong; reached through ``python -m gdrpy <command>``."""
