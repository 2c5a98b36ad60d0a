"""The stub of virtualflow._core in the sources (python/virtualflow/_core.pyi, what mypy checks
virtualflow.torch and the examples against) is what nanobind's stub generator writes for the
built module, with python/src/core_stub_patterns.txt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1]
STUB = PYTHON_DIR / "virtualflow" / "_core.pyi"
PATTERNS = PYTHON_DIR / "src" / "core_stub_patterns.txt"


def test_the_stub_is_the_one_the_built_module_gives(tmp_path: Path) -> None:
    out = tmp_path / "_core.pyi"
    generated = subprocess.run(
        [sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "virtualflow._core"]
        + ["-p", str(PATTERNS), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # the package from the path the test runs with, not a source folder
    )
    assert generated.returncode == 0, generated.stdout + generated.stderr
    assert out.read_text() == STUB.read_text(), (
        "python/virtualflow/_core.pyi differs from the built module's; write it again with "
        "PYTHONPATH=build/python python -m nanobind.stubgen -m virtualflow._core "
        "-p python/src/core_stub_patterns.txt -o python/virtualflow/_core.pyi"
    )
