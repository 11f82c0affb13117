"""asv benchmarks of gdrpy (see docs/benchmarks.md)."""
