#!/usr/bin/env python3
"""Derives the nvrm backend's ABI records from one NVIDIA driver tag's headers.

The headers come from NVIDIA/open-gpu-kernel-modules (a git clone with
``--repo`` + ``--tag``, or an unpacked tree with ``--tree``); they are unpacked
into a temporary directory, compiled into a probe (sizeof/offsetof/#define
values, see scripts/nvrm_abi_spec.py), and deleted.  Nothing of the driver's
source is written to the project: only the numbers, as JSON.  Without
``--repo``, the clone named by the environment variable
GDRPY_OPEN_GPU_KERNEL_MODULES is read; get one with

    git clone --bare https://github.com/NVIDIA/open-gpu-kernel-modules

    scripts/nvrm_abi_extract.py --repo open-gpu-kernel-modules.git \\
        --all --outdir native/src/backends/nvrm/abi
    scripts/nvrm_abi_extract.py --repo R --tag 580.142 --out -
    scripts/nvrm_abi_extract.py --repo R --all --cc aarch64-linux-gnu-gcc --outdir /tmp/arm
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvrm_abi_probe import arch_of, evaluate, target_of
from nvrm_abi_spec import BRANCHES, HEADER_DIRS, HEADERS, RECORDS

# The environment variable naming a clone of the driver's source, and where
# to get one.
REPO_ENV = "GDRPY_OPEN_GPU_KERNEL_MODULES"
REPO_URL = "https://github.com/NVIDIA/open-gpu-kernel-modules"


def repo_from_env() -> str | None:
    """The clone GDRPY_OPEN_GPU_KERNEL_MODULES names, or None when unset."""
    return os.environ.get(REPO_ENV) or None


def check_repo(repo: str) -> str | None:
    """Why `repo` cannot serve as the driver source, or None if it can."""
    r = subprocess.run(["git", "-C", repo, "rev-parse", "--git-dir"], capture_output=True,
                       text=True)
    if r.returncode:
        return (f"{repo} is not a git clone of {REPO_URL} "
                f"({r.stderr.strip() or 'git rev-parse failed'}); get one with "
                f"`git clone --bare {REPO_URL}`")
    return None


def newest_tag(repo: str, branch: str) -> str:
    tags = subprocess.run(["git", "-C", repo, "tag"], capture_output=True, text=True,
                          check=True).stdout.split()
    mine = [t for t in tags if re.fullmatch(rf"{branch}\.\d+(\.\d+)*", t)]
    if not mine:
        raise SystemExit(f"no tag of branch {branch} in {repo}")
    return max(mine, key=lambda t: tuple(int(x) for x in t.split(".")))


def unpack(repo: str, tag: str, dest: str) -> None:
    arch = subprocess.Popen(["git", "-C", repo, "archive", tag, *HEADER_DIRS],
                            stdout=subprocess.PIPE)
    subprocess.run(["tar", "x", "-C", dest], stdin=arch.stdout, check=True)
    if arch.wait():
        raise SystemExit(f"git archive {tag} failed")


def extract(tree: str, cc: str, cflags: list[str]) -> dict[str, int | None]:
    inc = [f"-I{os.path.join(tree, d)}" for d in HEADER_DIRS]
    prelude = "\n".join(f"#include <{h}>" for h in HEADERS)
    flags = [*cflags, *inc]
    try:
        vals: list[int | None] = list(evaluate(prelude, [t for _, t, _ in RECORDS], cc, flags))
    except RuntimeError:
        # Some item does not exist in this tag (e.g. a field added later):
        # evaluate one by one; what does not compile is recorded as null.
        vals = []
        for _, theirs, _ in RECORDS:
            try:
                vals.append(evaluate(prelude, [theirs], cc, flags)[0])
            except RuntimeError:
                vals.append(None)
        if all(v is None for v in vals):
            raise
    return {key: v for (key, _, _), v in zip(RECORDS, vals, strict=True)}


def record(tag: str, tree: str, cc: str, cflags: list[str]) -> dict:
    triple = target_of(cc, cflags)
    return {
        "branch": tag.split(".")[0],
        "tag": tag,
        "source": "NVIDIA/open-gpu-kernel-modules",
        "arch": arch_of(triple),
        "generator": "scripts/nvrm_abi_extract.py",
        "records": extract(tree, cc, cflags),
    }


# struct nvrm_abi field <- record key (see native/src/backends/nvrm/abi.h)
_ESC = {
    "card_info": ("NV_ESC_CARD_INFO", "nv_ioctl_card_info_t"),
    "check_version": ("NV_ESC_CHECK_VERSION_STR", "nv_ioctl_rm_api_version_t"),
    "rm_free": ("NV_ESC_RM_FREE", "NVOS00_PARAMETERS"),
    "rm_control": ("NV_ESC_RM_CONTROL", "NVOS54_PARAMETERS"),
    "rm_alloc": ("NV_ESC_RM_ALLOC", "NVOS21_PARAMETERS"),
    "rm_dup": ("NV_ESC_RM_DUP_OBJECT", "NVOS55_PARAMETERS"),
    "rm_map": ("NV_ESC_RM_MAP_MEMORY", "nv_ioctl_nvos33_parameters_with_fd"),
    "rm_unmap": ("NV_ESC_RM_UNMAP_MEMORY", "NVOS34_PARAMETERS"),
}
_EXP = "NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS"
_FIELDS = {
    "version_cmd_query": "const.NV_RM_API_VERSION_CMD_QUERY",
    "cls_root_client": "const.NV01_ROOT_CLIENT",
    "cls_device": "const.NV01_DEVICE_0",
    "ctrl_gpu_id_info_v2": "const.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2",
    "ctrl_export_info": "const.NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO",
    "ctrl_import_from_fd": "const.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD",
    "size_device_alloc": "NV0080_ALLOC_PARAMETERS.sizeof",
    "size_id_info_v2": "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS.sizeof",
    "size_export_info": f"{_EXP}.sizeof",
    "size_import_from_fd": "NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS.sizeof",
    "export_off_device_instance": f"{_EXP}.deviceInstance.offset",
    "export_off_max_objects": f"{_EXP}.maxObjects.offset",
    "import_type_vidmem": "const.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM",
    "caching_lo": "const.NVOS33_FLAGS_CACHING_TYPE.lo",
    "caching_hi": "const.NVOS33_FLAGS_CACHING_TYPE.hi",
}


def c_tables(docs: list[dict]) -> str:
    """abi_tables.h: one struct nvrm_abi per branch, oldest first."""
    out = ["/* Generated by scripts/nvrm_abi_extract.py --gen-c from abi/<branch>.json:",
           " * do not edit.  One entry per production branch, oldest first; each from",
           " * the newest tag of its branch in NVIDIA/open-gpu-kernel-modules. */",
           "/* generated text, compared verbatim by tests/test_nvrm_abi.py */",
           "/* clang-format off */",
           "#ifndef GDRPY_NVRM_ABI_TABLES_H", "#define GDRPY_NVRM_ABI_TABLES_H", "",
           '#include "abi.h"', "",
           "static const struct nvrm_abi nvrm_abi_tables[] = {"]
    for d in sorted(docs, key=lambda d: int(d["branch"])):
        r = d["records"]
        out.append(f'    {{.branch = "{d["branch"]}", .tag = "{d["tag"]}",')
        for f, (nr, st) in _ESC.items():
            out.append(f"     .{f} = {{{r['const.' + nr]}, {r[st + '.sizeof']}}},")
        items = [f".{f} = {r[k]}" for f, k in _FIELDS.items()]
        line = "    "
        for it in items:
            if len(line) + len(it) + 2 > 92:
                out.append(line.rstrip())
                line = "    "
            line += " " + it + ","
        out.append(line.rstrip())
        out.append("    },")
    out += ["};", "", "#endif /* GDRPY_NVRM_ABI_TABLES_H */", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--gen-c", metavar="ABIDIR",
                     help="write ABIDIR/../abi_tables.h from ABIDIR/*.json and exit")
    src.add_argument("--repo", help=f"a git clone (bare or not) of {REPO_URL} "
                                    f"(default: ${REPO_ENV})")
    src.add_argument("--tree", help="an unpacked tag (checkout or git archive)")
    ap.add_argument("--tag", help="tag to read (with --repo), or the tag --tree holds")
    ap.add_argument("--all", action="store_true",
                    help=f"newest tag of each branch {', '.join(BRANCHES)} (with --repo)")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"),
                    help="compiler (a cross compiler or 'clang --target=...' for other ABIs)")
    ap.add_argument("--cflags", default="", help="extra compiler flags")
    ap.add_argument("--out", help="output JSON file ('-' = stdout)")
    ap.add_argument("--outdir", help="with --all: write <branch>.json here")
    a = ap.parse_args(argv)
    cflags = a.cflags.split()
    if a.gen_c:
        docs = []
        for n in sorted(os.listdir(a.gen_c)):
            if n.endswith(".json"):
                with open(os.path.join(a.gen_c, n)) as f:
                    docs.append(json.load(f))
        path = os.path.join(os.path.dirname(os.path.abspath(a.gen_c)), "abi_tables.h")
        with open(path, "w") as f:
            f.write(c_tables(docs))
        print(f"{len(docs)} tables -> {path}", file=sys.stderr)
        return 0
    if a.tree:
        if not a.tag:
            ap.error("--tree needs --tag (the tag the tree holds)")
        docs = [record(a.tag, a.tree, a.cc, cflags)]
    else:
        a.repo = a.repo or repo_from_env()
        if not a.repo:
            ap.error(f"no driver source: pass --repo CLONE or set {REPO_ENV} to a clone of "
                     f"{REPO_URL} (`git clone --bare {REPO_URL}`), or --tree an unpacked tag")
        why = check_repo(a.repo)
        if why:
            ap.error(why)
        tags = [newest_tag(a.repo, b) for b in BRANCHES] if a.all else [a.tag]
        if not tags[0]:
            ap.error("--repo needs --tag or --all")
        docs = []
        for tag in tags:
            with tempfile.TemporaryDirectory(prefix=f"nvrm-abi-{tag}-") as tmp:
                unpack(a.repo, tag, tmp)
                docs.append(record(tag, tmp, a.cc, cflags))
    for doc in docs:
        text = json.dumps(doc, indent=1, sort_keys=False) + "\n"
        if a.outdir:
            os.makedirs(a.outdir, exist_ok=True)
            path = os.path.join(a.outdir, f"{doc['branch']}.json")
            with open(path, "w") as f:
                f.write(text)
            print(f"{doc['tag']}: {len(doc['records'])} records -> {path}", file=sys.stderr)
        elif a.out and a.out != "-":
            with open(a.out, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
