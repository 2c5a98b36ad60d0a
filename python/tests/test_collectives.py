"""Which collectives a PyTorch worker asks its agent for (VF_TORCH_COLLECTIVES)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import virtualflow
import virtualflow.torch as vf

# The CUDA plugin of the build whose package this is (build/bin beside build/python).
BUILD_PLUGIN = Path(virtualflow.__file__).parents[2] / "bin" / "libvirtualflow-cuda.so"


def test_gloo_unless_nccl_is_asked_for_a_model_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.delenv("VF_TORCH_COLLECTIVES", raising=False)
    assert vf._collectives(cpu) == "gloo" and vf._collectives(cuda) == "gloo"
    monkeypatch.setenv("VF_TORCH_COLLECTIVES", "gloo")
    assert vf._collectives(cuda) == "gloo"
    monkeypatch.setenv("VF_TORCH_COLLECTIVES", "nccl")
    assert vf._collectives(cuda) == "nccl"
    with pytest.raises(vf.MisuseError, match="the model is on cpu"):
        vf._collectives(cpu)
    monkeypatch.setenv("VF_TORCH_COLLECTIVES", "mpi")
    with pytest.raises(vf.Error, match="'gloo' or 'nccl'"):
        vf._collectives(cuda)


def load_plugin(named: str | None) -> subprocess.CompletedProcess[str]:
    """virtualflow.cuda_plugin() in a fresh interpreter (a process loads the plugin once), with
    VF_CUDA_PLUGIN=NAMED, or unset."""
    env = {k: v for k, v in os.environ.items() if k != "VF_CUDA_PLUGIN"}
    if named is not None:
        env["VF_CUDA_PLUGIN"] = named
    code = "import torch, virtualflow\nprint(virtualflow.cuda_plugin())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_cuda_plugin_is_looked_for_beside_the_interpreter_unless_named(
    tmp_path: Path,
) -> None:
    beside = Path(os.path.realpath(sys.executable)).parent / "libvirtualflow-cuda.so"
    if beside.exists():
        pytest.skip(f"{beside} exists")
    unset = load_plugin(None)
    assert unset.returncode != 0
    assert f"Error: no CUDA support: {beside} not found" in unset.stderr
    assert "VF_CUDA_PLUGIN names it" in unset.stderr
    not_a_library = tmp_path / "libvirtualflow-cuda.so"
    not_a_library.write_text("not a shared library")
    broken = load_plugin(str(not_a_library))
    assert broken.returncode != 0
    assert f"Error: cannot load {not_a_library}: " in broken.stderr


@pytest.mark.skipif(not BUILD_PLUGIN.exists(), reason="a build without CUDA (VF_CUDA=off)")
def test_the_builds_cuda_plugin_loads_without_a_gpu() -> None:
    loaded = load_plugin(str(BUILD_PLUGIN))
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == str(BUILD_PLUGIN)
