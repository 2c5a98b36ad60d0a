"""VirtualFlow: elastic training on virtual nodes.

`virtualflow.torch` trains a user's own PyTorch model as one worker of a VirtualFlowJob started
by `vf run job.yaml` or by the Kubernetes operator.
"""

from virtualflow._core import CollectiveError, Error, JobMismatchError, NumericalError, cuda_plugin

__all__ = ["CollectiveError", "Error", "JobMismatchError", "NumericalError", "cuda_plugin"]
