"""vf.init's deterministic algorithms: PyTorch's switch and Inductor's flag both set, without
importing Inductor (seconds of every worker's start) unless it is already loaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import sys
import torch
{before}
import virtualflow.torch as vf
vf._use_deterministic_algorithms()
print("enabled", torch.are_deterministic_algorithms_enabled())
print("inductor loaded by the call", {check_loaded})
import torch._inductor.config as inductor_config
print("inductor flag", inductor_config.deterministic)
"""


def run_probe(before: str, check_loaded: str) -> list[str]:
    env = dict(os.environ)
    env.pop("TORCHINDUCTOR_DETERMINISTIC", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before, check_loaded=check_loaded)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    "before, check_loaded",
    [
        # A fresh worker: Inductor is not imported by the call, and reads the flag when a later
        # torch.compile imports it.
        ("", "'torch._inductor' in sys.modules"),
        # Inductor loaded first: PyTorch's own call sets its flag.
        ("import torch._inductor.config", "False"),
    ],
)
def test_both_switches_are_set_and_inductor_is_not_imported_for_them(
    before: str, check_loaded: str
) -> None:
    assert run_probe(before, check_loaded) == [
        "enabled True",
        "inductor loaded by the call False",
        "inductor flag True",
    ]
