"""Sliding-window layers: the masks against a brute-force softmax, then a hybrid model (three sliding
layers to one full) against Hugging Face's Ministral on the same random weights, through the engine with
prefix caching on and off and under preemption."""

import pytest
import torch
from tiny_gguf import hf_greedy, hf_state_dict

from nanoengine import LLM, SamplingParams
from nanoengine.attention import ContiguousKVCache
from nanoengine.attention.backend import TorchBackend
from nanoengine.config import LlamaConfig
from nanoengine.core import BlockPool, FullAttentionManager, KVCacheManager, SlidingWindowManager
from nanoengine.core.sched.scheduler import Scheduler
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.model import LlamaForCausalLM
from nanoengine.worker.block_table import BlockTable

WINDOW = 24


def brute_force(q, keys, values, positions, window, scale):
    """Each query row i at positions[i] over keys max(0, p - W + 1) .. p, one softmax at a time.
    q [T, Hq, D], keys/values [S, Hkv, D]."""
    group = q.shape[1] // keys.shape[1]
    out = torch.empty_like(q)
    for i, p in enumerate(positions):
        lo = 0 if window is None else max(0, p - window + 1)
        k = keys[lo : p + 1].repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = values[lo : p + 1].repeat_interleave(group, dim=1)
        weights = torch.softmax(torch.einsum("hd,nhd->hn", q[i], k) * scale, dim=-1)
        out[i] = torch.einsum("hn,nhd->hd", weights, v)
    return out


def random_pool(seq_lens, block_size=8, hkv=2, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-n // block_size) for n in seq_lens)
    num_blocks = 1 + len(seq_lens) * width
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).int()
    tables = ids[: len(seq_lens) * width].view(len(seq_lens), width)
    return k_cache, v_cache, tables


def context(cache, table, n):
    return cache[table.long()].flatten(0, 1)[:n]


@pytest.mark.parametrize("window", [1, 5, 8, 13, 100, None])
def test_decode_and_prefill_see_the_last_w_keys(window):
    seq_lens = [1, 9, 30, 47]
    k_cache, v_cache, tables = random_pool(seq_lens)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(len(seq_lens), 6, 8, generator=gen)
    kwargs = {} if window is None else {"sliding_window": window}
    out = TorchBackend().decode(q, k_cache, v_cache, tables, lens, 0.3, **kwargs)
    for b, n in enumerate(seq_lens):
        expected = brute_force(
            q[b : b + 1], context(k_cache, tables[b], n), context(v_cache, tables[b], n), [n - 1], window, 0.3
        )
        torch.testing.assert_close(out[b : b + 1], expected, rtol=0, atol=1e-5)

    # Chunks of 1, 9, 7 and 20 new tokens over cached prefixes of 0, 0, 23 and 27 tokens.
    new = [1, 9, 7, 20]
    qsl = torch.tensor([0, 1, 10, 17, 37], dtype=torch.int32)
    qp = torch.randn(37, 6, 8, generator=gen)
    out = TorchBackend().prefill(qp, k_cache, v_cache, tables, qsl, lens, max(new), 0.3, **kwargs)
    for b, (n, m) in enumerate(zip(seq_lens, new)):
        rows = slice(int(qsl[b]), int(qsl[b + 1]))
        expected = brute_force(
            qp[rows], context(k_cache, tables[b], n), context(v_cache, tables[b], n), list(range(n - m, n)), window, 0.3
        )
        torch.testing.assert_close(out[rows], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"layer_types": ("full_attention",) * 3}, "must name 4 layers"),
        ({"layer_types": ("full_attention",) * 3 + ("local",)}, "must name 4 layers"),
        ({"layer_types": ("sliding_attention",) * 4}, "sliding_window is not set"),
        ({"layer_types": ("sliding_attention",) * 4, "sliding_window": 0}, "at least 1 token"),
    ],
)
def test_config_rejects_layouts_it_cannot_serve(bad, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig.tiny(num_hidden_layers=4, **bad)


def test_window_per_layer_and_mistral_default():
    assert [LlamaConfig.tiny_hybrid().window(i) for i in range(4)] == [WINDOW, WINDOW, WINDOW, None]
    assert LlamaConfig.tiny(sliding_window=7).window(1) == 7  # no layer_types: every layer slides
    assert LlamaConfig.tiny().window(0) is None


@pytest.fixture(scope="module")
def hybrid():
    """Our hybrid model and Hugging Face's Ministral holding the same random weights."""
    transformers = pytest.importorskip("transformers")
    ours = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(WINDOW), seed=4, std=0.2)
    hf = transformers.MinistralForCausalLM(ours.config.to_hf()).eval()
    hf.load_state_dict(hf_state_dict(ours))
    return ours, hf


def prompts(n=8):
    """8 prompts of 75 to 110 tokens (over 3 windows each) behind a shared 40-token prefix."""
    gen = torch.Generator().manual_seed(2)
    shared = torch.randint(3, 256, (40,), generator=gen).tolist()
    return [shared + torch.randint(3, 256, (35 + 5 * i,), generator=gen).tolist() for i in range(n)]


@pytest.mark.reference
def test_hybrid_logits_match_ministral_prefill_and_decode(hybrid):
    ours, hf = hybrid
    ids = prompts(1)[0]
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
        cache = ContiguousKVCache(ours.config, len(ids))
        rows = []
        for chunk in (ids[:30], ids[30:31], ids[31:60], ids[60:]):  # a prefill, a decode, chunks past the window
            pos = torch.arange(cache.num_tokens, cache.num_tokens + len(chunk))
            rows.append(ours.compute_logits(ours(torch.tensor(chunk), pos, cache)))
            cache.advance(len(chunk))
    torch.testing.assert_close(torch.cat(rows), expected, rtol=0, atol=1e-4)

    # The windows matter here: the same weights with full attention agree up to position W - 1 only.
    transformers = pytest.importorskip("transformers")
    full = transformers.LlamaForCausalLM(LlamaConfig.tiny(num_hidden_layers=4).to_hf()).eval()
    full.load_state_dict(hf_state_dict(ours))
    with torch.no_grad():
        gap = (full(torch.tensor([ids])).logits[0] - expected).abs().amax(-1)
    assert gap[:WINDOW].max() < 1e-4 and gap[WINDOW:].min() > 1e-3


@pytest.mark.reference
@pytest.mark.parametrize(
    "engine",
    [{}, {"enable_prefix_caching": False}, {"num_gpu_blocks_override": 70}],
    ids=["prefix-caching", "no-caching", "preempting"],
)
def test_hybrid_engine_greedy_matches_ministral(hybrid, engine):
    ours, hf = hybrid
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    llm = LLM(ours, block_size=8, progress=False, **({"kv_cache_memory_bytes": 2**20} | engine))
    outs = llm.generate(prompt_token_ids=prompts(), sampling_params=params)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 10) for p in prompts()]
    stats = llm.get_stats()
    if engine.get("num_gpu_blocks_override"):
        assert stats.num_preemptions > 0
    if "enable_prefix_caching" not in engine:
        assert sum(o.num_cached_tokens for o in outs) > 0


@pytest.mark.reference
def test_a_model_whose_every_layer_slides_matches_ministral():
    """Mistral-7B-v0.1's layout: no layer_types, so every layer slides and the model has one KV cache group,
    still served by the hybrid manager (KVCacheManager would never free a block behind the window)."""
    transformers = pytest.importorskip("transformers")
    ours = LlamaForCausalLM.random(LlamaConfig.tiny(sliding_window=WINDOW), seed=6, std=0.2)
    hf = transformers.MinistralForCausalLM(ours.config.to_hf()).eval()
    hf.load_state_dict(hf_state_dict(ours))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    expected = [hf_greedy(hf, p, 10) for p in prompts(3)]
    for engine in ({}, {"enable_prefix_caching": False}):
        llm = LLM(ours, block_size=8, kv_cache_memory_bytes=2**20, progress=False, **engine)
        assert len(llm.kv_cache.groups) == 1
        outs = llm.generate(prompt_token_ids=prompts(3), sampling_params=params)
        assert [o.token_ids for o in outs] == expected, engine
        pool = llm.engine.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


@pytest.mark.parametrize("window", [1, 13, 16, 40, None])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.triton
def test_triton_kernels_take_the_window(window, splits):
    """The kernels in the interpreter against the torch reference, with unowned slots holding NaN."""
    pytest.importorskip("triton", reason="Triton publishes wheels for Linux only")
    from nanoengine.attention import triton_kernels as tk

    seq_lens = [1, 9, 30, 47, 70]
    k_cache, v_cache, tables = random_pool(seq_lens, block_size=8, d=16)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    for cache in (k_cache, v_cache):  # slots past each request's length: a read of one would show
        for b, n in enumerate(seq_lens):
            for t in range(n, tables.shape[1] * 8):
                cache[int(tables[b, t // 8]), t % 8] = float("nan")
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(len(seq_lens), 6, 16, generator=gen)
    kwargs = {} if window is None else {"sliding_window": window}
    expected = TorchBackend().decode(q, k_cache, v_cache, tables, lens, 0.25, **kwargs)
    out = tk.paged_decode(q, k_cache, v_cache, tables, lens, 0.25, num_splits=splits, block_n=16, **kwargs)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)

    new = [1, 9, 7, 20, 33]
    qsl = torch.tensor([0, 1, 10, 17, 37, 70], dtype=torch.int32)
    qp = torch.randn(70, 6, 16, generator=gen)
    expected = TorchBackend().prefill(qp, k_cache, v_cache, tables, qsl, lens, max(new), 0.25, **kwargs)
    out = tk.paged_prefill(qp, k_cache, v_cache, tables, qsl, lens, max(new), 0.25, block_m=16, block_n=16, **kwargs)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_chapter_03_style_kernels_refuse_a_window_clearly():
    from nanoengine.attention.backend import KernelBackend

    backend = KernelBackend("your", None, lambda *a: "decoded", lambda *a: "prefilled")
    assert backend.decode(None, None, None, None, None, 1.0) == "decoded"
    with pytest.raises(ValueError, match="full attention only"):
        backend.decode(None, None, None, None, None, 1.0, sliding_window=8)


@pytest.mark.reference
@pytest.mark.triton
def test_hybrid_engine_on_the_triton_kernels_matches_torch_attention():
    pytest.importorskip("triton", reason="Triton publishes wheels for Linux only")
    model = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(WINDOW, head_dim=16, hidden_size=96), seed=5, std=0.2)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    runs = {}
    for backend in ("torch", "triton"):
        llm = LLM(model, block_size=8, kv_cache_memory_bytes=2**20, attention_backend=backend, progress=False)
        runs[backend] = [o.token_ids for o in llm.generate(prompt_token_ids=prompts(3), sampling_params=params)]
    assert runs["triton"] == runs["torch"]


def test_sliding_blocks_stay_within_the_window_for_2000_tokens():
    """vLLM's bound, measured from the pool: while a request generates 2,000 tokens, each sliding group
    holds at most ceil(W / block_size) + 1 blocks, the full group one block per 8 tokens, and the pool's
    blocks in use are exactly those."""
    model = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(WINDOW, max_position_embeddings=2100), seed=4, std=0.2)
    llm = LLM(model, block_size=8, kv_cache_memory_bytes=2**20, progress=False)
    kv = llm.engine.kv_cache_manager
    pool = kv.block_pool
    llm.engine.add_request(list(range(3, 23)), SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True))
    peak_sliding, peak_full = 0, 0
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
        if not any(m.req_to_blocks for m in kv.coordinator.single_type_managers):
            break
        ((full,),) = [m.req_to_blocks.values() for m in kv.coordinator.single_type_managers[:1]]
        sliding = [
            sum(not b.is_null for b in blocks)
            for m in kv.coordinator.single_type_managers[1:]
            for blocks in m.req_to_blocks.values()
        ]
        assert pool.num_gpu_blocks - 1 - pool.get_num_free_blocks() == len(full) + sum(sliding)
        peak_sliding, peak_full = max(peak_sliding, *sliding), max(peak_full, len(full))
    assert peak_sliding == -(-WINDOW // 8) + 1 and peak_full == -(-2020 // 8)
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


@pytest.mark.parametrize(
    "config, fits",
    [(LlamaConfig.tiny(num_hidden_layers=4), 4), (LlamaConfig.tiny_hybrid(WINDOW), 11)],
    ids=["full", "hybrid"],
)
def test_a_hybrid_pool_fits_nearly_three_times_the_requests(config, fits):
    """The same 495,616 bytes of KV, 240-token requests sharing no prefix: 121 four-layer blocks hold 4 of them at once
    (30 blocks each); the hybrid's 484 one-layer blocks hold 11 (30 full-attention blocks and at most
    4 per sliding group each). One request more and the engine must preempt."""
    model = LlamaForCausalLM.random(config, seed=1)
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for k, preempts in ((fits, False), (fits + 1, True)):
        llm = LLM(model, block_size=8, kv_cache_memory_bytes=121 * 8 * 512, max_num_seqs=k, progress=False)
        llm.generate(prompt_token_ids=[p[-40:] for p in prompts(k)], sampling_params=params)
        assert (llm.get_stats().num_preemptions > 0) is preempts, k


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"block_size": 32}, "below one block of 32 tokens"),
        ({"max_model_len": 16, "block_size": 8}, "exceeds max_model_len=16"),
    ],
)
@pytest.mark.parametrize(
    "config", [LlamaConfig.tiny_hybrid(WINDOW), LlamaConfig.tiny(sliding_window=WINDOW)], ids=["hybrid", "all-sliding"]
)
def test_windows_the_engine_cannot_serve_are_refused_clearly(kwargs, message, config):
    from nanoengine.errors import UnsupportedModelError

    model = LlamaForCausalLM.random(config, seed=0)
    with pytest.raises(UnsupportedModelError, match=message):
        LLM(model, kv_cache_memory_bytes=2**20, progress=False, **kwargs)


@pytest.mark.parametrize(
    "config", [LlamaConfig.tiny_hybrid(WINDOW), LlamaConfig.tiny(sliding_window=WINDOW)], ids=["hybrid", "all-sliding"]
)
def test_parts_of_ones_own_serve_a_windowed_model(config):
    """One KV-manager shape: every seam's part serves windowed models too, with the engine's greedy tokens."""
    model = LlamaForCausalLM.random(config, seed=0)
    parts = {
        name: type("Mine", (base,), {})
        for name, base in [
            ("scheduler_cls", Scheduler),
            ("kv_cache_manager_cls", KVCacheManager),
            ("block_table_cls", BlockTable),
            ("full_attention_manager_cls", FullAttentionManager),
            ("sliding_window_manager_cls", SlidingWindowManager),
        ]
    }
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outputs = []
    for kwargs in ({}, {**parts, "block_pool": type("MyPool", (BlockPool,), {})}):
        llm = LLM(model, kv_cache_memory_bytes=2**20, progress=False, **kwargs)
        outputs.append([o.token_ids for o in llm.generate(prompt_token_ids=prompts(4), sampling_params=params)])
        assert llm.engine.kv_cache_manager.usage == 0
    assert outputs[0] == outputs[1]


def test_a_pool_that_ignores_groups_is_refused_for_a_hybrid_model():
    class OneGroupPool(BlockPool):
        def get_cached_block(self, block_hash, token_ids=None):
            return super().get_cached_block(block_hash, token_ids)

    model = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(WINDOW), seed=0)
    with pytest.raises(InvalidEngineArgumentError, match="get_cached_block takes no kv_cache_group_id") as info:
        LLM(model, kv_cache_memory_bytes=2**20, progress=False, block_pool=OneGroupPool)
    assert info.value.parameter == "block_pool"
