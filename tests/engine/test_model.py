"""The Llama model against Hugging Face transformers on the same weights."""

import pytest
import torch

from nanoengine.attention import ContiguousKVCache
from nanoengine.config import LlamaConfig
from nanoengine.model import LlamaForCausalLM, llama
from nanoengine.model.llama import ONEDNN_LINEAR, Linear
from nanoengine.sampling_params import SamplingParams


def full_logits(model, ids):
    cache = ContiguousKVCache(model.config, len(ids))
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), cache))


def hf_tiny(config: LlamaConfig):
    transformers = pytest.importorskip("transformers")
    hf_config = config.to_hf()
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(hf_config).eval()


@pytest.mark.reference
@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4), (8, 2)])
def test_tiny_random_model_matches_hf(heads, kv_heads):
    config = LlamaConfig.tiny(num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_size=heads * 8)
    hf = hf_tiny(config)
    ours = LlamaForCausalLM.from_state_dict(config, hf.state_dict())
    ids = torch.randint(0, config.vocab_size, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(full_logits(ours, ids), expected, rtol=0, atol=1e-5)


def test_incremental_decode_equals_full_forward():
    """Prefill a prefix, then feed tokens one and three at a time: same logits as one full pass."""
    model = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=1)
    ids = list(range(3, 23))
    expected = full_logits(model, ids)
    cache = ContiguousKVCache(model.config, len(ids))
    rows = []
    with torch.no_grad():
        for chunk in (ids[:9], ids[9:10], ids[10:13], ids[13:]):
            pos = torch.arange(cache.num_tokens, cache.num_tokens + len(chunk))
            rows.append(model.compute_logits(model(torch.tensor(chunk), pos, cache)))
            cache.advance(len(chunk))
    torch.testing.assert_close(torch.cat(rows), expected, rtol=0, atol=1e-5)


def test_tied_embeddings_share_storage():
    model = LlamaForCausalLM.random(LlamaConfig.tiny())
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("shape", [(1, 48), (32, 48), (2, 5, 48)])
def test_linear_matches_f_linear_and_repacks_after_an_in_place_edit(shape):
    layer = Linear(48, 80, bias=False).requires_grad_(False)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight), rtol=0, atol=1e-5)
        assert (layer.packed is not None) == ONEDNN_LINEAR  # on x86 the oneDNN path really ran
        layer.weight.mul_(-3)  # a stale packed copy would still give the old product
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight), rtol=0, atol=1e-5)


@pytest.mark.skipif(not ONEDNN_LINEAR, reason="Linear calls oneDNN on an x86 CPU only; elsewhere it is F.linear")
@pytest.mark.parametrize("native_bf16", [True, False])
def test_a_bf16_linear_multiplies_rows_in_fp32_where_the_cpu_has_no_native_bf16(monkeypatch, native_bf16):
    """Without avx512_bf16 or AMX, oneDNN's bf16 GEMM converts its operands in the kernel, 3-4x slower than fp32
    from a few rows on: there a bf16 weight multiplies more than one row widened to fp32, one row still in bf16."""
    monkeypatch.setattr(llama, "CPU_BF16", native_bf16)
    layer = Linear(48, 80, bias=False).requires_grad_(False).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    for rows, dtype in [(5, torch.bfloat16 if native_bf16 else torch.float32), (1, torch.bfloat16)]:
        x = torch.randn(rows, 48, generator=gen).bfloat16()
        out, exact = layer(x).float(), torch.nn.functional.linear(x.float(), layer.weight.float())
        assert dtype in layer.packed, (rows, list(layer.packed))
        if dtype is torch.float32:  # the fp32 product rounded once: within half a bf16 step of the exact one
            assert ((out - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all()
        torch.testing.assert_close(out, exact, rtol=2**-7, atol=1e-5)


def test_linear_with_trainable_weight_keeps_autograd():
    layer = Linear(8, 4)
    layer(torch.randn(3, 8)).sum().backward()
    assert layer.weight.grad is not None and layer.packed is None


LOGIT_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return",
    "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n",
]
# One request at a time (the engine's single-request decode path); test_engine.py's
# test_greedy_continuations_equal_hf runs eight chat prompts, these among them, batched.
CHAT_PROMPTS = [
    "What is the capital of Japan?",
    "Write a haiku about the sea.",
]


@pytest.mark.model
@pytest.mark.reference
@pytest.mark.parametrize("prompt", LOGIT_PROMPTS)
def test_embedded_logits_match_hf(llm, hf_model, prompt):
    ids = llm.tokenizer.encode(prompt)
    with torch.no_grad():
        expected = hf_model(torch.tensor([ids])).logits[0]
    diff = (full_logits(llm.model, ids) - expected).abs().max().item()
    assert diff <= 1e-3, f"max abs logit diff {diff:.2e}"


@pytest.mark.model
@pytest.mark.reference
@pytest.mark.parametrize("question", CHAT_PROMPTS)
def test_embedded_greedy_32_tokens_match_hf(llm, hf_model, question):
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": question}])
    ids = llm.tokenizer.encode(prompt)
    with torch.no_grad():
        hf_out = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, pad_token_id=2)[
            0, len(ids) :
        ].tolist()
    ours = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=32))[0]
    assert len(ours.token_ids) >= 8
    assert ours.token_ids == hf_out  # both stop at the same EOS, or both run to 32 tokens


@pytest.mark.model
def test_capital_of_japan(golden):
    """Golden text, cpu/float32 (see tests/conftest.py)."""
    out = golden.chat("What is the capital of Japan?", SamplingParams(temperature=0, max_tokens=32))
    assert out.text == "The capital of Japan is Tokyo."
    assert out.finish_reason == "stop"
