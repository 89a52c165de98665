"""The HF reference that the model tests compare with (bench/hf_reference.py): a saved copy of transformers'
own GGUF conversion must be exactly what transformers loads from the GGUF, and a new file makes a new copy."""

import pytest
import torch
from tiny_gguf import hf_state_dict, tiny_vocab, write_tiny_llama_gguf

from bench import hf_reference
from nanoengine.config import LlamaConfig
from nanoengine.model import LlamaForCausalLM

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.reference


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path / "cache"))


def tiny_gguf(path, seed):
    config = LlamaConfig.tiny(vocab_size=len(tiny_vocab()))
    return write_tiny_llama_gguf(path, config, hf_state_dict(LlamaForCausalLM.random(config, seed=seed, std=0.2)))


def test_the_saved_copy_is_what_transformers_loads_from_the_gguf(tmp_path, monkeypatch):
    path = tiny_gguf(tmp_path / "a.gguf", seed=0)
    direct = transformers.LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    saved = hf_reference.hf_model(path)
    assert saved.config.to_diff_dict() == direct.config.to_diff_dict()
    expected = direct.state_dict()
    assert saved.state_dict().keys() == expected.keys()
    assert all(torch.equal(w, expected[name]) for name, w in saved.state_dict().items())
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, direct(ids).logits)

    text = "the theme<|im_end|> ünï"
    assert (
        hf_reference.hf_tokenizer(path)(text)["input_ids"]
        == transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)(text)["input_ids"]
    )

    def no_conversion(*args):
        raise AssertionError("the copy was converted again")

    monkeypatch.setattr(hf_reference, "_convert", no_conversion)
    assert all(torch.equal(w, expected[name]) for name, w in hf_reference.hf_model(path).state_dict().items())


def test_another_file_gets_its_own_copy(tmp_path):
    first = hf_reference.hf_model(tiny_gguf(tmp_path / "a.gguf", seed=0)).state_dict()
    other = tiny_gguf(tmp_path / "b.gguf", seed=1)
    assert hf_reference.reference_folder(other) != hf_reference.reference_folder(tmp_path / "a.gguf")
    second = hf_reference.hf_model(other).state_dict()
    assert not torch.equal(first["model.embed_tokens.weight"], second["model.embed_tokens.weight"])


def test_a_conversion_that_finishes_second_leaves_the_first_copy(tmp_path):
    """Two xdist workers may convert at once: the later rename fails, and its copy is dropped."""
    path = tiny_gguf(tmp_path / "a.gguf", seed=0)
    folder = hf_reference.reference_folder(path)
    hf_reference._convert(path, folder)
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]
    assert hf_reference.hf_model(path).config.num_hidden_layers == LlamaConfig.tiny().num_hidden_layers
