"""Recognising a run that died of GPU out-of-memory, from its log."""

from __future__ import annotations

import re

# The messages PyTorch, TensorFlow, JAX/XLA and raw CUDA print on GPU OOM. Compiled at the first
# failed run (by re's own cache), not at every start.
_PATTERNS = [
    ("PyTorch", r"(torch\.(cuda\.)?OutOfMemoryError|CUDA out of memory)"),
    ("TensorFlow", r"(ResourceExhaustedError|OOM when allocating tensor)"),
    ("JAX", r"RESOURCE_EXHAUSTED: Out of memory"),
    (
        "CUDA",
        r"(cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED"
        r"|CUDNN_STATUS_ALLOC_FAILED|out of memory on device)",
    ),
]


def detect_oom(log_tail: str) -> str | None:
    """The framework whose out-of-memory message is in ``log_tail``, or None.

    >>> detect_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    'PyTorch'
    >>> detect_oom("ValueError: bad shape") is None
    True
    """
    for framework, pattern in _PATTERNS:
        if re.search(pattern, log_tail):
            return framework
    return None
