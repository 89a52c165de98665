"""Shared fixtures. The real model and the HF reference load once per session: they cost seconds."""

import os

import pytest
import torch  # importing torch does not import triton

# Without CUDA the Triton kernels run in the interpreter, which must be chosen before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist each worker has a core of its own; more threads would only contend.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, os.cpu_count() or 1))

# Graded suites run in their own processes (tests/test_grading.py), once per implementation.
collect_ignore = [] if os.environ.get("NANOENGINE_IMPL") else ["graded"]


@pytest.fixture(scope="session")
def llm():
    from nanoengine.llm import LLM

    return LLM(progress=False)


@pytest.fixture(scope="session")
def gguf_path():
    from nanoengine.model_loader import embedded_gguf_path

    return embedded_gguf_path()


@pytest.fixture(scope="session")
def hf_tokenizer(gguf_path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


@pytest.fixture(scope="session")
def hf_model(gguf_path):
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    return model.eval()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found); runs on the device machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
