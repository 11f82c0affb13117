"""The hostile-input sweep: every case of :mod:`tests.misuse.cases` in its own
subprocess (``python -m tests.misuse.sweep`` from the repository root)."""
