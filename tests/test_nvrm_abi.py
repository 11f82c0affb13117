"""The nvrm backend's RM definitions against every production branch's headers.

``native/src/backends/nvrm/abi/<branch>.json`` holds, per branch, the escape
numbers, argument sizes, struct layouts, class ids, control commands and
parameter layouts the backend uses, as the newest tag of the branch defines
them (made by ``scripts/nvrm_abi_extract.py``).  Here our own definitions
(``abi.h``) are compiled and compared, record by record, per branch; the
generated C tables must match the records; and the check is shown to fail on a
deliberately wrong definition.  No GPU needed.

The records themselves are regenerated from the driver's source only where a
clone of it is named: GDRPY_OPEN_GPU_KERNEL_MODULES=<a clone of
https://github.com/NVIDIA/open-gpu-kernel-modules> (``git clone --bare`` is
enough); without it those tests skip and say so.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import nvrm_abi_extract  # noqa: E402
from nvrm_abi_probe import evaluate  # noqa: E402
from nvrm_abi_spec import BRANCHES, RECORDS, ours_for  # noqa: E402

NVRM = os.path.join(ROOT, "native", "src", "backends", "nvrm")
ABIDIR = os.path.join(NVRM, "abi")
REPO = nvrm_abi_extract.repo_from_env()
NEEDS_REPO = pytest.mark.skipif(
    REPO is None, reason=f"set {nvrm_abi_extract.REPO_ENV} to a clone of "
                         f"{nvrm_abi_extract.REPO_URL} to compare the records with the driver's "
                         f"source (git clone --bare {nvrm_abi_extract.REPO_URL})")

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                                reason="no C compiler")


def _load(branch: str) -> dict:
    with open(os.path.join(ABIDIR, f"{branch}.json")) as f:
        return json.load(f)


def _ours(branch: str, incdir: str = NVRM) -> dict[str, int | None]:
    """Our values; items the branch's headers lack (null records) have no
    counterpart in our variant and are not evaluated."""
    rec = _load(branch)["records"]
    pairs = [(k, e) for k, e in ours_for(branch) if rec.get(k, 0) is not None]
    prelude = '#include <stdint.h>\n#include "abi.h"'
    vals = evaluate(prelude, [e for _, e in pairs], os.environ.get("CC", "cc"), [f"-I{incdir}"])
    return dict(zip([k for k, _ in pairs], vals, strict=True))


def _mismatches(branch: str, ours: dict[str, int | None]) -> list[str]:
    rec = _load(branch)["records"]
    bad = []
    for key, _, _ in RECORDS:
        if key not in rec:
            bad.append(f"{key}: no record for branch {branch} (regenerate the tables)")
        elif rec[key] is not None and ours.get(key) != rec[key]:
            bad.append(f"{key}: headers {rec[key]}, ours {ours[key]}")
    return bad


@pytest.mark.parametrize("branch", BRANCHES)
def test_our_definitions_match_branch(branch: str) -> None:
    doc = _load(branch)
    assert doc["branch"] == branch and doc["tag"].startswith(branch + ".")
    assert doc["arch"] == "x86_64"
    assert set(doc["records"]) == {k for k, _, _ in RECORDS}, \
        "the records and scripts/nvrm_abi_spec.py disagree: regenerate"
    bad = _mismatches(branch, _ours(branch))
    assert not bad, f"branch {branch} ({doc['tag']}):\n" + "\n".join(bad)


def test_a_record_missing_in_a_branch_has_a_variant() -> None:
    """Items a branch lacks (null records) are where we carry a variant."""
    for b in BRANCHES:
        nulls = [k for k, v in _load(b)["records"].items() if v is None]
        if b == "535":
            assert nulls and all("GET_EXPORT_OBJECT_INFO" in k and "gpuInstanceId" in k
                                 for k in nulls), nulls
        else:
            assert not nulls, (b, nulls)


def test_generated_c_tables_match_records() -> None:
    docs = [_load(b) for b in BRANCHES]
    with open(os.path.join(NVRM, "abi_tables.h")) as f:
        assert f.read() == nvrm_abi_extract.c_tables(docs), \
            "abi_tables.h is stale: scripts/nvrm_abi_extract.py --gen-c " \
            "native/src/backends/nvrm/abi"


@pytest.mark.parametrize("what,old,new,key", [
    ("an offset", "uint32_t hClient, hParent, hObject, hClientSrc, hObjectSrc, flags, status;",
     "uint32_t hClient, hParent, hObject, hClientSrc, pad_, hObjectSrc, flags, status;",
     "NVOS55_PARAMETERS.hObjectSrc.offset"),
    ("an escape number", "#define NV_ESC_RM_MAP_MEMORY 0x4E", "#define NV_ESC_RM_MAP_MEMORY 0x4D",
     "const.NV_ESC_RM_MAP_MEMORY"),
    ("a field size", "uint16_t numObjects, index;", "uint32_t numObjects; uint16_t index;",
     "NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS.numObjects.size"),
    ("the 535 variant",
     ("    uint16_t maxObjects;\n    uint8_t metadata[64];\n    uint8_t pad0[2];\n"
      "} nv0000_export_info_v535_t;"),
     ("    uint32_t maxObjects;\n    uint8_t metadata[64];\n"
      "} nv0000_export_info_v535_t;"),
     "NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS.metadata.offset"),
])
def test_check_catches_a_drifted_definition(tmp_path, what: str, old: str, new: str,
                                            key: str) -> None:
    with open(os.path.join(NVRM, "abi.h")) as f:
        src = f.read()
    assert src.count(old) == 1, f"test setup: {old!r} not found once in abi.h"
    (tmp_path / "abi.h").write_text(src.replace(old, new))
    branch = "535" if "535" in what else "580"
    bad = _mismatches(branch, _ours(branch, str(tmp_path)))
    assert any(b.startswith(key + ":") for b in bad), (what, bad)


@NEEDS_REPO
@pytest.mark.parametrize("branch", BRANCHES)
def test_records_are_what_the_newest_tag_says(branch: str, tmp_path) -> None:
    """Regenerates the branch's records from its newest tag: the committed JSON
    must be exactly that (so a newer tag with a change shows up here)."""
    assert REPO is not None
    why = nvrm_abi_extract.check_repo(REPO)
    assert why is None, f"{nvrm_abi_extract.REPO_ENV}: {why}"
    tag = nvrm_abi_extract.newest_tag(REPO, branch)
    out = tmp_path / f"{branch}.json"
    assert nvrm_abi_extract.main(["--repo", REPO, "--tag", tag, "--out", str(out)]) == 0
    fresh = json.loads(out.read_text())
    stored = _load(branch)
    assert stored["tag"] == tag, f"a newer tag of {branch} exists: {tag}; regenerate"
    diff = {k: (stored["records"].get(k), v) for k, v in fresh["records"].items()
            if stored["records"].get(k) != v}
    assert not diff, diff


def test_probe_parses_cross_compiler_assembly() -> None:
    """The probe reads .quad (x86-64 gcc), .xword (aarch64 gcc), .8byte and
    .zero runs: what a cross compiler would emit for an aarch64 extraction."""
    from nvrm_abi_probe import _SYM, _parse_asm
    asm = (f"\t.align 3\n{_SYM}:\n\t.xword\t72\n\t.zero\t16\n\t.8byte\t0x20\n"
           "\t.quad\t5\n\t.size x, 40\n")
    assert _parse_asm(asm, 5) == [72, 0, 0, 32, 5]
    with pytest.raises(RuntimeError):
        _parse_asm(asm, 6)


def test_extract_says_which_clone_it_needs(tmp_path, monkeypatch, capsys) -> None:
    """Without --repo and without the variable, or with a folder that is not a
    clone, the extractor stops with a message naming the variable, the clone
    URL and the command."""
    monkeypatch.delenv(nvrm_abi_extract.REPO_ENV, raising=False)
    with pytest.raises(SystemExit) as e:
        nvrm_abi_extract.main(["--all", "--outdir", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert nvrm_abi_extract.REPO_ENV in err and "git clone --bare" in err, err
    monkeypatch.setenv(nvrm_abi_extract.REPO_ENV, str(tmp_path))
    with pytest.raises(SystemExit):
        nvrm_abi_extract.main(["--all", "--outdir", str(tmp_path)])
    err = capsys.readouterr().err
    assert f"{tmp_path} is not a git clone of {nvrm_abi_extract.REPO_URL}" in err, err
    assert not list(tmp_path.iterdir()), "nothing may be written"
