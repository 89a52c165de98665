"""Lower-precision weights on the CPU: dtype by vLLM's names, quantization="int8_per_channel_weight_only"
(int8 weights with one scale per output row, activations in the model's dtype) and quantization="q4_1" (a GGUF's
4-bit projections kept in 4 bits), with the errors that name them."""

import gguf
import pytest
import torch
from tiny_gguf import hf_state_dict, tiny_vocab, write_tiny_llama_gguf

from nanoengine.attention import ContiguousKVCache
from nanoengine.config import LlamaConfig
from nanoengine.entrypoints.llm import LLM
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.llama import (
    Int8RowLinear,
    Int8WeightOnlyLinear,
    Linear,
    Q4GroupLinear,
    q4_groups,
    quantize_int8_weight_only_,
)

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
    model = quantize_int8_weight_only_(LlamaForCausalLM.random(LlamaConfig.tiny()), torch.float32)
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
        ({"quantization": "q4_1"}, "quantization"),  # its kernel is fast with bf16 activations only
        ({"quantization": "q4_1", "dtype": "float32"}, "quantization"),
    ],
)
def test_bad_dtype_or_quantization_is_refused_by_name(kwargs, parameter):
    with pytest.raises(InvalidEngineArgumentError) as info:
        LLM(progress=False, **kwargs)
    assert info.value.parameter == parameter


def _q4_1(w: torch.Tensor) -> torch.Tensor:
    """w through llama.cpp's Q4_1 (gguf-py's quantizer) and back: what the loader reads from a Q4_1 tensor."""
    q4_1 = gguf.GGMLQuantizationType.Q4_1
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.float().numpy(), q4_1), q4_1).copy())


def test_q4_groups_recover_a_ggufs_q4_1_weight_exactly_and_refuse_any_other():
    torch.manual_seed(0)
    w = _q4_1(torch.randn(80, 64))
    q, step, low = q4_groups(w)
    assert q.dtype is torch.int32 and q.min() == 0 and q.max() == 15
    rebuilt = low[..., None] + step[..., None] * q.reshape(80, 2, 32)
    torch.testing.assert_close(rebuilt.reshape(80, 64), w, rtol=0, atol=1e-6)
    assert q4_groups(torch.randn(80, 64)) is None  # a dense weight is not quantized behind its back
    assert q4_groups(_q4_1(torch.randn(80, 64))[:, :48]) is None  # groups of 32 must tile K


@pytest.mark.parametrize("rows", [1, Q4GroupLinear.MAX_ROWS, Q4GroupLinear.MAX_ROWS + 1, 40])
def test_both_paths_of_a_q4_linear_compute_the_gguf_weights(rows):
    """Few rows go through the 4-bit kernel, more through the dense Linear; in fp32 both are x @ w.T."""
    torch.manual_seed(1)
    w = _q4_1(torch.randn(80, 64))
    linear = Linear(64, 80, bias=False).requires_grad_(False)
    linear.weight.copy_(w)
    layer = Q4GroupLinear(linear, *q4_groups(w))
    x = torch.randn(rows, 64)
    torch.testing.assert_close(layer(x), x @ w.T, rtol=0, atol=1e-4)


def test_an_engine_with_q4_1_keeps_the_ggufs_4bit_projections_and_stays_close(tmp_path, monkeypatch):
    """hidden 64, so every projection has groups of 32 along its inputs; lm_head (the embedding's) is not Q4_1 and
    gets int8 with a scale a row, one row through the int8 kernel and more through a dense copy of the same weights."""
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path / "cache"))
    config = LlamaConfig.tiny(
        vocab_size=len(tiny_vocab()), hidden_size=64, intermediate_size=128, num_attention_heads=8
    )
    weights = {
        name: _q4_1(w) if name.endswith("proj.weight") else w
        for name, w in hf_state_dict(LlamaForCausalLM.random(config, seed=3)).items()
    }
    path = write_tiny_llama_gguf(tmp_path / "q4.gguf", config, weights)
    reference = LlamaForCausalLM.from_state_dict(config, weights)
    llm = LLM(model=path, device="cpu", dtype="bfloat16", quantization="q4_1", progress=False)
    kept = [name for name, m in llm.model.named_modules() if isinstance(m, Q4GroupLinear)]
    assert len(kept) == 4 * config.num_hidden_layers and "lm_head" not in kept, kept
    lm_head, embedding = llm.model.lm_head, llm.model.model.embed_tokens.weight
    assert isinstance(lm_head, Int8RowLinear) and embedding.dtype is torch.bfloat16
    dequantized = lm_head.weight_int8.float() * lm_head.scales.float()[:, None]
    # Two bf16 roundings apart at most: the int8 kernel's scale, and the dense copy's products.
    torch.testing.assert_close(lm_head.dense.weight.float(), dequantized, rtol=2**-7, atol=0)
    hidden = torch.randn(3, 64).bfloat16()
    for rows in (hidden[:1], hidden):  # one row through the int8 kernel, more through the dense copy
        torch.testing.assert_close(lm_head(rows).float(), rows.float() @ dequantized.T, rtol=0.02, atol=0.02)
    ids = llm.tokenizer.encode("the cat sat on the mat")
    for rows in (ids[:1], ids):  # one row through the 4-bit kernel, the prompt through the dense path
        torch.testing.assert_close(
            _logits(llm.model, rows, torch.bfloat16), _logits(reference, rows), rtol=0, atol=0.05
        )
