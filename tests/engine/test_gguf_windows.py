"""Sliding windows read from a GGUF's metadata: a windowed file reaches the engine's hybrid KV path and
generates what Hugging Face's Ministral does on the same weights; a file without a window stays full
attention; and a window or pattern the engine cannot trust is refused, naming its key."""

import pytest
import torch
from tiny_gguf import hf_greedy, hf_state_dict, tiny_vocab, write_tiny_llama_gguf

from nanoengine.config import LlamaConfig
from nanoengine.core.kv_cache_manager import KVCacheManager
from nanoengine.core.single_type_kv_cache_manager import SlidingWindowManager
from nanoengine.entrypoints.llm import LLM
from nanoengine.errors import UnsupportedModelError
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.loader import read_config, unpacked_folder
from nanoengine.sampling_params import SamplingParams

WINDOW = 16
WINDOW_KEY = "llama.attention.sliding_window"
PATTERN_KEY = "llama.attention.sliding_window_pattern"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def gguf_of(tmp_path, config, seed=0, extra_metadata=None):
    """The random model of `config` and a GGUF file holding it."""
    model = LlamaForCausalLM.random(config, seed=seed, std=0.2)
    path = write_tiny_llama_gguf(tmp_path / "model.gguf", config, hf_state_dict(model), extra_metadata=extra_metadata)
    return model, path


def loaded_config(path) -> LlamaConfig:
    return read_config(unpacked_folder(path, progress=False)[1])


@pytest.fixture
def hybrid(tmp_path):
    """Three sliding layers to one full, written to a GGUF with the window and the per-layer pattern."""
    return gguf_of(tmp_path, LlamaConfig.tiny_hybrid(WINDOW, vocab_size=len(tiny_vocab())))


def test_window_and_pattern_round_trip(hybrid):
    model, path = hybrid
    config = loaded_config(path)
    assert config.sliding_window == WINDOW
    assert config.layer_types == model.config.layer_types == ("sliding_attention",) * 3 + ("full_attention",)


@pytest.mark.reference
def test_a_windowed_gguf_is_served_by_the_hybrid_path_and_matches_ministral(hybrid):
    transformers = pytest.importorskip("transformers")
    model, path = hybrid
    llm = LLM(model=path, block_size=8, kv_cache_memory_bytes=2**20, progress=False)
    # vLLM's grouping: groups as large as the smallest type, so one per layer here, the full one first.
    assert [g.sliding_window for g in llm.kv_cache.groups] == [None, WINDOW, WINDOW, WINDOW]
    assert any(
        isinstance(m, SlidingWindowManager) for m in llm.engine.kv_cache_manager.coordinator.single_type_managers
    )

    # The reference takes its window from the config the file was written from, not from what was loaded.
    hf = transformers.MinistralForCausalLM(model.config.to_hf()).eval()
    hf.load_state_dict(hf_state_dict(model))
    prompt = torch.randint(3, len(tiny_vocab()), (3 * WINDOW,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].token_ids
    expected = hf_greedy(hf, prompt, 8)
    assert tokens == expected

    # The window matters for this prompt: the same weights under full attention generate otherwise.
    full = transformers.LlamaForCausalLM(LlamaConfig.tiny(num_hidden_layers=4, vocab_size=len(tiny_vocab())).to_hf())
    full.load_state_dict(hf_state_dict(model))
    assert hf_greedy(full.eval(), prompt, 8) != expected


def test_a_window_without_a_pattern_makes_every_layer_slide(tmp_path):
    _, path = gguf_of(tmp_path, LlamaConfig.tiny(sliding_window=WINDOW, vocab_size=len(tiny_vocab())))
    config = loaded_config(path)
    assert (config.sliding_window, config.layer_types) == (WINDOW, None)
    assert [config.window(i) for i in range(config.num_hidden_layers)] == [WINDOW, WINDOW]


def test_a_file_without_a_window_stays_full_attention(tmp_path):
    _, path = gguf_of(tmp_path, LlamaConfig.tiny(vocab_size=len(tiny_vocab())))
    config = loaded_config(path)
    assert (config.sliding_window, config.layer_types) == (None, None)
    llm = LLM(model=path, block_size=8, kv_cache_memory_bytes=2**20, progress=False)
    assert len(llm.kv_cache.groups) == 1
    assert type(llm.engine.kv_cache_manager) is KVCacheManager  # not the hybrid one


@pytest.mark.parametrize(
    "window, extra, key, message",
    [
        (None, lambda w: w.add_sliding_window(0), WINDOW_KEY, "is 0; .*positive integer"),
        (None, lambda w: w.add_float32(WINDOW_KEY, 16.0), WINDOW_KEY, "is 16.0; .*positive integer"),
        (
            WINDOW,
            lambda w: w.add_sliding_window_pattern([True] * 3),
            PATTERN_KEY,
            "has 3 entries but the model has 2 layers",
        ),
        (WINDOW, lambda w: w.add_sliding_window_pattern(2), PATTERN_KEY, "is 2 .*per-layer form only"),
        (
            None,
            lambda w: w.add_sliding_window_pattern([True, False]),
            PATTERN_KEY,
            f"marks sliding layers but the file has no {WINDOW_KEY}",
        ),
    ],
    ids=["window-0", "window-float", "pattern-length", "pattern-integer", "pattern-without-window"],
)
def test_bad_window_metadata_is_refused_naming_the_key(tmp_path, cache, window, extra, key, message):
    """The first two windows and the first two patterns LlamaConfig could not even hold; the integer pattern
    is llama.cpp's other form, whose layout depends on the architecture there."""
    config = LlamaConfig.tiny(sliding_window=window, vocab_size=len(tiny_vocab()))
    _, path = gguf_of(tmp_path, config, extra_metadata=extra)
    with pytest.raises(UnsupportedModelError, match=message) as error:
        LLM(model=path, progress=False)
    assert str(error.value).startswith(key)
    assert not any(cache.glob("*/model.safetensors"))  # nothing cached that a later load could serve
