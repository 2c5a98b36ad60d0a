"""Parameters in lower precision are refused with the reason and what to do instead: the exact
reduction sums float32 gradients, and autocast keeps float32 master weights."""

from __future__ import annotations

import pytest
import torch

import virtualflow.torch as vf
from virtualflow.torch import _check_parameter_dtypes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_a_parameter_that_is_not_float32_is_refused_saying_why(dtype: torch.dtype) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2).to(dtype))
    with pytest.raises(vf.MisuseError) as refused:
        _check_parameter_dtypes(model)
    message = str(refused.value)
    assert f"parameter '1.weight' is {dtype}" in message
    assert "float32 parameters only" in message
    assert "exact reduction sums every node's float32 gradients" in message
    assert "torch.autocast" in message and "master weights" in message


def test_float32_parameters_and_frozen_ones_of_any_dtype_pass() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2).to(torch.bfloat16))
    model[1].requires_grad_(False)  # frozen: no gradient to reduce
    _check_parameter_dtypes(model)


def test_a_float32_model_under_bfloat16_autocast_keeps_float32_gradients() -> None:
    # What the library reduces: autocast computes in bfloat16, the gradients of the float32
    # parameters come back float32.
    model = torch.nn.Linear(4, 2)
    _check_parameter_dtypes(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(3, 4))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert model.weight.grad is not None and model.weight.grad.dtype == torch.float32
