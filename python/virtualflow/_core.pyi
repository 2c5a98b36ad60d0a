"""VirtualFlow's agent library and runtime, bound for virtualflow.torch"""

from collections.abc import Sequence
from typing import Annotated, Any

import numpy
from numpy.typing import NDArray
import torch


class Error(RuntimeError):
    pass

class NumericalError(Error):
    pass

class CollectiveError(Error):
    pass

class JobMismatchError(Error):
    pass

BUILD: str = 'virtualflow 0.1.0'

ANOTHER_BUILD_REFUSAL: str = 'was refused: it runs build '

EXIT_ANOTHER_BUILD: int = 4

ENV_JOB_SPEC: str = 'VF_JOB_SPEC'

ENV_JOB: str = 'VF_JOB'

ENV_COORDINATOR: str = 'VF_COORDINATOR'

ENV_JOB_ID: str = 'VF_JOB_ID'

ENV_WORKER: str = 'VF_WORKER'

ENV_JOB_TOKEN_FILE: str = 'VF_JOB_TOKEN_FILE'

ENV_JOB_TOKEN: str = 'VF_JOB_TOKEN'

ENV_COORDINATOR_CA_FILE: str = 'VF_COORDINATOR_CA_FILE'

ENV_METRICS_PORT: str = 'VF_METRICS_PORT'

ENV_RESULT: str = 'VF_RESULT'

ENV_POD_IP: str = 'VF_POD_IP'

ENV_TERMINATION_MESSAGE_PATH: str = 'VF_TERMINATION_MESSAGE_PATH'

ENV_TEST_AGENT_PROTOCOL: str = 'VF_TEST_AGENT_PROTOCOL'

ENV_TIMEOUT: str = 'VF_TIMEOUT'

ENV_REPORT_INTERVAL: str = 'VF_REPORT_INTERVAL'

ENV_STEPS: str = 'VF_STEPS'

ENV_SLOWDOWN: str = 'VF_SLOWDOWN'

ENV_VNODE_DELAY_MS: str = 'VF_VNODE_DELAY_MS'

ENV_EXIT_WITH_PARENT: str = 'VF_EXIT_WITH_PARENT'

ENV_THREADS: str = 'VF_THREADS'

ENV_CHECK_EVERY: str = 'VF_CHECK_EVERY'

ENV_DEVICE: str = 'VF_DEVICE'

ENV_CUDA_PLUGIN: str = 'VF_CUDA_PLUGIN'

ENV_TORCH_FOLD: str = 'VF_TORCH_FOLD'

ENV_TORCH_FOLD_KERNEL: str = 'VF_TORCH_FOLD_KERNEL'

ENV_TORCH_COLLECTIVES: str = 'VF_TORCH_COLLECTIVES'

ENV_TORCH_STAGING: str = 'VF_TORCH_STAGING'

ENV_COMM_THREAD_NICE: str = 'VF_COMM_THREAD_NICE'

ENV_FAULT_INJECT: str = 'VF_FAULT_INJECT'

def parse_job(arg0: str, arg1: str, /) -> dict[str, Any]:
    """Parses and validates a VirtualFlowJob manifest (YAML or JSON)."""

def total_steps(arg0: str, arg1: int, /) -> int:
    """The job's length in steps on a training set of `dataset_size` samples."""

def mix_key(seed: int, a: int, b: int = 0, c: int = 0) -> int:
    """
    A counter-based 64-bit key of (seed, a, b, c): the per-virtual-node RNG seed.
    """

def seal(payload: object) -> bytes:
    """
    Wraps bytes (one bytes-like object, or a list of them taken one after the other) with a magic and a SHA-256, so corruption is found on read.
    """

def unseal(arg0: bytes, arg1: str, /) -> bytes:
    """
    The payload of seal(); raises for truncated, tampered or foreign bytes.
    """

def write_checkpoint(path: str, payload: object) -> None:
    """
    Writes seal(payload) atomically (temporary file, fsync, rename, fsync of the directory), without holding the GIL and without joining the pieces of a list first.
    """

def read_checkpoint(arg: str, /) -> bytes:
    """Reads and verifies what write_checkpoint wrote."""

def sha256_hex(arg: bytes, /) -> str:
    """Lower-case hex SHA-256."""

def fold_reference(grads: Annotated[torch.Tensor | NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu')], sizes: Sequence[int], exponents: Sequence[int]) -> tuple[list[int], list[int], bool]:
    """
    The exact reducer's own fold (the CPU's) of the rows of `grads`, virtual nodes' gradients, over consecutive buckets of `sizes` with `exponents` (INT32_MIN: only measured): (sums, each bucket's largest |gradient| bit pattern, overflow flag).
    """

class Sharder:
    def __init__(self, seed: int, dataset_size: int, global_batch: int, virtual_nodes: int) -> None: ...

    @staticmethod
    def check(arg0: int, arg1: int, arg2: int, /) -> None: ...

    @property
    def steps_per_epoch(self) -> int: ...

    @property
    def micro_batch(self) -> int: ...

    def epoch_of(self, arg: int, /) -> int: ...

    def indices(self, arg0: int, arg1: int, /) -> list[int]:
        """
        Sample indices of virtual node `vnode` at global step `step` (invariant 2).
        """

class Membership:
    @property
    def members(self) -> list[str]: ...

    @property
    def epoch(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int: ...

    @property
    def virtual_nodes(self) -> list[int]: ...

    @property
    def switched(self) -> bool: ...

class Worker:
    def __init__(self, coordinator: str, job_id: str, worker: str, token: str, fingerprint: str, build: str, timeout: float = 60.0, report_interval: float = 1.0, metrics_port: int = -1, host: str = '127.0.0.1', ca_file: str = '', termination_message_path: str = '') -> None: ...

    def ready(self) -> None: ...

    def collectives_on_nccl(self, cuda_device: int) -> None: ...

    def next(self, holder: object) -> Membership | None: ...

    def left_untold_on_request(self) -> bool: ...

    def configure_reducer(self, mode: str, sizes: Sequence[int], virtual_nodes: int) -> None: ...

    def begin(self) -> None: ...

    def add(self, grad: Annotated[torch.Tensor | NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu')]) -> None: ...

    def buckets(self) -> list[tuple[int, int]]: ...

    def add_folded(self, folded: Annotated[torch.Tensor | NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu')]) -> None: ...

    def add_folded_flags(self, flags: Annotated[torch.Tensor | NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu')]) -> None: ...

    def finish_kept(self) -> tuple[bool, float, int, int]: ...

    def add_loss(self, loss_sum: float, samples: int) -> None: ...

    def finish(self, mean_grad: Annotated[torch.Tensor | NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu')]) -> tuple[bool, float, int, int]: ...

    def exponents(self) -> list[int]: ...

    def set_exponents(self, arg: Sequence[int], /) -> None: ...

    def completed(self, step: int, loss: float, seconds: float, compute_seconds: float, samples: int, agreed_epoch: int, last_step: bool) -> None: ...

    def failed(self, step: int, message: str) -> None: ...

    def checkpoint_written(self, step: int, error: str) -> None: ...

    def finish_job(self, step: int, loss: float, weights_sha256: str, test_accuracy: float) -> bool: ...

    def all_gather(self, value: int) -> list[int]: ...

    def set_total_steps(self, total_steps: int) -> None: ...

    def close(self) -> None: ...

    @property
    def latest_epoch(self) -> int: ...

def exit_with_parent(arg: int, /) -> None:
    """Die with the process `parent` (vf run sets VF_EXIT_WITH_PARENT)."""

def leave_on_sigterm() -> None:
    """SIGTERM makes this worker leave gracefully at the next step boundary."""

def read_credential_file(path: str, what: str, worker: str, timeout: float) -> str:
    """
    The contents of a file the pod is given for the coordinator (its token, the CA), read again every half second for up to `timeout` seconds while it cannot be read or is empty; then CollectiveError: the worker exits 1 and is replaced, the job goes on.
    """

def cuda_plugin() -> str:
    """
    Loads libvirtualflow-cuda.so, which NCCL collectives need ($VF_CUDA_PLUGIN, else beside the executable), and returns its path; virtualflow.Error says why it cannot be loaded. Needs no GPU. Import torch first: the library uses the CUDA and NCCL libraries that PyTorch's wheels bring.
    """

def request_leave() -> None:
    """
    Leave the job gracefully at the next step boundary (what SIGTERM does).
    """
