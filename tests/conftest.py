"""Shared fixtures. The real model and the HF reference load once per session: they cost seconds."""

import os

# Triton kernels run on the CPU through the interpreter; it must be chosen before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, os.cpu_count() or 1))


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
