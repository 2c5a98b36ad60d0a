"""Which collectives a PyTorch worker asks its agent for (VF_TORCH_COLLECTIVES)."""

from __future__ import annotations

import pytest
import torch

import virtualflow.torch as vf


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
