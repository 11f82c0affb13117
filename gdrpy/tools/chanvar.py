"""``python -m gdrpy bench pingpong --variants``: the channel's round trip
taken apart, protocol choice by protocol choice.

The variant table lives in the C tool (``gdrpy_chanpp --list-variants``:
name, ``-D`` macros, whether the variant is correct by the memory model).
This module compiles ``chanvar_kernels.cu`` once per variant with NVRTC
(in this process; nvcc when NVRTC is missing), writes the images to a
temporary directory and runs ``gdrpy_chanpp --variants`` on them, which
measures every variant interleaved in rounds and prints the table.  On sim
the tool's CPU stand-in answers instead of kernels.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

__all__ = ["list_variants", "compile_variants", "run_variants"]

KERNEL_FILE = "chanvar_kernels.cu"


def list_variants(tool: str) -> list[tuple[str, list[str], str, str]]:
    """(name, macros, 'model' | 'empirical', description) per variant."""
    p = subprocess.run([tool, "--list-variants"], check=True, capture_output=True, text=True,
                       timeout=30)
    out = []
    for line in p.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            out.append((parts[0], parts[1].split(), parts[2], parts[3]))
    return out


def _nvcc_compile(src_path: str, cc: tuple, macros: list[str], out: str) -> None:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    subprocess.run([nvcc, "-cubin", f"-arch=sm_{cc[0]}{cc[1]}", *macros, "-o", out, src_path],
                   check=True, capture_output=True, text=True, timeout=120)


def compile_variants(device: int, variants, outdir: str, log=print) -> dict[str, str]:
    """Compiles every variant into ``outdir/NAME.cubin`` (or ``.ptx``);
    returns {name: error} for those that failed (the tool reports them as
    missing images)."""
    from .cuda_rt import GpuRuntime, include_dirs, nvrtc_compile
    rt = GpuRuntime(device)
    here = os.path.dirname(os.path.abspath(__file__))
    errors: dict[str, str] = {}
    for name, macros, _order, _what in variants:
        if macros and macros[0].startswith("@"):   # a shipped kernel file, e.g. the library's
            # this directory first: a frozen reference kernel's own header copy
            fname = macros[0][1:]
            macros = [f"-I{here}"] + [f"-I{d}" for d in include_dirs()] + macros[1:]
        else:
            fname = KERNEL_FILE
        src_path = os.path.join(here, fname)
        with open(src_path) as f:
            src = f.read()
        try:
            image, kind, _arch = nvrtc_compile(src, rt.cc, fname, macros)
            with open(os.path.join(outdir, f"{name}.{kind}"), "wb") as f:
                f.write(image)
        except Exception as e:  # NVRTC missing or failing: try nvcc
            try:
                _nvcc_compile(src_path, rt.cc, macros, os.path.join(outdir, f"{name}.cubin"))
                log(f"chanvar: {name}: NVRTC failed ({e}); compiled with nvcc")
            except (OSError, subprocess.SubprocessError) as e2:
                errors[name] = f"{e}; nvcc: {e2}"
                log(f"chanvar: {name}: cannot compile: {errors[name]}")
    return errors


def run_variants(ctx, tool: str, iters: int = 20000, rounds: int = 5, warmup: int = 500,
                 cpu: int | None = None, only: str | None = None, timeout_s: float = 1.0,
                 log=print, alloc: str = "cumemalloc") -> int:
    """Compiles (GPU) and runs every variant; the tool's table goes to stdout.
    Returns the tool's exit status (0: every variant ran and passed)."""
    cmd = [tool, "--variants", "--device", str(ctx.device), "--iters", str(iters), "--rounds",
           str(rounds), "--warmup", str(warmup), "--timeout", str(timeout_s), "--alloc", alloc]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    if only:
        cmd += ["--only", only]
    with tempfile.TemporaryDirectory(prefix="gdrpy-chanvar-") as tmp:
        if ctx.is_sim:
            cmd.append("--sim")
        else:
            variants = list_variants(tool)
            if only:
                keep = set(only.split(","))
                variants = [v for v in variants if v[0] in keep]
            compile_variants(ctx.device, variants, tmp, log)
            cmd += ["--cubin-dir", tmp]
        log("command: " + " ".join(cmd))
        sys.stdout.flush()
        try:
            p = subprocess.run(cmd, check=False, timeout=200)
        except subprocess.TimeoutExpired:
            log("chanvar: gdrpy_chanpp --variants timed out after 200 s")
            return 124
    return p.returncode
