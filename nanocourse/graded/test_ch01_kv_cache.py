"""Chapter 01 graded tasks: the KV cache's bytes, and decode attention. Run with `make grade CH=01`."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoengine.attention import ContiguousKVCache, TorchBackend
from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import LlamaConfig
from nanoengine.model import LlamaForCausalLM
from nanoengine.worker.worker import num_kv_blocks

CHAPTER = "ch01_kv_cache"
_DTYPE_OF_SIZE = {1: torch.float8_e4m3fn, 2: torch.float16, 4: torch.float32, 8: torch.float64}
RANDOM = settings(max_examples=150)
_LAYERS, _KV_HEADS, _HEAD_DIM = st.integers(1, 128), st.integers(1, 64), st.integers(1, 256)
_DTYPE_BYTES = st.sampled_from(sorted(_DTYPE_OF_SIZE))


def _shape(num_layers, num_kv_heads, head_dim):
    """A config with exactly these KV dimensions (the other fields do not enter KV arithmetic)."""
    return LlamaConfig(
        vocab_size=1,
        hidden_size=num_kv_heads * head_dim,
        intermediate_size=1,
        num_hidden_layers=num_layers,
        num_attention_heads=num_kv_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
    )


def _engine_pool_tokens(budget_bytes, block_size, bytes_per_token):
    """The engine's own pool sizing (nanoengine.worker.worker.num_kv_blocks), run without loading a model."""
    return (num_kv_blocks(block_size * bytes_per_token, torch.device("cpu"), budget_bytes, 0.0) - 1) * block_size


def _engine_decode(q, k_cache, v_cache):
    """The torch backend's paged decode, with the whole contiguous cache posing as one block."""
    seq_len = k_cache.shape[0]
    out = TorchBackend().decode(
        q[None],
        k_cache[None],
        v_cache[None],
        torch.zeros(1, 1, dtype=torch.int32),
        torch.tensor([seq_len], dtype=torch.int32),
        q.shape[-1] ** -0.5,
    )
    return out[0]


NANOENGINE = {
    "kv_bytes_per_token": lambda L, H, D, b: _shape(L, H, D).kv_bytes_per_token(b),
    "kv_bytes_per_block": lambda bs, L, H, D, b: PagedKVCache.bytes_per_block(_shape(L, H, D), bs, _DTYPE_OF_SIZE[b]),
    "max_cached_tokens": _engine_pool_tokens,
    "decode_attention": _engine_decode,
}


@RANDOM
@given(num_layers=_LAYERS, num_kv_heads=_KV_HEADS, head_dim=_HEAD_DIM, dtype_bytes=_DTYPE_BYTES)
def _bytes_per_token_match_the_config(impl, num_layers, num_kv_heads, head_dim, dtype_bytes):
    want = _shape(num_layers, num_kv_heads, head_dim).kv_bytes_per_token(dtype_bytes)
    got = impl.kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)
    assert got == want, (
        f"kv_bytes_per_token({num_layers}, {num_kv_heads}, {head_dim}, {dtype_bytes}) must be "
        f"{want:,}, what the engine's LlamaConfig.kv_bytes_per_token gives; got {got}"
    )


@pytest.mark.task("01.1", "kv_bytes_per_token: one token's keys and values, over every layer")
def test_bytes_per_token(impl):
    for args, want, why in [
        ((30, 3, 64, 4), 46_080, "SmolLM2-135M in fp32"),
        ((30, 3, 64, 2), 23_040, "SmolLM2-135M in bf16: half of fp32"),
        ((80, 8, 128, 2), 327_680, "Llama-70B (GQA, 8 KV heads) in fp16"),
        ((80, 64, 128, 2), 8 * 327_680, "without GQA, 64 KV heads cost 8x more"),
        ((1, 1, 1, 1), 2, "one K number and one V number"),
    ]:
        got = impl.kv_bytes_per_token(*args)
        assert got == want, f"kv_bytes_per_token{args} must be {want:,} ({why}); got {got}"
    _bytes_per_token_match_the_config(impl)


@pytest.mark.task("01.2", "kv_bytes_per_block: the blog post's 5,242,880-byte Llama-70B block")
def test_bytes_per_block(impl):
    block = impl.kv_bytes_per_block(16, 80, 8, 128, 2)
    assert block == 5_242_880, (
        f"kv_bytes_per_block(16, 80, 8, 128, 2), Llama-70B in fp16, must be 16 tokens x 327,680 bytes per token "
        f"(2 x 80 layers x 8 KV heads x 128 x 2 bytes) = 5,242,880; got {block}"
    )
    for args, want, why in [
        ((16, 30, 3, 64, 4), 737_280, "SmolLM2 fp32, the engine's CPU block"),
        ((32, 30, 3, 64, 4), 2 * 737_280, "twice the tokens, twice the bytes"),
        ((1, 1, 1, 1, 1), 2, "one token of one layer: one K number and one V number"),
    ]:
        got = impl.kv_bytes_per_block(*args)
        assert got == want, f"kv_bytes_per_block{args} must be {want:,} ({why}); got {got}"
    _bytes_per_block_match_the_paged_cache(impl)


@RANDOM
@given(
    block_size=st.integers(1, 64),
    num_layers=_LAYERS,
    num_kv_heads=_KV_HEADS,
    head_dim=_HEAD_DIM,
    dtype_bytes=_DTYPE_BYTES,
)
def _bytes_per_block_match_the_paged_cache(impl, block_size, num_layers, num_kv_heads, head_dim, dtype_bytes):
    want = PagedKVCache.bytes_per_block(
        _shape(num_layers, num_kv_heads, head_dim), block_size, _DTYPE_OF_SIZE[dtype_bytes]
    )
    got = impl.kv_bytes_per_block(block_size, num_layers, num_kv_heads, head_dim, dtype_bytes)
    assert got == want, (
        f"kv_bytes_per_block({block_size}, {num_layers}, {num_kv_heads}, {head_dim}, {dtype_bytes}) "
        f"must be {want:,}, what the engine's PagedKVCache.bytes_per_block gives; got {got}"
    )


def _pool_tokens_or_error(max_cached_tokens, budget_bytes, block_size, bytes_per_token):
    """The tokens, or "MemoryError" when it raises one."""
    try:
        return max_cached_tokens(budget_bytes, block_size, bytes_per_token)
    except MemoryError:
        return "MemoryError"


@RANDOM
@given(block_size=st.integers(1, 32), bytes_per_token=st.integers(1, 10**6), data=st.data())
def _pool_matches_the_engine(impl, block_size, bytes_per_token, data):
    budget = data.draw(st.integers(0, 40 * block_size * bytes_per_token), label="budget_bytes")
    want = _pool_tokens_or_error(_engine_pool_tokens, budget, block_size, bytes_per_token)
    got = _pool_tokens_or_error(impl.max_cached_tokens, budget, block_size, bytes_per_token)
    assert got == want, (
        f"max_cached_tokens({budget:,}, {block_size}, {bytes_per_token:,}) must give {want}, as the "
        f"engine's pool sizing (num_kv_blocks, less the null block) does; got {got}"
    )


@pytest.mark.task("01.3", "max_cached_tokens: whole blocks, minus the null block")
def test_max_cached_tokens(impl):
    block = 16 * 46_080
    for args, want, why in [
        ((512 * 2**20, 16, 46_080), 11_632, "the engine's default CPU pool for SmolLM2"),
        ((45 * 10**9, 16, 327_680), 8_582 * 16, "45 GB holds 8,583 Llama-70B blocks, one of them the null block"),
        ((2 * block, 16, 46_080), 16, "two blocks: the null block and one usable"),
        (
            (3 * block + block // 2, 16, 46_080),
            32,
            "3.5 blocks: 3 whole blocks, the null block and two usable; the half block is wasted",
        ),
    ]:
        got = impl.max_cached_tokens(*args)
        assert got == want, f"max_cached_tokens{args} must be {want:,} ({why}); got {got}"
    for budget, why in [(2 * block - 1, "one byte short of two blocks: the null block alone fits"), (0, "no memory")]:
        got = _pool_tokens_or_error(impl.max_cached_tokens, budget, 16, 46_080)
        assert got == "MemoryError", (
            f"max_cached_tokens({budget}, 16, 46080) must raise MemoryError ({why}); got {got!r}"
        )
    _pool_matches_the_engine(impl)


def _random_qkv(num_heads, num_kv_heads, seq_len, head_dim=64, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_heads, head_dim, generator=gen)
    k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _sdpa(q, k, v):
    """Exact attention (float64) for q [Hq, D] over k, v [S, Hkv, D]: torch SDPA with its GQA grouping."""
    q, k, v = (t.double() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q[:, None], k.transpose(0, 1), v.transpose(0, 1), enable_gqa=True)
    return out[:, 0]


def _tolerance(dtype):
    """How far from exact attention an output may be, relative to 1 + |exact|: the dtype's rounding."""
    return max(1e-4, 4 * torch.finfo(dtype).eps)


def _check_decode(impl, heads, kv_heads, seq_len, head_dim, dtype, seed=0, q_scale=1.0):
    q, k, v = _random_qkv(heads, kv_heads, seq_len, head_dim, seed, dtype)
    q = q * q_scale
    inputs = [t.clone() for t in (q, k, v)]
    case = f"{heads} query heads over {kv_heads} KV heads, {seq_len} cached tokens, head_dim {head_dim}, {dtype}" + (
        f", q scaled {q_scale:g}x" if q_scale != 1 else ""
    )
    out = impl.decode_attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == (heads, head_dim) and out.dtype == q.dtype, (
        f"decode_attention must return a [num_heads, head_dim] = [{heads}, {head_dim}] tensor in q's dtype {q.dtype} "
        f"({case}): got {list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__} "
        f"{getattr(out, 'dtype', '')}"
    )
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), inputs)), (
        f"decode_attention must leave q, k_cache and v_cache as they were ({case}): one of them changed"
    )
    assert torch.isfinite(out).all(), f"decode_attention must give finite outputs ({case}): does the softmax overflow?"
    want = _sdpa(q, k, v)
    error = ((out.double() - want).abs() / (1 + want.abs())).max().item()
    assert error <= _tolerance(dtype), (
        f"decode_attention differs from exact attention (torch SDPA, GQA) by {error:.2g} relative to 1 + |value|, more "
        f"than the {_tolerance(dtype):.2g} {dtype} allows ({case})"
    )


@RANDOM
@given(
    num_kv_heads=st.integers(1, 4),
    group=st.integers(1, 4),
    seq_len=st.integers(1, 40),
    head_dim=st.sampled_from([1, 2, 8, 16, 40, 64, 128]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def _decode_matches_sdpa_on_random_shapes(impl, num_kv_heads, group, seq_len, head_dim, dtype, seed):
    _check_decode(impl, num_kv_heads * group, num_kv_heads, seq_len, head_dim, dtype, seed)


@pytest.mark.task("01.4", "decode_attention matches torch SDPA: GQA groups, any head_dim, in q's dtype")
def test_decode_attention_matches_sdpa(impl):
    for heads, kv_heads, seq_len in [(9, 3, 37), (4, 4, 5), (8, 2, 1), (9, 3, 300)]:
        _check_decode(impl, heads, kv_heads, seq_len, 64, torch.float32)
    _check_decode(impl, 6, 2, 20, 8, torch.float32)  # chapter 01.5's tiny Llama: a scale of 1/sqrt(8)
    _check_decode(impl, 9, 3, 50, 64, torch.float32, seed=1, q_scale=1000)
    _check_decode(impl, 9, 3, 37, 64, torch.bfloat16)
    _check_decode(impl, 9, 3, 37, 64, torch.float16)
    _decode_matches_sdpa_on_random_shapes(impl)


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
        full = model.compute_logits(
            model(torch.tensor(ids), torch.arange(len(ids)), ContiguousKVCache(model.config, len(ids)))
        )
        ctx = _DecodeWith(model.config, len(ids), impl.decode_attention)
        model(torch.tensor(ids[:6]), torch.arange(6), ctx)
        ctx.cache.advance(6)
        for pos in range(6, len(ids)):
            step = model.compute_logits(model(torch.tensor(ids[pos : pos + 1]), torch.tensor([pos]), ctx))
            ctx.cache.advance(1)
            torch.testing.assert_close(
                step[0],
                full[pos],
                rtol=1e-4,
                atol=1e-5,
                msg=f"with your decode_attention in every layer of a tiny random Llama (6 query heads over 2 KV heads, "
                f"head_dim 8), the decode step of position {pos} must give the full forward pass's logits; they "
                f"differ",
            )
