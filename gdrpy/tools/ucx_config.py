"""``python -m gdrpy ucx-config``: UCX settings chosen from this host's measured costs.

UCX prices its transports from built-in estimates (gdr_copy: get 1.4 us and
250 MB/s, put 0.4 us and 6.9 GB/s; rendezvous through cuda_ipc: a few us) and
switches from eager to rendezvous where those estimates cross.  On a host where
they are wrong the switch lands in the wrong place.  This command measures
instead, chooses from the measurements, and writes the choice as a section of
``$UCX_CONFIG_DIR/ucx.conf`` that UCX applies on this machine only.

Measured (GPU needed):

* ``gdr_copy_to_mapping`` / ``gdr_copy_from_mapping`` through libgdrapi.so.2 and
  the copy engine (synchronous cuMemcpy to and from page-locked memory), 8 B to
  4 MiB, by ``gdrapi_copylat --csv`` from ``python -m gdrpy bindir``;
* where UCX is given (``--ucx-prefix``, ``$UCX_PREFIX`` or ucx_perftest on PATH):
  ``ucx_perftest -t tag_lat -m cuda`` between two processes at a few sizes under
  each *variant*: eager at every size (``UCX_RNDV_THRESH=inf``) with UCX's
  shared-memory fragment size and with larger ones, and rendezvous at every size
  (``UCX_RNDV_THRESH=0``) with UCX's own scheme and with ``put_zcopy`` /
  ``get_zcopy``.

Chosen (:func:`choose`, a pure function of the measurements):

* every pair (eager variant E, rendezvous variant R) gives a threshold: the
  smallest measured size from which R is faster than E at that and every larger
  measured size, placed between that size and the one below it where the two
  straight lines through the neighbouring points cross; below it the pair costs
  E, from it R.  The pair with the lowest geometric mean over the measured sizes
  wins; a variant other than UCX's own must gain at least 2% on that mean.  A
  variant not measured at a size counts as its kind's UCX default there.
  Written: ``UCX_RNDV_THRESH=auto,intra:<threshold>`` (inter-node stays UCX's),
  ``UCX_POSIX_SEG_SIZE`` / ``UCX_SYSV_SEG_SIZE`` when a larger fragment won,
  ``UCX_RNDV_SCHEME`` when a scheme won.
* gdr_copy's cost model (``UCX_GDR_COPY_LAT``, ``UCX_GDR_COPY_BW``): per
  direction the straight line through the 8 B point and the point at the largest
  size one gdr_copy call moves under the chosen settings (the threshold or the
  fragment payload, whichever is smaller; 8 KiB without UCX measurements).

The section starts with UCX's filter lines (``CPU vendor``, ``CPU model``,
``Product name`` as ``ucx_info -s`` reports them), so UCX skips it on other
machines; each value carries a comment saying what it is and how it was measured.
Only the block between this tool's marker lines is created or replaced; the rest
of the file is kept, and a UCX installation's own ``etc/ucx`` is never written.
``--from-json`` chooses from measurements saved with ``--json`` (no GPU needed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ucx_protoinfo import FLAVOURS, compact_table, parse_range, table_groups

SCHEMA = 1
SECTION = "gdrpy ucx-config"
BEGIN = "# >>> gdrpy ucx-config"
END = "# <<< gdrpy ucx-config"
GAIN = 0.02            # geometric-mean gain a non-default variant must bring
UCX_SEG = 8256         # UCX 1.22's UCX_POSIX/SYSV_SEG_SIZE: 8 KiB payload + header
SEG_HEADER = 64
SEG_MAX = 65535        # UCX's shared-memory FIFO element has a 16-bit length: a larger
                       # segment breaks multi-fragment messages (UCX 1.22 hangs on them)
SEG_CANDIDATES = (32832, SEG_MAX)
SIZES = (8, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20)
QUICK_SIZES = (8, 4096, 65536, 1 << 20)
PROTO_SIZES = (2048, 8192, 32768)   # sizes whose protocol lines are reported


class ToolError(Exception):
    """A condition the command reports in one line (exit status 2)."""


class NeedsGPU(ToolError):
    pass


# ----------------------------------------------------------------------------
# variants and their measurements


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str                      # "eager" or "rndv"
    env: dict[str, str]
    min_size: int = 0              # measured from this size on
    default: bool = False          # UCX's own behaviour for its kind
    setting: dict[str, str] = field(default_factory=dict)   # what the choice writes

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env.items())


def variants(seg_sizes: tuple[int, ...] = SEG_CANDIDATES, schemes: bool = True
             ) -> list[Variant]:
    out = [Variant("eager", "eager", {"UCX_RNDV_THRESH": "inf"}, default=True)]
    for seg in seg_sizes:
        seg_env = {"UCX_POSIX_SEG_SIZE": str(seg), "UCX_SYSV_SEG_SIZE": str(seg)}
        out.append(Variant(f"eager_seg{seg}", "eager", {"UCX_RNDV_THRESH": "inf", **seg_env},
                           min_size=2 * (UCX_SEG - SEG_HEADER), setting=seg_env))
    out.append(Variant("rndv", "rndv", {"UCX_RNDV_THRESH": "0"}, min_size=1024, default=True))
    if schemes:
        for scheme in ("put_zcopy", "get_zcopy"):
            out.append(Variant(f"rndv_{scheme.split('_')[0]}", "rndv",
                               {"UCX_RNDV_THRESH": "0", "UCX_RNDV_SCHEME": scheme},
                               min_size=16384, setting={"UCX_RNDV_SCHEME": scheme}))
    return out


def _num_keys(d: dict[Any, Any]) -> dict[int, float]:
    return {int(k): float(v) for k, v in d.items() if v is not None}


def variant_table(meas: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[int, float]]]:
    """name -> (variant record, {size: median us}) from a measurements dict."""
    ucx = meas.get("ucx") or {}
    return {name: (rec, _num_keys(rec.get("us", {})))
            for name, rec in (ucx.get("variants") or {}).items()}


# ----------------------------------------------------------------------------
# the choosing rule (pure)


def crossover(e: dict[int, float], r: dict[int, float]) -> tuple[int | None, str]:
    """Threshold from eager costs ``e`` and rendezvous costs ``r`` (size -> us).

    Returns (threshold, how): the size from which rendezvous is used, or None when
    eager is faster at the largest measured size (then eager throughout).
    """
    sizes = sorted(set(e) & set(r))
    if not sizes:
        return None, "no size measured both ways"
    i = len(sizes)
    while i > 0 and r[sizes[i - 1]] < e[sizes[i - 1]]:
        i -= 1
    if i == len(sizes):
        return None, f"eager faster up to {fmt_size(sizes[-1])}, the largest size measured"
    if i == 0:
        return sizes[0], f"rendezvous faster from {fmt_size(sizes[0])}, the smallest size measured"
    a, b = sizes[i - 1], sizes[i]
    da, db = r[a] - e[a], r[b] - e[b]           # da >= 0 > db
    t = a + (b - a) * da / (da - db)
    thresh = min(b, max(a + 1, math.ceil(t)))
    return thresh, (f"eager {e[a]:.2f} / rendezvous {r[a]:.2f} us at {fmt_size(a)}, "
                    f"{e[b]:.2f} / {r[b]:.2f} us at {fmt_size(b)}: the lines cross at "
                    f"{thresh} B")


def pair_cost(e: dict[int, float], r: dict[int, float], thresh: int | None) -> float:
    """Geometric mean over the sizes measured both ways of what the pair costs."""
    sizes = sorted(set(e) & set(r))
    if not sizes:
        return math.inf
    logs = [math.log(e[s] if thresh is None or s < thresh else r[s]) for s in sizes]
    return math.exp(sum(logs) / len(logs))


def with_fallback(own: dict[int, float], base: dict[int, float]) -> dict[int, float]:
    """A variant's costs, its kind's default where the variant was not measured."""
    out = dict(base)
    out.update(own)
    return out


def fit_line(rows: list[dict[str, Any]], key: str, top: int
             ) -> tuple[float, float, int, int, float]:
    """(latency us, bandwidth bytes/us, low size, high size, time at the high size)
    of the straight line through the smallest-size point (8 B when measured) and the
    point at the largest measured size <= ``top``.  Where noise makes the high point
    no slower than the low one, the bandwidth is the high point's own throughput
    (UCX takes no infinite bandwidth)."""
    pts = sorted((int(r["size"]), float(r[key])) for r in rows if r.get(key) is not None)
    if not pts:
        raise ToolError(f"no {key} measurements")
    low = next((p for p in pts if p[0] >= 8), pts[0])
    above = [p for p in pts if p[0] > low[0]]
    if not above:
        raise ToolError(f"{key} measured at one size only")
    cands = [p for p in above if p[0] <= top]
    high = cands[-1] if cands else above[0]
    lat = low[1]
    dt = high[1] - low[1]
    bw = (high[0] - low[0]) / dt if dt > 0 else high[0] / high[1]
    return lat, bw, low[0], high[0], high[1]


@dataclass
class Setting:
    name: str
    value: str
    comment: list[str]


@dataclass
class Choice:
    settings: list[Setting]
    eager: str | None = None
    rndv: str | None = None
    threshold: int | None = None
    cost_us: float | None = None
    ranking: list[tuple[float, str, str, int | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"settings": {s.name: s.value for s in self.settings}, "eager": self.eager,
                "rndv": self.rndv, "threshold": self.threshold, "cost_us": self.cost_us,
                "ranking": [{"cost_us": c, "eager": e, "rndv": r, "threshold": t}
                            for c, e, r, t in self.ranking],
                "notes": self.notes}


def fmt_size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _mbs(bytes_per_us: float) -> str:
    """UCX's MBs are 2**20 bytes per second."""
    return f"{bytes_per_us * 1e6 / (1 << 20):.0f}MBs"


def choose(meas: dict[str, Any]) -> Choice:
    """The settings for a measurements dict (see the module's docstring)."""
    table = variant_table(meas)
    choice = Choice(settings=[])
    top = UCX_SEG - SEG_HEADER
    where = _where(meas)
    base = {k: next((us for _n, (rec, us) in table.items()
                     if rec.get("kind") == k and rec.get("default") and not rec.get("failed")),
                    None)
            for k in ("eager", "rndv")}
    broken = [n for n, (rec, _us) in table.items() if rec.get("default") and rec.get("failed")]
    if broken:
        choice.notes.append(f"UCX's own {' and '.join(broken)} did not complete every size "
                            "(see the logs): no threshold chosen")
    if base["eager"] and base["rndv"]:
        combos = []
        for en, (erec, eus) in table.items():
            if erec.get("kind") != "eager" or erec.get("failed"):
                continue
            for rn, (rrec, rus) in table.items():
                if rrec.get("kind") != "rndv" or rrec.get("failed"):
                    continue
                e = with_fallback(eus, base["eager"])
                r = with_fallback(rus, base["rndv"])
                t, how = crossover(e, r)
                cost = pair_cost(e, r, t)
                nondefault = (not erec.get("default")) + (not rrec.get("default"))
                combos.append((cost, nondefault, en, rn, t, how))
        best_default = min((c for c in combos if c[1] == 0), key=lambda c: c[0])
        pick = best_default
        for c in sorted(combos, key=lambda c: c[0]):
            if c[1] and c[0] < pick[0] * (1 - GAIN) ** c[1]:
                pick = c
                break
        choice.ranking = [(c[0], c[2], c[3], c[4]) for c in sorted(combos, key=lambda c: c[0])]
        cost, _nd, en, rn, t, how = pick
        choice.eager, choice.rndv, choice.threshold, choice.cost_us = en, rn, t, cost
        erec, eus = table[en]
        rrec, rus = table[rn]
        e = with_fallback(eus, base["eager"])
        r = with_fallback(rus, base["rndv"])
        sizes = sorted(set(e) & set(r))
        test = (meas.get("ucx") or {}).get("test", "tag_lat")
        pts = ", ".join(f"{fmt_size(s)} {e[s]:.1f}/{r[s]:.1f}" for s in sizes)
        head = [(f"Eager/rendezvous switch for messages inside this node, from ucx_perftest "
                 f"-t {test}, {where}; median us eager/rendezvous: {pts}.")]
        if t is None:
            thresh_value = f"{max(sizes) + 1}"
            head.append(f"{how}: eager through it.")
        else:
            thresh_value = str(t)
            head.append(f"{how}.")
        choice.settings.append(Setting("UCX_RNDV_THRESH", f"auto,intra:{thresh_value}",
                                       _wrap(" ".join(head))))
        eseg = erec.get("setting") or {}
        if eseg:
            top = int(next(iter(eseg.values()))) - SEG_HEADER
            gain = 1 - cost / best_default[0]
            text = (f"Shared-memory fragment of eager copy-in/copy-out: {top} B of payload "
                    f"instead of UCX's {UCX_SEG - SEG_HEADER} B (each fragment is one "
                    f"gdr_copy read and one write); eager measured both ways, the pair "
                    f"above costs {100 * gain:.0f}% less (geometric mean over the sizes).")
            for i, (k, v) in enumerate(eseg.items()):
                choice.settings.append(Setting(k, v, _wrap(text) if i == 0 else []))
        rset = rrec.get("setting") or {}
        for k, v in rset.items():
            gain = 1 - cost / best_default[0]
            choice.settings.append(Setting(k, v, _wrap(
                f"Rendezvous scheme: {v} measured {100 * gain:.0f}% faster (geometric mean "
                f"of the pair) than UCX's own choice ({rrec.get('env')}).")))
        if t is not None:
            top = min(top, t)
    elif not table:
        choice.notes.append("no UCX measurements: only gdr_copy's cost model is written "
                            "(give --ucx-prefix to choose the thresholds too)")
    rows = (meas.get("copy") or {}).get("rows") or []
    if rows:
        g = fit_line(rows, "get_us", top)
        p = fit_line(rows, "put_us", top)
        h = meas.get("host") or {}
        text = (f"gdr_copy's cost in UCX's model, latency + size / bandwidth, per direction the "
                f"line through two points measured with gdrapi_copylat through libgdrapi.so.2 "
                f"(GPU {h.get('device', 0)}, {h.get('gpu') or 'GPU ?'}): get "
                f"(gdr_copy_from_mapping, GPU to host) {g[0]:.2f} us at {fmt_size(g[2])}, "
                f"{g[4]:.2f} us at {fmt_size(g[3])}; put (gdr_copy_to_mapping) {p[0]:.2f} us "
                f"at {fmt_size(p[2])}, {p[4]:.2f} us at {fmt_size(p[3])}; {fmt_size(g[3])} is "
                f"the largest measured copy within what one call moves under these settings.")
        choice.settings.insert(0, Setting("UCX_GDR_COPY_LAT",
                                          f"get:{g[0]:.3g}us,put:{p[0]:.3g}us", _wrap(text)))
        choice.settings.insert(1, Setting(
            "UCX_GDR_COPY_BW", f"0MBs,get_dedicated:{_mbs(g[1])},put_dedicated:{_mbs(p[1])}",
            _wrap("Bandwidths of those lines (MBs = 2^20 bytes/s); dedicated: each process "
                  "copies through its own mapping, as measured.")))
    else:
        choice.notes.append("no gdr_copy measurements")
    return choice


def _where(meas: dict[str, Any]) -> str:
    h = meas.get("host") or {}
    ucx = meas.get("ucx") or {}
    dev = h.get("device", 0)
    peer = ucx.get("peer_device", dev)
    procs = (f"two processes on GPU {dev}" if peer == dev
             else f"one process on GPU {dev}, one on GPU {peer}")
    return f"{procs}, {h.get('gpu') or 'GPU ?'}"


def _wrap(text: str, width: int = 96) -> list[str]:
    out, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    return out


# ----------------------------------------------------------------------------
# the section and the file


def _pattern(value: str) -> str:
    """A literal for UCX's fnmatch filter; ';' would start an inline comment."""
    out = re.sub(r"([*?\[\]\\])", r"\\\1", value)
    return out.replace(";", "?")


def render_section(choice: Choice, meas: dict[str, Any]) -> str:
    h = meas.get("host") or {}
    ucx = meas.get("ucx") or {}
    lines = [f"{BEGIN}: written by `python -m gdrpy ucx-config`, replaced whole when it runs",
             "# again. Put your own settings above this block: lines below it would belong to",
             "# its section.",
             f"[{SECTION}]"]
    filters = [(k, str(h.get(key) or "")) for k, key in (("CPU vendor", "cpu_vendor"),
                                                         ("CPU model", "cpu_model"),
                                                         ("Product name", "product_name"))]
    filters = [(k, v) for k, v in filters if v and v != "unknown"]
    if filters:
        lines.append("# UCX applies this section only where every filter line below matches "
                     "(ucx_info -s).")
        lines += [f"{k}={_pattern(v)}" for k, v in filters]
    else:
        lines.append("# WARNING: UCX reported no CPU model or product name here, so this "
                     "section has no filter:")
        lines.append("# it applies wherever this file is read. Keep the file in a folder "
                     "used on this machine only.")
    when = meas.get("when", "?")
    lines.append(f"# Measured {when} on {h.get('hostname', '?')} ({h.get('gpu', 'GPU ?')}, "
                 f"driver {h.get('driver', '?')});")
    lines.append(f"# UCX {ucx.get('version', '-')}, libgdrapi.so.2 of gdrpy "
                 f"{meas.get('gdrpy', '?')}. Medians; every value below was chosen from them.")
    for s in choice.settings:
        if s.comment:           # a setting without one shares the comment above
            lines.append("#")
            lines += [f"# {c}" for c in s.comment]
        lines.append(f"{s.name}={s.value}")
    ce = _ce_note(meas)
    if ce:
        lines.append("#")
        lines += [f"# {c}" for c in _wrap(ce)]
    for n in choice.notes:
        lines += [f"# note: {c}" for c in _wrap(n)]
    lines.append(END)
    for ln in lines:       # UCX's ini parser reads at most 200 characters a line
        assert len(ln) < 200 and not ln[:1].isspace(), ln
    return "\n".join(lines) + "\n"


def _ce_note(meas: dict[str, Any]) -> str:
    rows = {int(r["size"]): r for r in (meas.get("copy") or {}).get("rows") or []}
    pts = [(s, rows[s]) for s in (8, 65536, 1 << 20) if s in rows
           and rows[s].get("dtoh_us") is not None]
    if not pts:
        return ""
    got = ", ".join(f"{fmt_size(s)} {r['dtoh_us']:.1f}/{r['htod_us']:.1f} us" for s, r in pts)
    return (f"For reference, not a setting: the copy engine (synchronous cuMemcpy DtoH/HtoD, "
            f"page-locked host memory) took {got}; gdr_copy's reads above are what "
            f"libgdrapi.so.2 itself does at each size.")


def merge_conf(existing: str | None, block: str) -> str:
    """``existing`` with this tool's block replaced by ``block`` (moved to the end:
    lines after a section belong to it)."""
    text = existing or ""
    lines = text.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.startswith(BEGIN)]
    ends = [i for i, ln in enumerate(lines) if ln.rstrip("\n") == END]
    if len(starts) != len(ends) or any(e < s for s, e in zip(starts, ends, strict=False)):
        raise ToolError("the ucx.conf holds an incomplete gdrpy ucx-config block (a begin "
                        f"line without its end line '{END}' or the other way round); "
                        "mend it by hand, nothing was written")
    keep = []
    skip = False
    for i, ln in enumerate(lines):
        if i in starts:
            skip = True
        if not skip:
            keep.append(ln)
        if i in ends:
            skip = False
    body = "".join(keep).rstrip("\n")
    return (body + "\n\n" if body else "") + block


def refuse_ucx_install_dir(conf_dir: Path, prefix: Path | None) -> None:
    """Never write into a UCX installation's own etc/ucx."""
    d = conf_dir.resolve()
    owners = []
    if prefix is not None:
        owners.append((prefix / "etc" / "ucx").resolve())
    if d.name == "ucx" and d.parent.name == "etc":
        lib = d.parent.parent / "lib"
        if any(lib.glob("libucs.so*")):
            owners.append(d)
    if d in owners:
        raise ToolError(f"{d} is a UCX installation's own configuration folder; this tool "
                        "never rewrites it: give --config-dir (or UCX_CONFIG_DIR) another "
                        "folder")


# ----------------------------------------------------------------------------
# measuring


@dataclass
class Ucx:
    prefix: Path

    @property
    def perftest(self) -> Path:
        return self.prefix / "bin" / "ucx_perftest"

    @property
    def info(self) -> Path:
        return self.prefix / "bin" / "ucx_info"


def find_ucx(given: str | None) -> Ucx | None:
    if given:
        p = Path(given)
        if not (p / "bin" / "ucx_perftest").is_file():
            raise ToolError(f"no bin/ucx_perftest under {p} (--ucx-prefix / UCX_PREFIX: a UCX "
                            "installation, e.g. the folder scripts/ucx_build.sh made)")
        return Ucx(p.resolve())
    exe = shutil.which("ucx_perftest")
    return Ucx(Path(exe).resolve().parent.parent) if exe else None


def child_env(ucx: Ucx | None, libdir: str, home: str, extra: dict[str, str] | None = None
              ) -> dict[str, str]:
    """The environment of the measured processes: the user's UCX_* variables and
    UCX_CONFIG_DIR removed (they would bias the measurement), libgdrapi.so.2 and
    UCX's libraries first, HOME in a scratch folder (UCX also reads ~/ucx.conf)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    paths = [libdir] + ([str(ucx.prefix / "lib")] if ucx else [])
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = ":".join(paths + ([old] if old else []))
    env["HOME"] = home
    env["UCX_WARN_UNUSED_ENV_VARS"] = "n"
    env.update(extra or {})
    return env


def parse_copylat(text: str) -> tuple[list[str], list[dict[str, Any]]]:
    """gdrapi_copylat --csv output -> (comment lines, rows with *_us keys)."""
    head = [ln for ln in text.splitlines() if ln.startswith("#")]
    rows: list[dict[str, Any]] = []
    cols: list[str] = []
    names = {"to_map_med": "put_us", "from_map_med": "get_us", "htod_med": "htod_us",
             "dtoh_med": "dtoh_us"}
    for ln in text.splitlines():
        if ln.startswith("size,"):
            cols = ln.strip().split(",")
        elif cols and ln[:1].isdigit():
            vals = ln.strip().split(",")
            if len(vals) != len(cols):
                continue
            row: dict[str, Any] = {"size": int(vals[0])}
            for c, v in zip(cols[1:], vals[1:], strict=True):
                if c in names:
                    row[names[c]] = float(v)
            rows.append(row)
    return head, rows


def measure_copies(libdir: str, bindir: str, device: int, quick: bool,
                   allow_sim: bool) -> dict[str, Any]:
    tool = Path(bindir) / "gdrapi_copylat"
    if not tool.is_file():
        raise ToolError(f"no {tool} (the C tools are built with the package: make -C native "
                        "tools, or pip install .)")
    env = dict(os.environ, GDRPY_DEVICE=str(device))
    env["LD_LIBRARY_PATH"] = ":".join([libdir] + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    args = [str(tool), "--min", "8", "--max", str(1 << 20 if quick else 4 << 20), "--csv",
            "--iters", "200" if quick else "500"]
    try:
        res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        raise ToolError(f"{tool.name} took longer than 300 s") from exc
    head, rows = parse_copylat(res.stdout)
    sim = any("sim backend" in h for h in head)
    if res.returncode != 0 or not rows:
        why = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or ["no output"]
        if "no device memory" in why[0] or "GPU" in why[0] or "cuda" in why[0].lower():
            raise NeedsGPU(f"this measures the GPU and found none ({why[0]})")
        raise ToolError(f"{tool.name} failed (exit {res.returncode}): {why[0]}")
    if sim and not allow_sim:
        raise NeedsGPU("this measures the GPU, and libgdrapi.so.2 runs on the sim backend "
                       "here (host memory standing in for a GPU)")
    return {"tool": " ".join([tool.name] + args[1:]), "header": head, "rows": rows,
            "sim": sim}


def parse_perftest(text: str) -> dict[str, dict[str, float]]:
    """ucx_perftest output -> {test name: Final fields}; a run without a batch
    file has the name ''."""
    out: dict[str, dict[str, float]] = {}
    name = ""
    keys = ("iters", "p50_us", "avg_us", "overall_us", "bw_avg_mbs", "bw_overall_mbs",
            "rate_avg", "rate_overall")
    for ln in text.splitlines():
        m = re.match(r"^\+([^-+|][^+|]*?)-*\+", ln)
        if m:
            name = m.group(1).strip()
            continue
        if ln.startswith("Final:"):
            vals = ln.split()[1:]
            try:
                out[name] = {k: float(v.replace(",", "")) for k, v in
                             zip(keys, vals, strict=False)}
            except ValueError:
                continue
    return out


def _listening(port: int) -> bool:
    hexport = f":{port:04X} "
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(f) as fh:
                for ln in fh.read().splitlines()[1:]:
                    parts = ln.split()
                    if len(parts) > 3 and parts[3] == "0A" and (parts[1] + " ").endswith(hexport):
                        return True
        except OSError:
            continue
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def perftest_pair(ucx: Ucx, env: dict[str, str], client_tests: list[tuple[str, str]],
                  work: Path, timeout: float = 300,
                  server_tests: list[tuple[str, str]] | None = None) -> tuple[str, str]:
    """One ucx_perftest server and client on this host over a batch file of
    (name, arguments) lines; returns (client output, server output)."""
    work.mkdir(parents=True, exist_ok=True)
    cb, sb = work / "client.batch", work / "server.batch"
    cb.write_text("".join(f"{n} {a}\n" for n, a in client_tests))
    sb.write_text("".join(f"{n} {a}\n" for n, a in (server_tests or client_tests)))
    port = _free_port()
    with open(work / "server.log", "w") as slog:
        server = subprocess.Popen([str(ucx.perftest), "-p", str(port), "-b", str(sb)],
                                  env=env, cwd=work, stdout=slog, stderr=subprocess.STDOUT)
        try:
            t0 = time.monotonic()
            while not _listening(port):
                if server.poll() is not None or time.monotonic() - t0 > 30:
                    raise ToolError(f"ucx_perftest server did not start (see {work}/server.log)")
                time.sleep(0.05)
            try:
                res = subprocess.run([str(ucx.perftest), "127.0.0.1", "-p", str(port),
                                      "-b", str(cb)], env=env, cwd=work, capture_output=True,
                                     text=True, timeout=timeout)
                out = res.stdout + res.stderr
            except subprocess.TimeoutExpired as exc:
                out = (exc.stdout or b"").decode(errors="replace") if isinstance(
                    exc.stdout, bytes) else (exc.stdout or "")
                out += f"\n(timed out after {timeout:.0f} s)\n"
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    (work / "client.log").write_text(out)
    return out, (work / "server.log").read_text(errors="replace")


def iterations(size: int) -> tuple[int, int]:
    if size <= 16384:
        return 1000, 100
    if size <= 262144:
        return 300, 30
    if size <= 1 << 20:
        return 100, 10
    return 40, 5


def batch_lines(sizes: list[int], mem: str, device: int | None, test: str = "tag_lat"
                ) -> list[tuple[str, str]]:
    """ucx_perftest batch lines, one per size (named s<size>); ``device`` picks the
    GPU of the process's buffers (-a cuda:N), None leaves it to UCX (GPU 0)."""
    dev = f" -a cuda:{device}" if mem == "cuda" and device is not None else ""
    out = []
    for s in sizes:
        n, w = iterations(s)
        out.append((f"s{s}", f"-t {test} -m {mem}{dev} -s {s} -n {n} -w {w}"))
    return out


def ucx_host_info(ucx: Ucx | None, env: dict[str, str]) -> dict[str, str]:
    """CPU vendor / model and DMI product name as UCX sees them, and UCX's version."""
    out: dict[str, str] = {}
    if ucx is not None and ucx.info.is_file():
        for flag in ("-s", "-v"):
            try:
                res = subprocess.run([str(ucx.info), flag], env=env, capture_output=True,
                                     text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            for ln in res.stdout.splitlines():
                m = re.match(r"^# (CPU vendor|CPU model|Product name): (.*)$", ln)
                if m:
                    out[m.group(1).lower().replace(" ", "_")] = m.group(2).strip()
                v = re.search(r"[Vv]ersion:? (\d+\.\d+\.\d+)", ln)
                if v and flag == "-v":
                    out.setdefault("version", v.group(1))
    if "product_name" not in out:
        try:
            out["product_name"] = Path(
                "/sys/devices/virtual/dmi/id/product_name").read_text().strip() or "unknown"
        except OSError:
            out["product_name"] = "unknown"
    return out


def gpu_identity(device: int) -> tuple[str, str]:
    try:
        res = subprocess.run(["nvidia-smi", "-i", str(device), "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
        name, drv = (x.strip() for x in res.stdout.strip().splitlines()[0].split(",", 1))
        return name, drv
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        return "GPU ?", "?"


def measure(args: argparse.Namespace, ucx: Ucx | None, work: Path,
            say: Callable[[str], None]) -> dict[str, Any]:
    import gdrpy

    libdir, bindir = gdrpy.libdir(), gdrpy.bindir()
    env = child_env(ucx, libdir, str(work))
    host = ucx_host_info(ucx, env)
    gpu, drv = gpu_identity(args.device)
    meas: dict[str, Any] = {
        "schema": SCHEMA, "gdrpy": gdrpy.__version__,
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": {"hostname": socket.gethostname(), "gpu": gpu, "driver": drv,
                 "device": args.device, "cpu_vendor": host.get("cpu_vendor", "unknown"),
                 "cpu_model": host.get("cpu_model", "unknown"),
                 "product_name": host.get("product_name", "unknown")},
    }
    say(f"measuring gdr_copy and the copy engine on GPU {args.device} ({gpu}) through "
        f"{libdir}/libgdrapi.so.2 ...")
    meas["copy"] = measure_copies(libdir, bindir, args.device, args.quick,
                                  allow_sim=args.mem == "host")
    if ucx is None:
        say("no UCX (--ucx-prefix, UCX_PREFIX, ucx_perftest on PATH): thresholds not measured")
        return meas
    sizes = list(QUICK_SIZES if args.quick else SIZES)
    peer = args.device if args.peer_device is None else args.peer_device
    devs = (None, None) if (args.device, peer) == (0, 0) else (args.device, peer)
    ucx_rec: dict[str, Any] = {"prefix": str(ucx.prefix), "version": host.get("version", "?"),
                               "test": "tag_lat", "mem": args.mem, "peer_device": peer,
                               "variants": {}}
    meas["ucx"] = ucx_rec
    for v in variants(tuple(args.seg_sizes), schemes=not args.quick):
        vs = [s for s in sizes if s >= v.min_size]
        say(f"  ucx_perftest tag_lat -m {args.mem}, {v.name} ({v.describe()}): "
            f"{', '.join(fmt_size(s) for s in vs)}")
        out, _ = perftest_pair(ucx, child_env(ucx, libdir, str(work), v.env), timeout=60,
                               client_tests=batch_lines(vs, args.mem, devs[0]),
                               work=work / v.name,
                               server_tests=batch_lines(vs, args.mem, devs[1]))
        got = parse_perftest(out)
        us = {s: got[f"s{s}"]["p50_us"] for s in vs if f"s{s}" in got}
        failed = [s for s in vs if s not in us]
        if failed:
            say(f"    no result at {', '.join(fmt_size(s) for s in failed)}: {v.name} is not "
                f"chosen (logs: {work / v.name})")
        ucx_rec["variants"][v.name] = {"kind": v.kind, "env": v.env, "default": v.default,
                                       "setting": v.setting, "us": us, "failed": failed}
    return meas


def verify(ucx: Ucx, conf_dir: Path, choice: Choice, meas: dict[str, Any], args: argparse.Namespace,
           work: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Runs UCX with the written configuration: UCX must report the chosen
    threshold (ucx_info -c: the section's filters matched), and tag_lat at the
    measured sizes with UCX_PROTO_INFO=y gives the protocols it picks."""
    import gdrpy

    libdir = gdrpy.libdir()
    env = child_env(ucx, libdir, str(work), {"UCX_CONFIG_DIR": str(conf_dir)})
    res: dict[str, Any] = {"conf_dir": str(conf_dir)}
    want = {s.name: s.value for s in choice.settings}
    try:
        cfg = subprocess.run([str(ucx.info), "-c"], env=env, capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        cfg = ""
    seen = dict(ln.split("=", 1) for ln in cfg.splitlines() if ln.startswith("UCX_") and "=" in ln)
    applied = {}
    for k in want:
        if k in seen:
            applied[k] = seen[k]
    res["ucx_info"] = applied
    thr = want.get("UCX_RNDV_THRESH", "")
    chosen = re.search(r"intra:(\d+)", thr)
    if chosen:
        shown = re.search(r"intra:([0-9.]+[KMG]?)", seen.get("UCX_RNDV_THRESH", ""))
        ok = shown is not None and _memunits(shown.group(1)) == int(chosen.group(1))
        res["threshold_applied"] = ok
        say(f"  ucx_info -c with UCX_CONFIG_DIR={conf_dir}: UCX_RNDV_THRESH="
            f"{seen.get('UCX_RNDV_THRESH', '?')} "
            f"({'applied' if ok else 'NOT the chosen value: the section did not apply'})")
    sizes = sorted(set(PROTO_SIZES) | set(_measured_sizes(meas)))
    peer = (meas.get("ucx") or {}).get("peer_device", args.device)
    devs = (None, None) if (args.device, peer) == (0, 0) else (args.device, peer)
    env_pi = dict(env, UCX_PROTO_INFO="y")
    out, _ = perftest_pair(ucx, env_pi, batch_lines(sizes, args.mem, devs[0]), timeout=120,
                           work=work / "verify",
                           server_tests=batch_lines(sizes, args.mem, devs[1]))
    got = parse_perftest(out)
    res["us"] = {s: got[f"s{s}"]["p50_us"] for s in sizes if f"s{s}" in got}
    res["protocols"] = protocol_lines(out, sizes, args.mem)
    return res


def _memunits(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def _measured_sizes(meas: dict[str, Any]) -> list[int]:
    return sorted({s for _n, (_r, us) in variant_table(meas).items() for s in us})


def protocol_lines(log: str, sizes: list[int], mem: str = "cuda") -> dict[int, str]:
    """The UCX_PROTO_INFO table row covering each size, for tagged sends from
    ``mem`` memory ("by ucp_tag_send* from cuda/GPU0", "... from host memory")."""
    out: dict[int, str] = {}
    for group in table_groups(log.splitlines()):
        rows = compact_table(group)
        if not rows or "ucp_tag_send" not in rows[0] or f"from {mem}" not in rows[0]:
            continue
        if any(f in rows[0] for f in FLAVOURS):
            continue
        for row in rows[1:]:
            f = row.split()
            rng = parse_range(f[0]) if f else None
            if rng is None and f and f[0].isdigit():
                rng = (int(f[0]), int(f[0]))
            if rng is None:
                continue
            for s in sizes:
                if rng[0] <= s <= rng[1] and s not in out:
                    out[s] = " ".join(f)
    return out


# ----------------------------------------------------------------------------
# command line


def _seg_sizes(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of byte counts: {text!r}") from exc
    bad = [x for x in out if not UCX_SEG < x <= SEG_MAX]
    if bad:
        raise argparse.ArgumentTypeError(
            f"segment sizes must lie in {UCX_SEG + 1}..{SEG_MAX} (UCX's fragment length is "
            f"16 bits): {bad}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ucx-prefix", default=os.environ.get("UCX_PREFIX"),
                   help="UCX installation to measure (bin/ucx_perftest; default $UCX_PREFIX, "
                        "else ucx_perftest on PATH)")
    p.add_argument("--no-ucx", action="store_true",
                   help="measure gdr_copy only (no thresholds)")
    p.add_argument("--config-dir", default=os.environ.get("UCX_CONFIG_DIR"),
                   help="folder of the ucx.conf to write (default $UCX_CONFIG_DIR)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the section, write nothing")
    p.add_argument("--from-json", metavar="FILE",
                   help="choose from measurements saved with --json (no GPU needed)")
    p.add_argument("--json", metavar="FILE", help="save the measurements and the choice")
    p.add_argument("--device", type=int, default=int(os.environ.get("GDRPY_DEVICE", "0")),
                   help="GPU to measure (default 0)")
    p.add_argument("--peer-device", type=int, default=None,
                   help="GPU of the second ucx_perftest process (default: the same GPU)")
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes and variants (about a third of the time)")
    p.add_argument("--seg-sizes", type=_seg_sizes, default=list(SEG_CANDIDATES),
                   help="shared-memory segment sizes tried besides UCX's 8256, each at most "
                        f"{SEG_MAX} (default {','.join(map(str, SEG_CANDIDATES))})")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the check run of UCX with the written section")
    p.add_argument("--work", help="folder for the measurement logs (default: a temporary one)")
    p.add_argument("--mem", choices=("cuda", "host"), default="cuda",
                   help="memory of the ucx_perftest buffers: cuda (default), or host to check "
                        "the plumbing without GPU buffers (then nothing is written)")


def print_measurements(meas: dict[str, Any], say: Callable[[str], None]) -> None:
    rows = (meas.get("copy") or {}).get("rows") or []
    if rows:
        say("gdr_copy through libgdrapi.so.2 and the copy engine (median us):")
        say(f"  {'size':>8} {'put':>9} {'get':>9} {'CE HtoD':>9} {'CE DtoH':>9}")
        for r in rows:
            if r["size"] in (8, 64, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 262144,
                             1 << 20, 4 << 20):
                say(f"  {fmt_size(r['size']):>8} {r.get('put_us', math.nan):9.2f} "
                    f"{r.get('get_us', math.nan):9.2f} {r.get('htod_us', math.nan):9.2f} "
                    f"{r.get('dtoh_us', math.nan):9.2f}")
    table = variant_table(meas)
    if table:
        sizes = _measured_sizes(meas)
        say("ucx_perftest tag_lat (median us):")
        say(f"  {'variant':<16}" + "".join(f"{fmt_size(s):>10}" for s in sizes))
        for name, (_rec, us) in table.items():
            say(f"  {name:<16}" + "".join(f"{us[s]:10.2f}" if s in us else f"{'-':>10}"
                                          for s in sizes))


def run(args: argparse.Namespace) -> int:
    say = print
    if args.from_json:
        try:
            meas = json.loads(Path(args.from_json).read_text())
        except (OSError, ValueError) as exc:
            raise ToolError(f"cannot read measurements from {args.from_json}: {exc}") from exc
        if not isinstance(meas, dict) or meas.get("schema") != SCHEMA:
            raise ToolError(f"{args.from_json} is not a measurements file of this tool "
                            f"(schema {SCHEMA})")
        ucx = None
    else:
        if os.environ.get("GDRPY_BACKEND") == "sim" and args.mem != "host":
            raise NeedsGPU("GDRPY_BACKEND=sim: this measures the GPU")
        ucx = None if args.no_ucx else find_ucx(args.ucx_prefix)
        work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gdrpy-ucxcfg-"))
        work.mkdir(parents=True, exist_ok=True)
        meas = measure(args, ucx, work, say)
    print_measurements(meas, say)
    choice = choose(meas)
    block = render_section(choice, meas)
    if choice.ranking:
        say("pairs ranked (geometric mean us, eager variant, rendezvous variant, threshold):")
        for c, e, r, t in choice.ranking[:6]:
            say(f"  {c:9.2f}  {e:<16} {r:<12} {t if t is not None else 'eager throughout'}")
    out: dict[str, Any] = {"measurements": meas, "choice": choice.as_dict()}
    dry = args.dry_run or args.mem == "host"
    if dry:
        say("the section (--dry-run: nothing written):" if args.dry_run else
            "the section (--mem host: host-memory numbers, nothing written):")
        say(block.rstrip("\n"))
    else:
        if not args.config_dir:
            raise ToolError("no folder to write to: give --config-dir DIR or set UCX_CONFIG_DIR "
                            "(or --dry-run to print the section)")
        conf_dir = Path(args.config_dir)
        refuse_ucx_install_dir(conf_dir, ucx.prefix if ucx else None)
        conf_dir.mkdir(parents=True, exist_ok=True)
        conf = conf_dir / "ucx.conf"
        old = conf.read_text() if conf.exists() else None
        new = merge_conf(old, block)
        tmp = conf.with_name(".ucx.conf.gdrpy-tmp")
        tmp.write_text(new)
        os.replace(tmp, conf)
        say(block.rstrip("\n"))
        say(f"written: {conf} ({'section replaced' if old and BEGIN in old else 'section added'})"
            f"; use it with UCX_CONFIG_DIR={conf_dir}")
        if ucx is not None and "ucx" in meas and not args.no_verify:
            say("checking UCX with the written section ...")
            v = verify(ucx, conf_dir, choice, meas, args, work, say)
            out["verify"] = v
            for s, line in sorted(v["protocols"].items()):
                say(f"  protocol at {fmt_size(s)}: {line}")
            if v["us"]:
                say("  tag_lat with the section (median us): " + ", ".join(
                    f"{fmt_size(s)} {u:.2f}" for s, u in sorted(v["us"].items())))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        say(f"measurements and choice: {args.json}")
    return 0


def cli(args: argparse.Namespace) -> int:
    try:
        return run(args)
    except NeedsGPU as exc:
        print(f"gdrpy ucx-config: needs a GPU: {exc}. On a machine without one, choose from "
              "recorded measurements: --from-json FILE --dry-run", file=sys.stderr)
        return 2
    except ToolError as exc:
        print(f"gdrpy ucx-config: {exc}", file=sys.stderr)
        return 2
