"""virtualflow._core and the parts of virtualflow.torch that need no running job."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import virtualflow.torch as vf
from virtualflow import _core

JOB = textwrap.dedent(
    """\
    apiVersion: virtualflow.io/v1alpha1
    kind: VirtualFlowJob
    metadata: {name: unit}
    spec:
      virtualNodes: 4
      globalBatchSize: 32
      replicas: {min: 1, max: 4}
      epochs: 3
      seed: 5
    """
)


def test_parse_job_gives_the_typed_fields() -> None:
    spec = _core.parse_job(JOB, "job.yaml")
    assert spec["virtual_nodes"] == 4
    assert spec["micro_batch"] == 8
    assert spec["seed"] == 5
    assert spec["reduction"] == "exact"
    assert len(spec["fingerprint"]) == 64


def test_a_bad_job_is_a_value_error_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"spec\.globalBatchSize \(30\) must be divisible"):
        _core.parse_job(JOB.replace("globalBatchSize: 32", "globalBatchSize: 30"), "job.yaml")


def test_total_steps_follow_the_dataset_size() -> None:
    assert _core.total_steps(JOB, 100) == 3 * (100 // 32)
    assert _core.total_steps(JOB, 64) == 3 * 2
    with pytest.raises(ValueError):
        _core.total_steps(JOB, 16)  # smaller than one global batch


def test_the_nodes_of_a_step_split_one_global_batch_of_the_epoch_permutation() -> None:
    s = _core.Sharder(seed=5, dataset_size=100, global_batch=32, virtual_nodes=4)
    assert s.steps_per_epoch == 3
    step1 = [i for v in range(4) for i in s.indices(1, v)]
    step0 = [i for v in range(4) for i in s.indices(0, v)]
    assert all(len(s.indices(1, v)) == 8 for v in range(4))
    assert len(set(step0 + step1)) == 64  # no sample twice within an epoch
    assert all(0 <= i < 100 for i in step0 + step1)
    again = _core.Sharder(seed=5, dataset_size=100, global_batch=32, virtual_nodes=4)
    assert again.indices(1, 2) == s.indices(1, 2)  # a function of (seed, epoch, step, node)
    other_seed = _core.Sharder(seed=6, dataset_size=100, global_batch=32, virtual_nodes=4)
    assert other_seed.indices(1, 2) != s.indices(1, 2)


def test_node_seeds_are_a_function_of_seed_step_and_node() -> None:
    assert _core.mix_key(5, 1, 2) == _core.mix_key(5, 1, 2)
    assert len({_core.mix_key(5, 1, 2), _core.mix_key(5, 2, 1), _core.mix_key(6, 1, 2)}) == 3


def test_sealed_state_round_trips_and_tampering_is_found() -> None:
    sealed = _core.seal(b"state bytes")
    assert _core.unseal(sealed, "rank 0") == b"state bytes"
    bad = bytearray(sealed)
    bad[18] ^= 1  # in the payload
    with pytest.raises(_core.Error, match="rank 0: checksum mismatch"):
        _core.unseal(bytes(bad), "rank 0")


def test_checkpoint_files_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "dir" / "job.ckpt")
    _core.write_checkpoint(path, b"payload")
    assert _core.read_checkpoint(path) == b"payload"
    with pytest.raises(_core.Error, match="does not exist"):
        _core.read_checkpoint(str(tmp_path / "missing"))


def test_a_checkpoint_that_cannot_be_written_is_the_library_error(tmp_path: Path) -> None:
    # virtualflow.torch catches exactly this type to go on training after a failed write.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(_core.Error, match=str(blocker)):
        _core.write_checkpoint(str(blocker / "job.ckpt"), b"payload")


def test_weights_sha256_follows_the_documented_layout() -> None:
    sd = {"w": torch.tensor([[1.0, -2.0]]), "n": torch.tensor(3, dtype=torch.int64)}
    h = hashlib.sha256()
    h.update(b"w\0float32\0" + struct.pack("<q", 2) + struct.pack("<2q", 1, 2))
    h.update(struct.pack("<2f", 1.0, -2.0))
    h.update(b"n\0int64\0" + struct.pack("<q", 0) + struct.pack("<q", 3))
    assert vf.weights_sha256(sd) == h.hexdigest()
    sd["w"][0, 0] = 1.5
    assert vf.weights_sha256(sd) != h.hexdigest()


def test_a_different_model_is_described_by_its_first_difference() -> None:
    a = torch.nn.Linear(4, 2)
    b = torch.nn.Linear(4, 3)
    diff = vf._signature_difference(vf._signature(b), vf._signature(a))
    assert "'weight'" in diff and "[3, 4]" in diff and "[2, 4]" in diff
    c = torch.nn.Sequential(torch.nn.Linear(4, 2))
    assert "has not" in vf._signature_difference(vf._signature(c), vf._signature(a))


def test_init_outside_a_job_says_how_to_start_one() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VF_")}
    r = subprocess.run(
        [sys.executable, "-c", "import virtualflow.torch as vf; vf.init()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "vf run" in r.stderr


@pytest.mark.parametrize(
    "message, code",
    [
        ("worker w was refused: its job spec differs from the job's (HTTP 409)", 3),
        (
            "worker w " + _core.ANOTHER_BUILD_REFUSAL + "virtualflow 2, the job runs build "
            "virtualflow 1 (HTTP 409)",
            _core.EXIT_ANOTHER_BUILD,
        ),
    ],
)
def test_a_refusal_for_another_build_exits_with_its_own_code(message: str, code: int) -> None:
    """A worker refused for its build fails neither the job (exit 3) nor itself: it exits 4,
    and the operator replaces its pod with the job's image."""
    script = (
        "import virtualflow.torch as vf; vf._install_excepthook('w'); "
        "raise vf.JobMismatchError(%r)" % message
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stderr
    assert _core.EXIT_ANOTHER_BUILD == 4


def _init_with(**env: str) -> subprocess.CompletedProcess[str]:
    """vf.init() as a worker of JOB whose coordinator nobody serves, with ENV added."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("VF_")}
    base.update(
        VF_JOB_SPEC=JOB, VF_COORDINATOR="http://127.0.0.1:1", VF_WORKER="w0", VF_TIMEOUT="1", **env
    )
    return subprocess.run(
        [sys.executable, "-c", "import virtualflow.torch as vf; vf.init()"],
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unreadable_token_or_ca_file_replaces_the_worker_not_the_job(tmp_path: Path) -> None:
    # Exit 1 (the pod is replaced: a new one gets its volumes mounted afresh), never 3 (which
    # fails the job), after reading again for up to VF_TIMEOUT.
    missing = str(tmp_path / "missing")
    r = _init_with(VF_JOB_TOKEN_FILE=missing)
    assert r.returncode == 1, r.stderr
    assert (
        f"cannot read this worker's token file {missing} (No such file or directory); "
        "trying again for up to 1 s" in r.stderr
    )
    r = _init_with(VF_JOB_TOKEN="t0", VF_COORDINATOR_CA_FILE=missing)
    assert r.returncode == 1, r.stderr
    assert f"cannot read the coordinator's CA file {missing}" in r.stderr
