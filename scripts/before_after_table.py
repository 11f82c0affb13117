"""The side-by-side table of scripts/misuse_before_after.sh.

Reads the driver's log (sections ``=== round R TREE KIND`` followed by that
measurement's output: KIND ``py`` = one JSON line of before_after_py.py,
``apilat`` = gdrpy_apilat's text rows, ``copylat`` = a ``COPYLAT_JSON {...}``
line, ``open`` = gdrpy_apilat's open-under-load line) and prints, per row:

  old: median of the per-round medians [lowest .. highest round median]
  new: the same
  new/old: (new - old) / old of those medians, and the median of the paired
  per-round differences (round R's new against round R's old: the two ran
  back to back, so slow drift of the machine cancels), with how many rounds
  had new slower than old.

    python3 scripts/before_after_table.py LOG [--json OUT] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

_APILAT_ROW = re.compile(
    r"^(gdrpy_write|gdrpy_read|copy_to_mapping \((?:kernel|gdr map)\)|gdr_copy_to_mapping|"
    r"gdr_copy_from_mapping)\s+(\d+)\s+\d+\s+([\d.]+)\s+([\d.]+)\s*$")
_COPYLAT_OPS = {"to_mapping": "copylat to_mapping", "from_mapping": "copylat from_mapping",
                "gdrpy_memcpy_htod": "copylat memcpy_htod (ce)",
                "gdrpy_memcpy_dtoh": "copylat memcpy_dtoh (ce)",
                "cuMemcpyHtoD": "copylat memcpy_htod (ce)",
                "cuMemcpyDtoH": "copylat memcpy_dtoh (ce)"}


def _size(n: int) -> str:
    for unit, s in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{s}"
    return str(n)


def parse(path: str) -> tuple[dict, list, dict, dict]:
    """-> ({row: {tree: {round: ns}}}, [row order], {tree: open-under-load line},
    {key: value of the log's # META lines})."""
    data: dict = defaultdict(lambda: defaultdict(dict))
    order: list = []
    opens: dict = {}
    meta: dict = {}
    tag = None

    def put(row: str, tree: str, rnd: int, v: float) -> None:
        if row not in data:
            order.append(row)
        data[row][tree][rnd] = v

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^=== round (\d+) (\w+) (\w+)", line)
            if m:
                tag = (int(m.group(1)), m.group(2), m.group(3))
                continue
            m = re.match(r"^# META (\w+)=(.*)$", line)
            if m:
                meta[m.group(1)] = m.group(2)
                continue
            if tag is None:
                continue
            rnd, tree, kind = tag
            if kind == "py" and line.startswith("{"):
                rec = json.loads(line)
                for row, v in rec["rows"].items():
                    put(row, tree, rnd, v)
            elif kind == "apilat":
                m = _APILAT_ROW.match(line)
                if m:
                    put(f"C {m.group(1)} {m.group(2)}", tree, rnd, float(m.group(3)))
            elif kind == "copylat" and line.startswith("COPYLAT_JSON "):
                rec = json.loads(line[len("COPYLAT_JSON "):])
                for r in rec.get("results", []):
                    op = r.get("op", "").split(" (")[0]
                    if op in _COPYLAT_OPS:
                        put(f"{_COPYLAT_OPS[op]} {_size(int(r['size']))}", tree, rnd,
                            float(r["median_ns"]))
            elif kind == "open" and line.startswith("open_under_load"):
                opens[tree] = line
    return data, order, opens, meta


def own_cost(data: dict) -> list:
    """libgdrapi's own cost per size: gdr_copy_to_mapping minus the bare copy
    kernel on libgdrapi's mapping, taken within each round's process (so the
    level of that process, which moves every BAR1 row alike by up to +-15%,
    cancels); per tree the median over rounds, in ns and in % of the kernel."""
    out = []
    for row in data:
        m = re.match(r"^C gdr_copy_to_mapping (\d+)$", row)
        bare = f"C copy_to_mapping (gdr map) {m.group(1)}" if m else None
        if not m or bare not in data:
            continue
        rec: dict = {"size": int(m.group(1))}
        for tree in ("old", "new"):
            a, b = data[row].get(tree, {}), data[bare].get(tree, {})
            rs = [r for r in a if r in b and b[r] > 0]
            if rs:
                rec[tree + "_ns"] = statistics.median(a[r] - b[r] for r in rs)
                rec[tree + "_pct"] = statistics.median((a[r] - b[r]) / b[r] * 100 for r in rs)
                rec["rounds"] = len(rs)
        if "old_ns" in rec and "new_ns" in rec:
            out.append(rec)
    return out


def _fmt(v: float) -> str:
    return f"{v:.1f}" if v < 10000 else f"{v:.0f}"


def summarize(data: dict, order: list) -> list:
    out = []
    for row in order:
        old = data[row].get("old", {})
        new = data[row].get("new", {})
        if not old or not new:
            continue
        mo, mn = statistics.median(old.values()), statistics.median(new.values())
        paired = [(new[r] - old[r]) / old[r] * 100 for r in old if r in new and old[r] > 0]
        out.append({
            "row": row,
            "old_ns": mo, "old_lo": min(old.values()), "old_hi": max(old.values()),
            "new_ns": mn, "new_lo": min(new.values()), "new_hi": max(new.values()),
            "diff_pct": (mn - mo) / mo * 100 if mo > 0 else float("nan"),
            "paired_pct": statistics.median(paired) if paired else float("nan"),
            "new_slower": sum(1 for p in paired if p > 0), "rounds": len(paired),
        })
    return out


def table(rows: list) -> str:
    w = max([len(r["row"]) for r in rows] + [10])
    head = (f"{'row (ns per call)':<{w}}  {'old median [round range]':>28}  "
            f"{'new median [round range]':>28}  {'new/old':>8}  {'paired':>8}  slower")
    lines = [head]
    for r in rows:
        o = f"{_fmt(r['old_ns'])} [{_fmt(r['old_lo'])}..{_fmt(r['old_hi'])}]"
        n = f"{_fmt(r['new_ns'])} [{_fmt(r['new_lo'])}..{_fmt(r['new_hi'])}]"
        lines.append(f"{r['row']:<{w}}  {o:>28}  {n:>28}  {r['diff_pct']:>+7.1f}%  "
                     f"{r['paired_pct']:>+7.1f}%  {r['new_slower']:>2}/{r['rounds']}")
    return "\n".join(lines)


def markdown(rows: list) -> str:
    lines = ["| row (ns per call) | old | new | new/old | paired | new slower |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        old = f"{_fmt(r['old_ns'])} ({_fmt(r['old_lo'])}-{_fmt(r['old_hi'])})"
        new = f"{_fmt(r['new_ns'])} ({_fmt(r['new_lo'])}-{_fmt(r['new_hi'])})"
        lines.append(f"| {r['row']} | {old} | {new} "
                     f"| {r['diff_pct']:+.1f}% | {r['paired_pct']:+.1f}% "
                     f"| {r['new_slower']}/{r['rounds']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table instead")
    a = ap.parse_args()
    data, order, opens, meta = parse(a.log)
    rows = summarize(data, order)
    if not rows:
        print(f"no rows measured for both trees in {a.log}", file=sys.stderr)
        return 1
    if meta:
        print("  ".join(f"{k}={v}" for k, v in meta.items()))
    print("old/new: median of the per-round medians [lowest..highest round median]; "
          "new/old: of those medians; paired: median over rounds of (new-old)/old within "
          "a round; slower: rounds where new > old")
    print(markdown(rows) if a.markdown else table(rows))
    own = own_cost(data)
    for c in own:
        print(f"libgdrapi's own cost, gdr_copy_to_mapping {c['size']} B minus the bare kernel on "
              f"its mapping in the same process (median of {c['rounds']} rounds): "
              f"old {c['old_ns']:+.1f} ns ({c['old_pct']:+.1f}%), "
              f"new {c['new_ns']:+.1f} ns ({c['new_pct']:+.1f}%)")
    for tree in ("old", "new"):
        if tree in opens:
            print(f"{tree}: {opens[tree]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "own_cost": own, "open_under_load": opens},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
