#!/usr/bin/env python3
"""Summarize UCX protocol selection output (scripts/ucx_perftest.sh, ucx-config).

Two inputs, both written by UCX 1.22 itself:

``tables LOG...``
    The ``UCX_PROTO_INFO=y`` tables in a ucx_perftest log.  Each table is one
    log message (all its lines carry the same ``[time] [host:pid:tid]``
    prefix).  Tables whose title names ``MATCH`` (default ``cuda``) are
    printed compactly: the title, then one ``range  description  config`` line
    per row.  The ``Config`` column names the transport of the protocol's own
    lanes only; a memory-type copy that a copy-in/copy-out protocol makes
    through another transport (gdr_copy, cuda_copy) is not named there.

``dot DIR... [--sizes LIST] [--match cuda]``
    The per-range graphs that ``UCX_PROTO_INFO_DIR`` makes UCX write (one
    ``.dot`` file per operation and message-size range).  In each graph the
    nodes of the selected protocol are highlighted; among them are the
    ``local copy`` / ``remote copy`` nodes of copy-in/copy-out protocols, whose
    child names the UCT operation and transport of the memory-type copy (for
    example ``get_short gdr_copy/cuda``).  One line per file whose range holds
    one of ``--sizes``: the operation, the range, the selected protocol, its
    lane and the copies.

Both skip the fast-completion and multi-send variants of an operation unless
``--all-flavours`` is given (ucx_perftest's latency tests use neither).
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from collections.abc import Iterable
from pathlib import Path

PREFIX = re.compile(r"^(\[[^\]]*\] \[[^\]]*\])\s+(.*)$")
NODE = re.compile(r"^\s*node(\d+) \[(.*)\];?\s*$")
EDGE = re.compile(r"^\s*node(\d+) -> node(\d+)")
LABEL = re.compile(
    r'label=<<b>(?P<name>.*?)</b><br align="center"/>'
    r'(?:<font face="calibri" point-size="11">(?P<desc>.*?)<br/></font>)?'
)
UCT_OPS = {
    "am_short", "am_bcopy", "am_zcopy", "put_short", "put_bcopy", "put_zcopy",
    "get_short", "get_bcopy", "get_zcopy",
}


def _clean(text: str | None) -> str:
    if not text:
        return ""
    return html.unescape(re.sub(r"<br/>", "+", text)).strip()


def table_groups(lines: Iterable[str]) -> list[list[str]]:
    """Group the log lines that belong to one UCX table (same prefix)."""
    groups: list[list[str]] = []
    last = None
    for line in lines:
        m = PREFIX.match(line.rstrip("\n"))
        if not m or not m.group(2).startswith(("|", "+")):
            last = None
            continue
        if m.group(1) != last:
            groups.append([])
            last = m.group(1)
        groups[-1].append(m.group(2))
    return groups


def compact_table(rows: list[str]) -> list[str]:
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows if r.startswith("|")]
    if len(cells) < 3:
        return []
    out = [f"{cells[0][0]} | {cells[1][0]}"]
    for row in cells[2:]:
        if row and row[0] in ("Range", "Count"):
            continue
        if len(row) == 4:  # UCX_PROTO_INFO=used: Count first
            out.append(f"    {row[0]:>8} {row[1]:>14}  {row[2]:<40}  {row[3]}".rstrip())
        else:
            rng, rest = row[0], row[1:]
            out.append(f"    {rng:>14}  " + "  ".join(f"{c:<40}" for c in rest).rstrip())
    return out


# The op-attribute flavours UCX also prepares for host-memory short fast paths;
# ucx_perftest's latency tests pass neither flag (src/tools/perf/lib/ucp_tests.cc).
FLAVOURS = ("(fast-completion)", "(multi)", "_fast_completion_", "_multi_")


def cmd_tables(logs: list[str], match: str, all_flavours: bool) -> int:
    seen: set[str] = set()
    for log in logs:
        try:
            text = Path(log).read_text(errors="replace").splitlines()
        except OSError as exc:
            print(f"(cannot read {log}: {exc})")
            continue
        for group in table_groups(text):
            lines = compact_table(group)
            if not lines or match not in lines[0]:
                continue
            if not all_flavours and any(f in lines[0] for f in FLAVOURS):
                continue
            key = "\n".join(lines)
            if key in seen:
                continue
            seen.add(key)
            print("\n".join(lines))
    return 0


def parse_range(text: str) -> tuple[int, int] | None:
    m = re.search(r"(\S+)\.\.(\S+)$", text)
    if not m:
        return None

    def num(s: str) -> int:
        if s == "inf":
            return sys.maxsize
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
        return int(s[:-1] if mult > 1 else s) * mult

    try:
        return num(m.group(1)), num(m.group(2))
    except ValueError:
        return None


class Graph:
    def __init__(self, path: Path) -> None:
        self.nodes: dict[int, tuple[str, str, bool]] = {}
        self.children: dict[int, list[int]] = {}
        self.title = ""
        for line in path.read_text(errors="replace").splitlines():
            e = EDGE.match(line)
            if e:
                self.children.setdefault(int(e.group(1)), []).append(int(e.group(2)))
                continue
            n = NODE.match(line)
            if not n:
                continue
            nid, attrs = int(n.group(1)), n.group(2)
            if nid == 0:
                t = re.search(r'label="([^"]*)"', attrs)
                self.title = t.group(1).replace("\\n", " / ") if t else ""
                continue
            lab = LABEL.search(attrs)
            if lab:
                self.nodes[nid] = (_clean(lab.group("name")), _clean(lab.group("desc")),
                                   "fillcolor" in attrs)

    def summary(self) -> tuple[str, tuple[int, int] | None, str]:
        selected, lanes, copies = "", [], []
        for nid, (name, desc, lit) in sorted(self.nodes.items()):
            if not lit:
                continue
            if name == "selected":
                selected = desc
            elif name in UCT_OPS and desc:
                lanes.append(f"{name} {desc}")
            elif name in ("local copy", "remote copy"):
                via = [f"{self.nodes[c][0]} {self.nodes[c][1]}"
                       for c in self.children.get(nid, [])
                       if c in self.nodes and self.nodes[c][0] in UCT_OPS]
                copies.append(f"{name} {desc}" + (f" via {', '.join(via)}" if via else ""))
        lanes = [x for x in lanes if not any(x in c for c in copies)]
        rng = parse_range(selected)
        text = selected
        if lanes:
            text += " | lane " + ", ".join(dict.fromkeys(lanes))
        if copies:
            text += " | " + "; ".join(copies)
        return self.title, rng, text


def cmd_dot(dirs: list[str], sizes: list[int], match: str, all_flavours: bool) -> int:
    lines: dict[str, tuple[int, str]] = {}
    for d in dirs:
        for f in sorted(Path(d).glob("*.dot")):
            if match not in f.name:
                continue
            if not all_flavours and any(fl in f.name for fl in FLAVOURS):
                continue
            g = Graph(f)
            _title, rng, text = g.summary()
            if rng is None:
                continue
            hit = [s for s in sizes if rng[0] <= s <= rng[1]]
            if sizes and not hit:
                continue
            op = re.sub(r"_\d+[KMG]?_(\d+[KMG]?|inf)\.dot$", "", f.name)
            op = re.sub(r"^.*?(?=(self|intra_node|inter_node)_cfg_)", "", op)
            sz = ",".join(str(s) for s in hit)
            key = f"{op}: {text}"
            lines.setdefault(key, (rng[0], f"{op} [size {sz}]: {text}"))
    for _start, line in sorted(lines.values(), key=lambda v: (v[1].split(" [")[0], v[0])):
        print(line)
    if not lines:
        print(f"(no protocol graphs matching '{match}' in {' '.join(dirs)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tables", help="compact UCX_PROTO_INFO tables from logs")
    t.add_argument("logs", nargs="+")
    t.add_argument("--match", default="cuda")
    t.add_argument("--all-flavours", action="store_true",
                   help="also the fast-completion and multi-send variants")
    d = sub.add_parser("dot", help="selected protocol and copies from UCX_PROTO_INFO_DIR graphs")
    d.add_argument("dirs", nargs="+")
    d.add_argument("--sizes", default="")
    d.add_argument("--match", default="cuda")
    d.add_argument("--all-flavours", action="store_true",
                   help="also the fast-completion and multi-send variants")
    a = ap.parse_args(argv)
    if a.cmd == "tables":
        return cmd_tables(a.logs, a.match, a.all_flavours)
    sizes = [int(s) for s in a.sizes.split(",") if s]
    return cmd_dot(a.dirs, sizes, a.match, a.all_flavours)


if __name__ == "__main__":
    sys.exit(main())
