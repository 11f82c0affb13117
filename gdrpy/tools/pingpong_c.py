"""The C side of the ping-pong benchmark: runs the tool ``gdrpy_chanpp``
(native/tools/gdrpy_chanpp.c) on the kernels ``gdrpy.tools.pingpong``
compiled, and turns its JSON lines into the benchmark's result rows."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile


def chanpp_path() -> str | None:
    """The tool: this tree's native/build, else the installed package's bin/."""
    import gdrpy
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for p in (os.path.join(root, "native", "build", "gdrpy_chanpp"),
              os.path.join(gdrpy.bindir(), "gdrpy_chanpp")):
        if os.access(p, os.X_OK):
            return p
    return None


def chanpp_command(tool: str, sizes, iters: int, batch: int, *, alloc: str = "vmm",
                   answer: str = "tag", plain: bool = False, near: bool = True,
                   cpu: int | None = None, device: int | None = None, warmup: int | None = None,
                   timeout_s: float | None = None, cubin: str | None = None) -> list[str]:
    """gdrpy_chanpp's command line for the C round trips (None: the tool's
    default); ``cubin``: the kernels' image, served by gdrpy_pp_serve."""
    cmd = [tool]
    if device is not None:
        cmd += ["--device", str(device)]
    cmd += ["--sizes", ",".join(map(str, sizes)), "--iters", str(iters)]
    if warmup is not None:
        cmd += ["--warmup", str(warmup)]
    cmd += ["--batch", str(batch)]
    if timeout_s is not None:
        cmd += ["--timeout", str(timeout_s)]
    cmd += ["--alloc", alloc, "--answer", answer] + (["--plain"] if plain else []) \
        + (["--near"] if near else [])
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    if cubin is not None:
        cmd += ["--cubin", cubin, "--kernel", "gdrpy_pp_serve"]
    return cmd


def c_roundtrips(ctx, sizes, iters: int, warmup: int, batch: int, tick: int, image: bytes | None,
                 cpu: int | None, timeout_s: float, alloc: str = "vmm",
                 plain: bool = False, near: bool = True, answer: str = "tag") -> dict:
    """Runs gdrpy_chanpp (``--sim`` on the sim backend, else on ``image``):
    {"command", "rows": its JSON rows, the info row's fields, "error"?}."""
    tool = chanpp_path()
    if tool is None:
        return {"error": "gdrpy_chanpp not found (build it with `make -C native tools`)"}
    sz = [tick] + [s for s in sizes if s != tick]
    with tempfile.TemporaryDirectory(prefix="gdrpy-pp-") as tmp:
        if ctx.is_sim:
            path = None
        else:
            if image is None:
                raise RuntimeError("the C ping-pong needs the NVRTC image of the kernels")
            path = os.path.join(tmp, "channel_kernels.cubin")
            with open(path, "wb") as f:
                f.write(image)
        cmd = chanpp_command(tool, sz, iters, batch, alloc=alloc, answer=answer, plain=plain,
                             near=near, cpu=cpu, device=ctx.device, warmup=warmup,
                             timeout_s=timeout_s, cubin=path)
        if ctx.is_sim:
            cmd.append("--sim")
        try:
            p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return {"error": "gdrpy_chanpp timed out", "command": " ".join(cmd)}
    rows = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    res = {"command": " ".join(cmd), "rows": [r for r in rows if r.get("path") != "info"]}
    res.update(next((r for r in rows if r.get("path") == "info"), {}))
    if p.returncode != 0:
        res["error"] = f"gdrpy_chanpp exited {p.returncode}: {p.stderr.strip()[-500:]}"
    return res


def _c_stats(row: dict) -> dict:
    """The C tool's JSON row -> gdrpy.tools.pingpong.summarize()'s keys."""
    return {"median": row["median_us"], "p90": row["p90_us"], "p99": row["p99_us"],
            "p99.9": row["p99.9_us"], "max": row["max_us"], "min": row["min_us"],
            "mean": row["mean_us"], "n": row["n"]}


def c_results(rows, sizes, batch: int, tick: int) -> list[dict]:
    """The benchmark's result rows ({size, path, stats_us}) from the tool's:
    c and c-avg10 per size, c-tick, and the batch (c-batchN) with the same
    batches taken apart (send_batch alone; up to the first and the second
    completion: c-batchN-send, -first, -second)."""
    out = []
    for row in rows:
        path, size = row["path"], row["size"]
        if path == "c":
            if size == tick:
                out.append({"size": tick, "path": "c-tick", "stats_us": _c_stats(row)})
            if size in sizes:
                out.append({"size": size, "path": "c", "stats_us": _c_stats(row)})
        elif path == "c-avg10" and size in sizes:
            out.append({"size": size, "path": "c-avg10", "stats_us": _c_stats(row)})
        elif path in ("c-batch", "c-batch-send", "c-batch-first", "c-batch-second"):
            out.append({"size": size, "path": path.replace("c-batch", f"c-batch{batch}"),
                        "stats_us": _c_stats(row)})
    return out
