"""Copy kernels per CPU architecture (issue 20): what the build offers on this
machine's architecture, and that the reasons for the kernels it cannot use are
reported.  Runs natively on x86-64 and, in CI, on aarch64 under qemu-user
(scripts/ci/90-arm64.sh)."""

from __future__ import annotations

import platform
import re

import pytest

import gdrpy
from gdrpy import errors

MACHINE = platform.machine()
KERNELS = {
    "x86_64": {"avx512", "avx2", "movdir64b", "sse41", "generic"},
    "aarch64": {"neon", "ls64", "generic"},
}


def test_available_kernels_belong_to_this_architecture():
    avail = gdrpy.copy_isa_available()
    assert "generic" in avail, avail
    assert gdrpy.copy_isa() in avail
    known = KERNELS.get(MACHINE, {"generic"})
    assert set(avail) <= known, (MACHINE, avail)


def test_notes_are_name_colon_reason_lines():
    notes = gdrpy.copy_isa_notes()
    assert isinstance(notes, list)
    for note in notes:
        assert re.match(r"^[a-z0-9]+: \S.+$", note), note
        assert note.split(":", 1)[0] in KERNELS.get(MACHINE, {"generic"}), note


@pytest.mark.skipif(MACHINE != "aarch64", reason="aarch64 only")
def test_aarch64_auto_is_neon_and_ls64_is_explained():
    # Every AArch64 Linux CPU we can meet reports ASIMD (qemu's default CPU does).
    assert gdrpy.copy_isa() == "neon"
    assert any(n.startswith("ls64: ") for n in gdrpy.copy_isa_notes()), gdrpy.copy_isa_notes()
    assert not any(n.startswith("neon: ") for n in gdrpy.copy_isa_notes())


@pytest.mark.skipif(MACHINE != "aarch64", reason="aarch64 only")
def test_aarch64_has_no_x86_kernels():
    for name in ("avx2", "sse41", "avx512", "movdir64b"):
        with pytest.raises(errors.InvalidArgumentError, match=name):
            gdrpy.set_copy_isa(name)
    gdrpy.set_copy_isa("auto")


@pytest.mark.skipif(MACHINE != "x86_64", reason="x86-64 only")
def test_x86_has_no_arm_kernels():
    for name in ("neon", "ls64"):
        with pytest.raises(errors.InvalidArgumentError, match=name):
            gdrpy.set_copy_isa(name)
    gdrpy.set_copy_isa("auto")
