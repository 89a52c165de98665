"""The attention seam: the one place the model meets the KV cache.

The model calls `attn(layer_idx, q, k, v)` with the step's new tokens, flattened across requests:
q is [T, num_heads, head_dim], k and v are [T, num_kv_heads, head_dim], already rotated by RoPE.
The context stores k and v wherever its cache keeps them, attends each new query causally over its
own request's cached prefix plus the new tokens, and returns [T, num_heads, head_dim].

Contexts: `ContiguousKVCache` (one request, one preallocated buffer: the cache before paging) and
`PagedKVCache` (the engine's block pool), which delegates to a backend: "torch" (reference, any
device) or "triton" (the kernels; on a CPU they run in Triton's interpreter).
"""

import importlib.util
from typing import Protocol

import torch

from nanoengine.errors import BackendUnavailableError


class AttentionContext(Protocol):
    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


from nanoengine.attention.backend import AttentionBackend, AttentionMetadata, TorchBackend
from nanoengine.attention.contiguous import ContiguousKVCache

BACKENDS = ("torch", "triton")


def triton_available() -> bool:
    """Triton publishes wheels for Linux only; on macOS and Windows the engine runs torch attention."""
    return importlib.util.find_spec("triton") is not None


def get_backend(name: str) -> AttentionBackend:
    if name == "torch":
        return TorchBackend()
    if name == "triton":
        if not triton_available():
            raise BackendUnavailableError(
                "attention_backend='triton' needs the triton package, which publishes wheels for Linux only "
                "(pip install triton==3.9.0 there). On this machine use attention_backend='torch', the default "
                "without a GPU."
            )
        from nanoengine.attention.triton_backend import TritonBackend

        return TritonBackend()
    raise ValueError(f"Unknown attention_backend {name!r}; choose one of {BACKENDS}.")


__all__ = [
    "AttentionBackend",
    "AttentionContext",
    "AttentionMetadata",
    "ContiguousKVCache",
    "TorchBackend",
    "get_backend",
    "triton_available",
]
