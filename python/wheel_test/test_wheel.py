"""`pip install ./python` builds the virtualflow wheel from the repository's sources, and the
installed package passes the package's own tests (python/tests), with no build tree in sight."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1500, **kw)  # type: ignore[call-overload]


def test_the_wheel_builds_installs_and_passes_the_package_tests(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # The compiler cache that scripts/build.sh fills, when there is one: the wheel compiles the
    # same sources.
    if os.environ.get("VF_CCACHE_DIR"):
        env["CMAKE_ARGS"] = "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
        env["CCACHE_DIR"] = os.environ["VF_CCACHE_DIR"]
    built = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-w",
            str(tmp_path / "dist"),
            str(PACKAGE_DIR),
        ],
        env=env,
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    (wheel,) = (tmp_path / "dist").glob("virtualflow-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "virtualflow/torch.py" in names
    assert any(n.startswith("virtualflow/_core.") and n.endswith(".so") for n in names), names

    # Installed on its own, away from the build tree, next to this environment's PyTorch.
    site = tmp_path / "site"
    installed = run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        env=env,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    env["PYTHONPATH"] = str(site)
    where = run(
        [sys.executable, "-c", "import virtualflow._core as c; print(c.__file__)"],
        env=env,
        cwd=tmp_path,
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(site)), where.stdout
    tests = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(PACKAGE_DIR / "tests"),
        ],
        env=env,
        cwd=tmp_path,
    )
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-4000:]
