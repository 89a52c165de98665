"""Lower-precision weights on the CPU: dtype by vLLM's names, and quantization="int8_per_channel_weight_only"
(int8 weights with one scale per output row, activations in the model's dtype), with the errors that name them."""

import pytest
import torch
from tiny_gguf import hf_state_dict, tiny_vocab, write_tiny_llama_gguf

from nanoengine.attention import ContiguousKVCache
from nanoengine.config import LlamaConfig
from nanoengine.entrypoints.llm import LLM
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.llama import Int8WeightOnlyLinear, Linear, quantize_int8_weight_only_

INT8 = "int8_per_channel_weight_only"


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path / "cache"))
    config = LlamaConfig.tiny(vocab_size=len(tiny_vocab()))
    model = LlamaForCausalLM.random(config, seed=3)
    return model, write_tiny_llama_gguf(tmp_path / "tiny.gguf", config, hf_state_dict(model))


def _logits(model, ids, dtype=torch.float32):
    cache = ContiguousKVCache(model.config, len(ids), dtype=dtype)
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), cache))


def test_int8_rows_round_to_the_nearest_step_of_their_own_scale():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32, bias=False)
    linear.weight.data[3] = 0  # an all-zero row stays zero rather than dividing by zero
    q = Int8WeightOnlyLinear(linear)
    assert q.weight_int8.dtype is torch.int8 and q.weight_int8.abs().max() == 127
    error = (q.weight_int8.float() * q.scales[:, None] - linear.weight).abs()
    assert (error <= q.scales[:, None] / 2 + 1e-7).all()
    x = torch.randn(5, 64)
    torch.testing.assert_close(q(x), x @ (q.weight_int8.float() * q.scales[:, None]).T, rtol=1e-5, atol=1e-5)


def test_quantize_replaces_every_linear_and_keeps_the_embedding():
    model = quantize_int8_weight_only_(LlamaForCausalLM.random(LlamaConfig.tiny()))
    assert not any(isinstance(m, Linear) for m in model.modules())
    assert isinstance(model.lm_head, Int8WeightOnlyLinear)
    assert model.model.embed_tokens.weight.dtype is torch.float32


@pytest.mark.parametrize(
    "kwargs, dtype, atol",
    [
        ({"dtype": "auto"}, torch.float32, 0),  # the CPU's default stays fp32, bit for bit
        ({"dtype": "float32"}, torch.float32, 0),
        ({"dtype": "bfloat16"}, torch.bfloat16, 0.05),
        ({"quantization": INT8}, torch.float32, 0.02),
        ({"dtype": "bfloat16", "quantization": INT8}, torch.bfloat16, 0.05),
    ],
)
def test_an_engine_in_lower_precision_stays_close_to_fp32(tiny, kwargs, dtype, atol):
    reference, path = tiny
    llm = LLM(model=path, device="cpu", progress=False, **kwargs)
    assert llm.dtype is dtype
    ids = llm.tokenizer.encode("the cat sat on the mat")
    torch.testing.assert_close(_logits(llm.model, ids, dtype), _logits(reference, ids), rtol=0, atol=atol + 1e-5)
    assert len(llm.generate(prompt_token_ids=ids)[0].token_ids) > 0


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"dtype": "fp64"}, "dtype"),
        ({"dtype": torch.int8}, "dtype"),
        ({"quantization": "awq"}, "quantization"),
        ({"quantization": INT8, "model": LlamaForCausalLM.random(LlamaConfig.tiny())}, "quantization"),
    ],
)
def test_bad_dtype_or_quantization_is_refused_by_name(kwargs, parameter):
    with pytest.raises(InvalidEngineArgumentError) as info:
        LLM(progress=False, **kwargs)
    assert info.value.parameter == parameter
