"""Shared fixtures. The real model and the HF reference load once per session: they cost seconds."""

import os
import tempfile
from pathlib import Path

import pytest
import torch  # importing torch does not import triton

# Without CUDA the Triton kernels run in the interpreter, which must be chosen before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Grading the exercises records the tasks tried (nanocourse.attempts): the tests keep that record in a folder of
# their own, never the checkout's or the learner's.
os.environ["NANOCOURSE_PROGRESS"] = str(Path(tempfile.mkdtemp(prefix="nanocourse-progress-")) / "progress.json")


@pytest.fixture(scope="session")
def llm():
    from nanoengine.entrypoints.llm import LLM

    return LLM(progress=False)


# Golden texts (exact generated strings) were recorded with the engine's CPU default, fp32. On CUDA
# the engine runs bf16, whose rounding may change a greedy token, so they do not claim to hold there.
GOLDEN_DEVICE_DTYPE = ("cpu", torch.float32)


@pytest.fixture
def golden(llm):
    """Skips, saying why, a golden-text test where the engine does not run on the golden device and dtype."""
    if (llm.device.type, llm.dtype) != GOLDEN_DEVICE_DTYPE:
        pytest.skip(f"golden text recorded on cpu/float32; this engine runs {llm.device.type}/{llm.dtype}")
    return llm


@pytest.fixture(scope="session")
def gguf_path():
    from nanoengine.model.loader import embedded_gguf_path

    return embedded_gguf_path()


@pytest.fixture(scope="session")
def hf_tokenizer(gguf_path):
    pytest.importorskip("transformers")
    from bench.hf_reference import hf_tokenizer

    return hf_tokenizer(gguf_path)


@pytest.fixture(scope="session")
def hf_model(gguf_path):
    """transformers' own load of the GGUF (converted once per machine, see bench/hf_reference.py)."""
    pytest.importorskip("transformers")
    from bench.hf_reference import hf_model

    return hf_model(gguf_path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found); runs on the device machine")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)
