"""The side-by-side table of scripts/before_after.sh.

Reads the driver's log (sections ``=== round R TREE KIND`` followed by that
measurement's output: KIND ``py`` = one JSON line of before_after_py.py whose
rows are [median_ns, p99_ns], ``apilat`` = gdrpy_apilat's text rows ``method
bytes B median_ns p99_ns``) and prints, per row:

  old: median over rounds of the round medians, and of the round p99s
  new: the same
  new/old: (new - old) / old of those medians, and the median of the paired
  per-round differences (round R's new against round R's old: the two ran
  back to back, so slow drift of the machine cancels), with how many rounds
  had new slower than old
  GB/s (bandwidth rows, "bw ..."): bytes / median time, old and new.

    python3 scripts/before_after_table.py LOG [--json OUT] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

_APILAT_ROW = re.compile(r"^(\S.*?)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$")


def parse(path: str) -> tuple[dict, list, dict]:
    """-> ({row: {tree: {round: (median_ns, p99_ns)}}}, [row order], {key:
    value of the log's # META lines})."""
    data: dict = defaultdict(lambda: defaultdict(dict))
    order: list = []
    meta: dict = {}
    tag = None

    def put(row: str, tree: str, rnd: int, med: float, p99: float) -> None:
        if row not in data:
            order.append(row)
        data[row][tree][rnd] = (med, p99)

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
            if tag is None or line.startswith("#"):
                continue
            rnd, tree, kind = tag
            if kind == "py" and line.startswith("{"):
                for row, (med, p99) in json.loads(line)["rows"].items():
                    put(row, tree, rnd, float(med), float(p99))
            elif kind == "apilat":
                m = _APILAT_ROW.match(line)
                if m and m.group(1) != "method":
                    put(f"C {m.group(1)} {m.group(2)}", tree, rnd, float(m.group(4)),
                        float(m.group(5)))
    return data, order, meta


def _bytes(row: str) -> int:
    return int(row.rsplit(" ", 1)[1])


def summarize(data: dict, order: list) -> list:
    out = []
    for row in order:
        old = data[row].get("old", {})
        new = data[row].get("new", {})
        if not old or not new:
            continue
        mo = statistics.median(v[0] for v in old.values())
        mn = statistics.median(v[0] for v in new.values())
        paired = [(new[r][0] - old[r][0]) / old[r][0] * 100 for r in old
                  if r in new and old[r][0] > 0]
        rec = {
            "row": row,
            "old_ns": mo, "old_p99_ns": statistics.median(v[1] for v in old.values()),
            "new_ns": mn, "new_p99_ns": statistics.median(v[1] for v in new.values()),
            "diff_pct": (mn - mo) / mo * 100 if mo > 0 else float("nan"),
            "paired_pct": statistics.median(paired) if paired else float("nan"),
            "new_slower": sum(1 for p in paired if p > 0), "rounds": len(paired),
        }
        if " bw " in f" {row} " and mo > 0 and mn > 0:
            rec["old_gbps"], rec["new_gbps"] = _bytes(row) / mo, _bytes(row) / mn
        out.append(rec)
    return out


def _fmt(v: float) -> str:
    return f"{v:.1f}" if v < 10000 else f"{v:.0f}"


def _gbps(r: dict) -> str:
    return f"{r['old_gbps']:.2f} -> {r['new_gbps']:.2f}" if "old_gbps" in r else ""


def table(rows: list) -> str:
    w = max([len(r["row"]) for r in rows] + [10])
    head = (f"{'row (ns per call)':<{w}}  {'old median':>11} {'p99':>10}  {'new median':>11} "
            f"{'p99':>10}  {'new/old':>8}  {'paired':>8}  slower  GB/s old -> new")
    lines = [head]
    for r in rows:
        lines.append(f"{r['row']:<{w}}  {_fmt(r['old_ns']):>11} {_fmt(r['old_p99_ns']):>10}  "
                     f"{_fmt(r['new_ns']):>11} {_fmt(r['new_p99_ns']):>10}  "
                     f"{r['diff_pct']:>+7.1f}%  {r['paired_pct']:>+7.1f}%  "
                     f"{r['new_slower']:>2}/{r['rounds']:<3}  {_gbps(r)}".rstrip())
    return "\n".join(lines)


def markdown(rows: list) -> str:
    head = ("| row (ns per call) | old median / p99 | new median / p99 | new/old | paired "
            "| new slower | GB/s old -> new |")
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['row']} | {_fmt(r['old_ns'])} / {_fmt(r['old_p99_ns'])} "
                     f"| {_fmt(r['new_ns'])} / {_fmt(r['new_p99_ns'])} "
                     f"| {r['diff_pct']:+.1f}% | {r['paired_pct']:+.1f}% "
                     f"| {r['new_slower']}/{r['rounds']} | {_gbps(r)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table instead")
    a = ap.parse_args()
    data, order, meta = parse(a.log)
    rows = summarize(data, order)
    if not rows:
        print(f"no rows measured for both trees in {a.log}", file=sys.stderr)
        return 1
    if meta:
        print("  ".join(f"{k}={v}" for k, v in meta.items()))
    print("median / p99: the median over rounds of each round's median / p99; new/old: of "
          "the medians; paired: median over rounds of (new-old)/old within a round; "
          "slower: rounds where new > old")
    print(markdown(rows) if a.markdown else table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
