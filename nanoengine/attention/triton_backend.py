"""TritonBackend: the AttentionBackend protocol on the Triton kernels of triton_kernels.py.

On a machine without CUDA the kernels can only run under the Triton interpreter, which is chosen by
TRITON_INTERPRET=1 when the kernels are defined. Importing this module sets it if triton has not
been imported yet, and refuses to go on if triton was already imported without it.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.metadata import PackageNotFoundError, version

import numpy
import torch

from nanoengine.errors import BackendUnavailableError


def _ensure_runnable() -> None:
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        if sys.modules.get("triton") is not None:
            raise BackendUnavailableError(
                "TritonBackend without CUDA needs the Triton interpreter, but triton was already imported "
                "without it: set TRITON_INTERPRET=1 before importing triton (or torch._inductor), or use "
                "attention_backend='torch'."
            )
        os.environ["TRITON_INTERPRET"] = "1"
    if os.environ.get("TRITON_INTERPRET") == "1":
        try:
            check_interpreter_numpy(version("triton"), numpy.__version__)
        except PackageNotFoundError:  # no triton: importing the kernels below says so
            pass


def check_interpreter_numpy(triton_version: str, numpy_version: str) -> None:
    """Refuse Triton's interpreter before 3.7 under NumPy 2.4 or newer, naming the fix.

    That interpreter turns a one-element array into a Python index with int(), which NumPy 2.4 made an
    error; triton-lang/triton PR #9172 fixed it in Triton 3.7. Every kernel that loops over KV tiles
    would otherwise fail with "only 0-dimensional arrays can be converted to Python scalars".
    """
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        raise BackendUnavailableError(
            f"Triton {triton_version}'s interpreter cannot run under NumPy {numpy_version} (fixed in Triton 3.7, "
            "triton-lang/triton PR #9172). Install NumPy below 2.4 (pip install 'numpy<2.4') and restart the "
            "kernel, or use a Triton of 3.7 or newer."
        )


def _release(v: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", v)[:2])


_ensure_runnable()

from nanoengine.attention.triton_kernels import paged_decode, paged_prefill, store_kvcache


class TritonBackend:
    """Paged attention straight from the block tables: no gather, K/V read once per GQA group.

    Same contract as TorchBackend (see backend.py). decode picks split-K itself unless
    `decode_splits` fixes the number of splits (1 = never split).
    """

    name = "triton"
    # Its launchers never wait on the device (no .item(), no host copies), so a step can be captured.
    supports_cuda_graphs = True

    def __init__(self, decode_splits: int | None = None):
        self.decode_splits = decode_splits

    def store_kvcache(self, k, v, k_cache, v_cache, slot_mapping):
        store_kvcache(k, v, k_cache, v_cache, slot_mapping)

    def decode(
        self, q, k_cache, v_cache, block_tables, seq_lens, scale, num_common_prefix_blocks=0, sliding_window=None
    ):
        # The kernel reads each request's blocks in place, so a shared prefix needs no special path.
        return paged_decode(
            q,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            scale,
            num_splits=self.decode_splits,
            sliding_window=sliding_window,
        )

    def prefill(
        self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, max_query_len, scale, sliding_window=None
    ):
        return paged_prefill(
            q,
            k_cache,
            v_cache,
            block_tables,
            query_start_loc,
            seq_lens,
            max_query_len,
            scale,
            sliding_window=sliding_window,
        )
