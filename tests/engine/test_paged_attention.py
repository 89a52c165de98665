"""The paged cache with the torch backend computes exactly what a contiguous per-request cache does."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoengine.attention import ContiguousKVCache, TorchBackend
from nanoengine.attention.backend import AttentionMetadata
from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import LlamaConfig
from nanoengine.model import LlamaForCausalLM


def contiguous_logits(model, ids):
    cache = ContiguousKVCache(model.config, len(ids))
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), cache))


def run_step(model, cache, reqs, block_size):
    """reqs: (tokens, num_computed, num_new, block_ids); decodes must come first."""
    ids, pos, slots, lens, starts = [], [], [], [], [0]
    for tokens, c, n, blocks in reqs:
        ids += tokens[c : c + n]
        pos += range(c, c + n)
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(c, c + n)]
        lens.append(c + n)
        starts.append(starts[-1] + n)
    width = max(len(r[3]) for r in reqs)
    cache.metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([r[3] + [0] * (width - len(r[3])) for r in reqs], dtype=torch.int32),
        max_query_len=max(r[2] for r in reqs),
        max_seq_len=max(lens),
        num_decodes=sum(r[2] == 1 for r in reqs),
    )
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.tensor(pos), cache)), starts


@pytest.mark.parametrize("block_size", [4, 16])
def test_mixed_ragged_batch_over_random_block_tables(block_size):
    config = LlamaConfig.tiny()
    model = LlamaForCausalLM.random(config, seed=2)
    cache = PagedKVCache(config, num_blocks=64, block_size=block_size, backend=TorchBackend())
    for k in cache.k_caches + cache.v_caches:
        k.fill_(float("nan"))  # a stray read of an unused block turns the output into NaN
    gen = torch.Generator().manual_seed(0)
    lengths = [1, 15, 16, 17, 33]
    tokens = [torch.randint(0, config.vocab_size, (n + 1,), generator=gen).tolist() for n in lengths]
    free = (torch.randperm(63, generator=gen) + 1).tolist()
    tables = [[free.pop() for _ in range(-(-(n + 1) // block_size))] for n in lengths]
    # Step 1: every prompt's first len-1 tokens as prefill chunks (the 1-token prompt is a "decode").
    step1 = sorted([(t, 0, len(t) - 1, b) for t, b in zip(tokens, tables)], key=lambda r: r[2] > 1)
    run_step(model, cache, step1, block_size)
    # Step 2: the last token of each as a decode, plus one extend of 2 tokens over a cached prefix.
    extend = tokens[4] + [3, 4]
    ext_table = tables[4] + ([free.pop()] if -(-len(extend) // block_size) > len(tables[4]) else [])
    step2 = [(t, len(t) - 1, 1, b) for t, b in zip(tokens[:4], tables[:4])] + [(extend, 33, 2, ext_table)]
    logits, starts = run_step(model, cache, step2, block_size)
    for i, (t, _, n, _) in enumerate(step2):
        expected = contiguous_logits(model, t[: len(t) if i < 4 else 35])[-n:]
        torch.testing.assert_close(logits[starts[i] : starts[i + 1]], expected, rtol=0, atol=1e-5)


def test_store_skips_padding_slots():
    cache = torch.zeros(4, 4, 1, 2)
    k = torch.ones(3, 1, 2)
    TorchBackend().store_kvcache(k, k, cache, cache.clone(), torch.tensor([5, -1, 6]))
    assert cache.view(-1, 1, 2)[[5, 6]].eq(1).all() and cache.sum() == 4


@settings(max_examples=60, deadline=None)
@given(
    prefix_blocks=st.integers(1, 3),
    suffixes=st.lists(st.integers(0, 9), min_size=2, max_size=5),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_cascade_decode_equals_plain_decode(prefix_blocks, suffixes, dtype, seed):
    """Differential: requests sharing their first blocks, each with its own suffix of any length, none included;
    scoring the prefix once for all of them gives the same output as attending each request's whole context, NaN
    in every unused slot. Both attend in fp32 and round once, so a bf16 output differs by at most one rounding."""
    gen = torch.Generator().manual_seed(seed)
    bs, hkv, d = 4, 2, 8
    k_cache = torch.full((32, bs, hkv, d), float("nan"), dtype=dtype)
    v_cache = torch.full((32, bs, hkv, d), float("nan"), dtype=dtype)
    shared = list(range(1, 1 + prefix_blocks))
    tables, lens = [], [prefix_blocks * bs + n for n in suffixes]
    next_block = 1 + prefix_blocks
    for n in lens:
        own = -(-n // bs) - prefix_blocks
        tables.append(shared + list(range(next_block, next_block + own)))
        next_block += own
    for t, n in zip(tables, lens):
        for pos in range(n):
            k_cache[t[pos // bs], pos % bs] = torch.randn(hkv, d, generator=gen)
            v_cache[t[pos // bs], pos % bs] = torch.randn(hkv, d, generator=gen)
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), 3 * hkv, d, generator=gen).to(dtype)
    be = TorchBackend()
    plain = be.decode(q, k_cache, v_cache, block_tables, seq_lens, 0.3)
    cascade = be.decode(q, k_cache, v_cache, block_tables, seq_lens, 0.3, num_common_prefix_blocks=prefix_blocks)
    assert not plain.isnan().any() and cascade.dtype == dtype
    rounding = 1e-5 if dtype == torch.float32 else 2**-7 * plain.abs().float()
    assert ((cascade.float() - plain.float()).abs() <= rounding).all(), (suffixes, prefix_blocks)


def test_common_prefix_counts_shared_leading_blocks():
    from nanoengine.worker.model_runner import num_common_prefix_blocks

    assert num_common_prefix_blocks([[4, 5, 6, 9], [4, 5, 7, 0], [4, 5, 6, 8]]) == 2
    assert num_common_prefix_blocks([[4, 5, 0], [4, 5, 0]]) == 2, "null-block padding is never a shared prefix"
    assert num_common_prefix_blocks([[4, 5]]) == 0


def test_one_request_decode_reads_each_steps_tables():
    """TorchBackend reads a one-request decode's length and blocks once per step (per pair of tensors): a later
    step's new tensors must be read afresh, as a fresh backend reads them."""
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(8, 4, 2, 8, generator=gen), torch.randn(8, 4, 2, 8, generator=gen)
    q = torch.randn(1, 4, 8, generator=gen)
    be = TorchBackend()
    for table, n in [([3, 5, 0], 6), ([3, 5, 0], 7), ([6, 2, 1], 12)]:
        args = (torch.tensor([table], dtype=torch.int32), torch.tensor([n], dtype=torch.int32))
        expected = TorchBackend().decode(q, k_cache, v_cache, *args, 0.3)
        assert torch.equal(be.decode(q, k_cache, v_cache, *args, 0.3), expected)


@pytest.mark.parametrize("tables, lens", [([[3, 5, 6]], [10]), ([[3, 5, 6], [1, 2, 0]], [10, 7])])
def test_a_decode_attends_in_fp32_over_bf16_caches(tables, lens):
    """One request (its kept context) or several (the padded gather): bf16 queries and caches give SDPA's fp32
    output over the widened values, rounded to bf16 once. SDPA in bf16, as prefill computes, rounds its softmax
    weights to bf16 first."""
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = (torch.randn(8, 4, 2, 8, generator=gen).bfloat16() for _ in range(2))
    q = torch.randn(len(lens), 4, 8, generator=gen).bfloat16()
    table_t = torch.tensor(tables, dtype=torch.int32)
    out = TorchBackend().decode(q, k_cache, v_cache, table_t, torch.tensor(lens, dtype=torch.int32), 0.3)
    for b, n in enumerate(lens):
        k, v = (
            c.index_select(0, table_t[b].long()).flatten(0, 1)[:n].transpose(0, 1)[None] for c in (k_cache, v_cache)
        )
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[b : b + 1, :, None].float(), k.float(), v.float(), scale=0.3, enable_gqa=True
        )
        assert torch.equal(out[b], expected[0, :, 0].bfloat16()), (b, n)


def _decode_inputs(table: list[int], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([table], dtype=torch.int32), torch.tensor([n], dtype=torch.int32)


def test_a_request_decoding_alone_extends_its_gathered_context():
    """The engine's pattern (store the new token at position n - 1, then decode n tokens) extends the context the
    last step gathered instead of gathering it again: a value changed behind the backend's back, which the
    invariant forbids, shows it; the next step of another request gathers afresh."""
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache = torch.randn(8, 4, 2, 8, generator=gen), torch.randn(8, 4, 2, 8, generator=gen)
    q = torch.randn(1, 4, 8, generator=gen)
    be, table = TorchBackend(), [3, 5, 6]
    for n in (6, 7, 8):
        slot = table[(n - 1) // 4] * 4 + (n - 1) % 4
        k, v = torch.randn(1, 2, 8, generator=gen), torch.randn(1, 2, 8, generator=gen)
        be.store_kvcache(k, v, k_cache, v_cache, torch.tensor([slot]))
        out = be.decode(q, k_cache, v_cache, *_decode_inputs(table, n), 0.3)
        assert torch.equal(out, TorchBackend().decode(q, k_cache, v_cache, *_decode_inputs(table, n), 0.3))
    k_cache[3, 0] = 0.0  # behind the backend's back
    slot = table[8 // 4] * 4 + 8 % 4
    be.store_kvcache(torch.ones(1, 2, 8), torch.ones(1, 2, 8), k_cache, v_cache, torch.tensor([slot]))
    kept = be.decode(q, k_cache, v_cache, *_decode_inputs(table, 9), 0.3)
    assert not torch.equal(kept, TorchBackend().decode(q, k_cache, v_cache, *_decode_inputs(table, 9), 0.3))


def test_a_layer_a_cut_step_skipped_does_not_extend_another_requests_context():
    """Two requests share their first two blocks. B decodes alone to 9 tokens (its ninth in its own third block);
    A's step to 9 tokens runs only its first layer (cut by an exception); A's next step must not extend the
    second layer's context, which still holds B's ninth token, not A's. Found by the interleaving test below."""
    gen = torch.Generator().manual_seed(0)
    layers = [tuple(torch.randn(12, 4, 2, 8, generator=gen) for _ in range(2)) for _ in range(2)]
    be, tables = TorchBackend(), {"A": [1, 2, 3], "B": [1, 2, 9]}

    def step(r: str, n: int, layers) -> None:
        slot = tables[r][(n - 1) // 4] * 4 + (n - 1) % 4
        for caches in layers:
            q = torch.randn(1, 4, 8, generator=gen)
            be.store_kvcache(*(torch.randn(1, 2, 8, generator=gen) for _ in range(2)), *caches, torch.tensor([slot]))
            args = _decode_inputs(tables[r], n)
            assert torch.equal(be.decode(q, *caches, *args, 0.3), TorchBackend().decode(q, *caches, *args, 0.3)), r

    step("B", 8, layers)
    step("B", 9, layers)
    step("A", 9, layers[:1])
    step("A", 10, layers)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_one_request_decodes_equal_a_fresh_backends_under_any_interleaving(data):
    """Differential: whatever a backend has stored and decoded before (one request's steps, another's, stores of
    one or more tokens anywhere, a step cut short after its first layer, a context length that jumps), its
    one-request decode equals a fresh backend's, which has no gathered context to reuse. Two layers."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TorchBackend, "MIN_CONTEXT", 2)  # so contexts outgrow their storage too
        _interleave(data)


def _interleave(data) -> None:
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))  # a kept context is fp32 over either

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    bs = 4
    layers = [tuple(randn(12, bs, 2, 8) for _ in range(2)) for _ in range(2)]
    be = TorchBackend()
    tables = [[1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 9, 10]]  # the third shares two blocks with the first
    lengths = [5, 3, 9]

    def slot(r: int, position: int) -> int:
        return tables[r][position // bs] * bs + position % bs

    def decode(r: int, caches) -> None:
        q = randn(1, 4, 8)
        args = _decode_inputs(tables[r], lengths[r])
        expected = TorchBackend().decode(q, *caches, *args, 0.3)
        assert torch.equal(be.decode(q, *caches, *args, 0.3), expected), (r, lengths[r])

    for _ in range(data.draw(st.integers(1, 30))):
        kind = data.draw(st.sampled_from(["step", "step", "step", "store", "misstep", "cut", "many", "jump"]))
        r = data.draw(st.sampled_from([0, 0, 0, 1, 2]))
        if kind == "store":  # tokens written into a context, as another request's prefill or a stray write would
            positions = data.draw(st.lists(st.integers(0, 15), min_size=1, max_size=3, unique=True))
            k, v = (randn(len(positions), 2, 8) for _ in range(2))
            for caches in layers:
                be.store_kvcache(k, v, *caches, torch.tensor([slot(r, p) for p in positions]))
        elif kind == "many":  # a step that decodes two requests
            q = randn(2, 4, 8)
            args = (torch.tensor(tables[:2], dtype=torch.int32), torch.tensor(lengths[:2], dtype=torch.int32))
            for caches in layers:
                expected = TorchBackend().decode(q, *caches, *args, 0.3)
                assert torch.equal(be.decode(q, *caches, *args, 0.3), expected)
        elif kind == "jump":
            lengths[r] = data.draw(st.integers(0, 16))  # 0: an empty context, which a kernel test decodes
            for caches in layers:
                decode(r, caches)
        else:  # one token stored where the next position goes (a misstep: anywhere in the context), then decoded
            lengths[r] = min(lengths[r] + 1, 16)
            written = data.draw(st.integers(0, 15)) if kind == "misstep" else lengths[r] - 1
            for caches in layers[:1] if kind == "cut" else layers:
                k, v = (randn(1, 2, 8) for _ in range(2))
                be.store_kvcache(k, v, *caches, torch.tensor([slot(r, written)]))
                decode(r, caches)
