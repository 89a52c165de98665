"""Kernel tests: a GPU test must not silently run its kernels on the Triton interpreter."""

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _gpu_tests_compile_for_the_gpu(request):
    # The interpreter has no bf16 and ignores what the GPU compiler rejects (tl.dot below 16), so a
    # GPU test under TRITON_INTERPRET=1 would check nothing it is meant to.
    if "gpu" in request.keywords and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.fail(
            "TRITON_INTERPRET=1 on a CUDA machine: the kernels would run on the interpreter. "
            "Set TRITON_INTERPRET only where there is no CUDA (tests/conftest.py)."
        )
