#!/usr/bin/env python3
"""Prints the nvrm self-test of a fresh process (routes, ABI table, cost) and
what a deliberately corrupted table does (GDRPY_NVRM_TEST_CORRUPT_ABI=1 and 2),
each in its own process; writes the reports as JSON.  A GPU-suite step
(scripts/gpu_suite.sh); exit status 1 if the self-test fails or a corrupted
table does not make the backend unavailable.

    python3 scripts/nvrm_selftest.py [--json FILE] [--runs N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CODE = "import json, gdrpy; print(json.dumps(gdrpy.nvrm_selftest(0)))"


def _report(**env: str) -> dict | None:
    e = {k: v for k, v in os.environ.items() if not k.startswith("GDRPY_NVRM_")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, env=e,
                       timeout=300)
    if r.returncode:
        raise SystemExit(f"self-test process failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the reports here")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes timed (default 5)")
    a = ap.parse_args(argv)
    runs = [_report() for _ in range(max(1, a.runs))]
    st = runs[0]
    bad = 0
    if st is None:
        print("nvrm self-test: did not run (no NVIDIA driver/GPU?)")
        return 1
    ms = sorted(r["selftest_ms"] for r in runs if r)
    t = st["table"]
    print(f"nvrm self-test: {'PASS' if st['usable'] else 'FAIL'}; driver {st['driver']}, "
          f"CUDA {st['cuda_driver']}; ABI table {t['branch']} (tag {t['tag']})")
    print(f"  cost over {len(ms)} fresh processes: median {ms[len(ms) // 2]:.2f} ms, "
          f"max {ms[-1]:.2f} ms (target <= 20 ms)")
    for r in ("A", "C"):
        rep = st["routes"][r]
        state = "ok" if rep["ok"] else f"disabled at \"{rep['step']}\": {rep['detail']}"
        print(f"  route {r}: {state}")
    if "ipc_layout" in st["routes"]["C"]:
        print(f"  route C IPC layout: {st['routes']['C']['ipc_layout']}")
    bad += not st["usable"]
    corrupt = {}
    for mode in ("1", "2"):
        c = _report(GDRPY_NVRM_TEST_CORRUPT_ABI=mode)
        corrupt[mode] = c
        ok = c is not None and not c["usable"]
        bad += not ok
        print(f"corrupted table (GDRPY_NVRM_TEST_CORRUPT_ABI={mode}): "
              f"{'unavailable (as it must be)' if ok else 'STILL USABLE'}: "
              f"{(c or {}).get('reason', '')[:300]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "corrupt": corrupt}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
