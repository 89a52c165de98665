"""nanoengine: a small LLM inference engine whose names mirror vLLM v1.

`from nanoengine import LLM, SamplingParams` is the entry point. The names load lazily, so that
`nanoengine.core` (pure Python) can be imported without paying for torch.
"""

import importlib

_EXPORTS = {
    "LLM": "nanoengine.entrypoints.llm",
    "SamplingParams": "nanoengine.sampling_params",
    "RequestOutput": "nanoengine.outputs",
    "CompletionOutput": "nanoengine.outputs",
    "LlamaConfig": "nanoengine.config",
    "NanoEngineError": "nanoengine.errors",
    "ModelNotFoundError": "nanoengine.errors",
    "UnsupportedModelError": "nanoengine.errors",
    "InvalidRequestError": "nanoengine.errors",
    "KVCacheTooSmallError": "nanoengine.errors",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'nanoengine' has no attribute {name!r}")
