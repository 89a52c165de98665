"""Chapter 01 graded tasks: the KV cache's bytes, and decode attention. Run with `make grade CH=01`."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from nanoengine.attention import ContiguousKVCache, TorchBackend
from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import LlamaConfig
from nanoengine.entrypoints.llm import LLM
from nanoengine.model import LlamaForCausalLM

CHAPTER = "ch01_kv_cache"
_DTYPE_OF_SIZE = {1: torch.float8_e4m3fn, 2: torch.float16, 4: torch.float32, 8: torch.float64}


def _shape(num_layers, num_kv_heads, head_dim):
    """A config with exactly these KV dimensions (the other fields do not enter KV arithmetic)."""
    return LlamaConfig(vocab_size=1, hidden_size=num_kv_heads * head_dim, intermediate_size=1,
                       num_hidden_layers=num_layers, num_attention_heads=num_kv_heads,
                       num_key_value_heads=num_kv_heads, head_dim=head_dim)


def _engine_pool_tokens(budget_bytes, block_size, bytes_per_token):
    """The engine's own pool sizing (LLM._num_kv_blocks), run without loading a model."""
    sizing = SimpleNamespace(device=torch.device("cpu"), block_size=block_size,
                             _bytes_per_block=block_size * bytes_per_token)
    return (LLM._num_kv_blocks(sizing, budget_bytes, 0.0) - 1) * block_size


def _engine_decode(q, k_cache, v_cache):
    """The torch backend's paged decode, with the whole contiguous cache posing as one block."""
    seq_len = k_cache.shape[0]
    out = TorchBackend().decode(q[None], k_cache[None], v_cache[None], torch.zeros(1, 1, dtype=torch.int32),
                                torch.tensor([seq_len], dtype=torch.int32), q.shape[-1] ** -0.5)
    return out[0]


NANOENGINE = {
    "kv_bytes_per_token": lambda L, H, D, b: _shape(L, H, D).kv_bytes_per_token(b),
    "kv_bytes_per_block": lambda bs, L, H, D, b: PagedKVCache.bytes_per_block(_shape(L, H, D), bs, _DTYPE_OF_SIZE[b]),
    "max_cached_tokens": _engine_pool_tokens,
    "decode_attention": _engine_decode,
}


@pytest.mark.task("01.1", "kv_bytes_per_token: 2 x layers x KV heads x head_dim x dtype bytes")
def test_bytes_per_token(impl):
    assert impl.kv_bytes_per_token(30, 3, 64, 4) == 46_080, "SmolLM2-135M in fp32"
    assert impl.kv_bytes_per_token(30, 3, 64, 2) == 23_040, "SmolLM2-135M in bf16: half of fp32"
    assert impl.kv_bytes_per_token(80, 8, 128, 2) == 327_680, "Llama-70B (GQA, 8 KV heads) in fp16"
    assert impl.kv_bytes_per_token(80, 64, 128, 2) == 8 * 327_680, "without GQA, 64 KV heads cost 8x more"
    assert impl.kv_bytes_per_token(1, 1, 1, 1) == 2, "one K number and one V number"


@pytest.mark.task("01.2", "kv_bytes_per_block: the blog post's 5,242,880-byte Llama-70B block")
def test_bytes_per_block(impl):
    block = impl.kv_bytes_per_block(16, 80, 8, 128, 2)
    assert block == 5_242_880, (
        f"kv_bytes_per_block(16, 80, 8, 128, 2), Llama-70B in fp16, must be 16 tokens x 327,680 bytes per token "
        f"(2 x 80 layers x 8 KV heads x 128 x 2 bytes) = 5,242,880; got {block}")
    assert block == 5 * 2**20, "5.24 MB (powers of 10) is exactly 5 MiB (powers of 2)"
    assert impl.kv_bytes_per_block(16, 30, 3, 64, 4) == 737_280, "SmolLM2 fp32, the engine's CPU block"
    assert impl.kv_bytes_per_block(32, 30, 3, 64, 4) == 2 * 737_280, "twice the tokens, twice the bytes"


@pytest.mark.task("01.3", "max_cached_tokens: whole blocks, minus the null block")
def test_max_cached_tokens(impl):
    assert impl.max_cached_tokens(512 * 2**20, 16, 46_080) == 11_632, "the engine's default CPU pool for SmolLM2"
    assert impl.max_cached_tokens(45 * 10**9, 16, 327_680) == 8_582 * 16, "45 GB holds 8,583 Llama-70B blocks"
    block = 16 * 46_080
    assert impl.max_cached_tokens(2 * block, 16, 46_080) == 16, "two blocks: the null block and one usable"
    assert impl.max_cached_tokens(3 * block + block // 2, 16, 46_080) == 32, "half a block left over is wasted"
    with pytest.raises(MemoryError):
        impl.max_cached_tokens(2 * block - 1, 16, 46_080)


def _random_qkv(num_heads, num_kv_heads, seq_len, head_dim=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_heads, head_dim, generator=gen)
    k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
    return q, k, v


def _sdpa(q, k, v):
    out = F.scaled_dot_product_attention(q[:, None], k.transpose(0, 1), v.transpose(0, 1), enable_gqa=True)
    return out[:, 0]


@pytest.mark.task("01.4", "decode_attention matches torch SDPA, with SmolLM2's GQA groups of 3")
def test_decode_attention_matches_sdpa(impl):
    for heads, kv_heads, seq_len in [(9, 3, 37), (4, 4, 5), (8, 2, 1), (9, 3, 300)]:
        q, k, v = _random_qkv(heads, kv_heads, seq_len)
        out = impl.decode_attention(q, k, v)
        assert out.shape == (heads, 64) and out.dtype == q.dtype, (
            f"decode_attention must return [num_heads, head_dim] = [{heads}, 64] in q's dtype {q.dtype} "
            f"({heads} query heads, {kv_heads} KV heads, {seq_len} cached tokens): got {list(out.shape)} {out.dtype}")
        torch.testing.assert_close(out, _sdpa(q, k, v), rtol=1e-4, atol=1e-5,
                                   msg=f"{heads} query heads over {kv_heads} KV heads, {seq_len} cached tokens")
    q, k, v = _random_qkv(9, 3, 50, seed=1)
    huge = impl.decode_attention(q * 1000, k, v)
    assert torch.isfinite(huge).all(), "large scores must not overflow the softmax (subtract the max)"
    torch.testing.assert_close(huge, _sdpa(q * 1000, k, v), rtol=1e-4, atol=1e-4,
                               msg=lambda m: f"with q scaled 1000x (9 query heads over 3 KV heads, 50 cached tokens) "
                                             f"decode_attention differs from torch SDPA: {m}")


class _DecodeWith:
    """A contiguous cache whose one-token steps run a given decode_attention instead of SDPA."""

    def __init__(self, config, max_len, decode_attention):
        self.cache, self.decode_attention = ContiguousKVCache(config, max_len), decode_attention

    def __call__(self, layer_idx, q, k, v):
        if q.shape[0] > 1:
            return self.cache(layer_idx, q, k, v)
        n = self.cache.num_tokens
        self.cache.k[layer_idx, n], self.cache.v[layer_idx, n] = k[0], v[0]
        return self.decode_attention(q[0], self.cache.k[layer_idx, : n + 1], self.cache.v[layer_idx, : n + 1])[None]


@pytest.mark.task("01.5", "your decode_attention runs a Llama's decode steps, token for token")
def test_decode_attention_drives_the_model(impl):
    model = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=3)
    ids = [5, 17, 99, 3, 42, 8, 250, 61, 7, 130, 64, 12]
    with torch.inference_mode():
        full = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), ContiguousKVCache(model.config, len(ids))))
        ctx = _DecodeWith(model.config, len(ids), impl.decode_attention)
        model(torch.tensor(ids[:6]), torch.arange(6), ctx)
        ctx.cache.advance(6)
        for pos in range(6, len(ids)):
            step = model.compute_logits(model(torch.tensor(ids[pos : pos + 1]), torch.tensor([pos]), ctx))
            ctx.cache.advance(1)
            torch.testing.assert_close(step[0], full[pos], rtol=1e-4, atol=1e-5,
                                       msg=f"decode of position {pos} differs from the full forward pass")
