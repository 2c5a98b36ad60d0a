"""Each patch in bench/torch/ (what `bench.py ab --patch` measures: the library without one of
its changes) still applies to today's virtualflow/torch.py, as bench.py applies it. A change to
torch.py that moves a patch's context (a reformat, a fix nearby) must carry the patch along, or
the measurement it stands for can no longer be made."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHES = sorted((ROOT / "bench" / "torch").glob("*.patch"))


def test_there_are_patches() -> None:
    assert PATCHES, "no bench/torch/*.patch found"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_the_patch_applies_to_todays_library(patch: Path, tmp_path: Path) -> None:
    lib = tmp_path / "virtualflow"
    lib.mkdir()
    shutil.copy(ROOT / "python" / "virtualflow" / "torch.py", lib / "torch.py")
    applied = subprocess.run(
        ["patch", "--dry-run", "-p3", "-d", str(lib), "-i", str(patch)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, (
        f"{patch.name} no longer applies to python/virtualflow/torch.py:\n"
        f"{applied.stdout}{applied.stderr}"
    )
