"""The Triton paged-attention kernels against TorchBackend, the gather+SDPA reference.

On the CPU the kernels run under the interpreter in fp32 on tiny shapes. Every cache slot that no
request owns (the null block 0, spare blocks, the tail of each last block) holds NaN in the cache the
kernel reads, so a single stray read turns the output into NaN; the reference reads a copy with
zeros there. Block tables are random permutations of the pool and carry a column of null padding.
The `gpu` tests repeat the cases in bf16/fp16 and add large shapes and the engine end to end.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton is not installed (it publishes wheels for Linux only)")
pytestmark = pytest.mark.triton
tl = triton.language
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoengine.attention.backend import AttentionMetadata, TorchBackend
from nanoengine.attention.paged import PagedKVCache
from nanoengine.attention.triton_backend import TritonBackend
from nanoengine.attention.triton_kernels import (
    DECODE_BLOCK_N,
    PREFILL_BLOCK_M,
    PREFILL_BLOCK_N,
    aligned16,
    choose_num_splits,
    online_softmax_step,
    paged_decode,
    paged_prefill,
    store_kvcache,
)
from nanoengine.config import LlamaConfig

CONTEXT_LENS = [1, 15, 16, 17, 33]
# (query_len, seq_len): a block-aligned prompt, an unaligned one, a 1-token extend over a fully
# cached prefix, a chunk after a cached prefix, and a 1-token prompt.
PREFILL_CHUNKS = [(16, 16), (17, 17), (1, 33), (5, 20), (1, 1)]
GROUPS = [1, 3, 4]
BLOCK_SIZES = [8, 16]
GPU_DTYPES = [(torch.bfloat16, 2e-2), (torch.float16, 2e-2), (torch.float32, 1e-4)]
CPU_TOL = 1e-4
gpu = pytest.mark.gpu


@dataclass
class Case:
    """One step's inputs twice over: `k/v_cache` with NaN in unowned slots, `k/v_clean` with 0."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_clean: torch.Tensor
    v_clean: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    scale: float


def make_case(
    seq_lens,
    query_lens,
    *,
    num_kv_heads=2,
    group=3,
    head_dim=32,
    block_size=16,
    dtype=torch.float32,
    device="cpu",
    seed=0,
) -> Case:
    gen = torch.Generator().manual_seed(seed)
    dev_gen = torch.Generator(device=device).manual_seed(seed)  # large tensors are drawn on the device
    blocks = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(blocks) + 3  # block 0 is the null block; 3 spare blocks stay NaN
    pool = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = torch.zeros(len(seq_lens), max(blocks) + 1, dtype=torch.int32)
    owned = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    for i, (n, seq_len) in enumerate(zip(blocks, seq_lens)):
        ids = torch.tensor(pool[:n], dtype=torch.long)
        pool = pool[n:]
        tables[i, :n] = ids
        positions = torch.arange(seq_len)
        owned[ids[positions // block_size] * block_size + positions % block_size] = True
    owned = owned.view(num_blocks, block_size, 1, 1).to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k, v = (torch.randn(shape, device=device, generator=dev_gen) for _ in "kv")
    q = torch.randn(sum(query_lens), num_kv_heads * group, head_dim, device=device, generator=dev_gen)
    starts = torch.tensor([0, *query_lens]).cumsum(0)

    def put(x):
        return x.to(dtype)

    return Case(
        q=put(q),
        k_cache=put(k.masked_fill(~owned, torch.nan)),
        v_cache=put(v.masked_fill(~owned, torch.nan)),
        k_clean=put(k * owned),
        v_clean=put(v * owned),
        block_tables=tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=starts.to(device=device, dtype=torch.int32),
        max_query_len=max(query_lens),
        scale=head_dim**-0.5,
    )


def decode_case(seq_lens, **kw) -> Case:
    return make_case(seq_lens, [1] * len(seq_lens), **kw)


def prefill_case(chunks, **kw) -> Case:
    query_lens, seq_lens = zip(*chunks)
    return make_case(list(seq_lens), list(query_lens), **kw)


def reference_decode(c: Case) -> torch.Tensor:
    """TorchBackend in fp32 on the clean caches, 8 requests at a time (its gather copies contexts)."""
    k, v = c.k_clean.float(), c.v_clean.float()
    return torch.cat(
        [
            TorchBackend().decode(
                c.q[i : i + 8].float(), k, v, c.block_tables[i : i + 8], c.seq_lens[i : i + 8], c.scale
            )
            for i in range(0, c.q.shape[0], 8)
        ]
    )


def reference_prefill(c: Case) -> torch.Tensor:
    return TorchBackend().prefill(
        c.q.float(),
        c.k_clean.float(),
        c.v_clean.float(),
        c.block_tables,
        c.query_start_loc,
        c.seq_lens,
        c.max_query_len,
        c.scale,
    )


def run_decode(c: Case, **kw) -> torch.Tensor:
    return paged_decode(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale, **kw)


def run_prefill(c: Case, **kw) -> torch.Tensor:
    return paged_prefill(
        c.q, c.k_cache, c.v_cache, c.block_tables, c.query_start_loc, c.seq_lens, c.max_query_len, c.scale, **kw
    )


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert not out.isnan().any(), "NaN in the output: a masked or unowned slot was read"
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


# --- store -------------------------------------------------------------------------------------


def check_store(block_size: int, dtype: torch.dtype, device: str) -> None:
    gen = torch.Generator().manual_seed(1)
    num_blocks, num_kv_heads, head_dim, num_tokens = 6, 3, 32, 11
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(device, dtype)
    v_cache = torch.randn(shape, generator=gen).to(device, dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[0, 4, 10]] = -1
    # Project k/v out of a wider tensor, as a fused qkv projection would: the token stride is not Hkv*D.
    kv = torch.randn(num_tokens, 2 * num_kv_heads, head_dim, generator=gen).to(device, dtype)
    k, v = kv[:, :num_kv_heads], kv[:, num_kv_heads:]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    TorchBackend().store_kvcache(k, v, expected_k, expected_v, slots.to(device))
    store_kvcache(k, v, k_cache, v_cache, slots.to(device))
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_store_writes_slots_and_skips_padding(block_size):
    check_store(block_size, torch.float32, "cpu")


# --- decode ------------------------------------------------------------------------------------


def check_ragged_batches(group: int, block_size: int, dtype: torch.dtype, device: str, tol: float) -> None:
    """Decode over CONTEXT_LENS and prefill over PREFILL_CHUNKS, in 16-token tiles (several per
    request) and in the default tiles (one tile spanning several blocks); decode also split in two."""
    kw = {"group": group, "block_size": block_size, "dtype": dtype, "device": device}
    c = decode_case(CONTEXT_LENS, **kw)
    ref = reference_decode(c)
    for num_splits, block_n in [(1, 16), (2, 16), (None, DECODE_BLOCK_N)]:
        assert_close(run_decode(c, num_splits=num_splits, block_n=block_n), ref, tol)
    c = prefill_case(PREFILL_CHUNKS, **kw)
    ref = reference_prefill(c)
    for block_m, block_n in [(16, 16), (PREFILL_BLOCK_M, PREFILL_BLOCK_N)]:
        assert_close(run_prefill(c, block_m=block_m, block_n=block_n), ref, tol)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("group", GROUPS)
def test_ragged_batches(group, block_size):
    check_ragged_batches(group, block_size, torch.float32, "cpu", CPU_TOL)


@pytest.mark.parametrize("num_splits", [2, 4])
def test_decode_split_k(num_splits):
    # Splits of 48 or 32 tokens (whole 16-token tiles): the short requests leave later splits empty.
    c = decode_case([1, 17, 33, 64], block_size=8)
    assert_close(run_decode(c, num_splits=num_splits, block_n=16), reference_decode(c), CPU_TOL)


def test_decode_head_dim_64_smollm2_heads():
    c = decode_case([17, 33], num_kv_heads=3, group=3, head_dim=64)
    assert_close(run_decode(c, block_n=16), reference_decode(c), CPU_TOL)


def _misaligned(x: torch.Tensor) -> torch.Tensor:
    """The same values at a data pointer 4 bytes past a 16-byte boundary."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype)
    view = flat[1:].view(x.shape)
    view.copy_(x)
    assert view.data_ptr() % 16 != 0
    return view


def test_misaligned_queries_are_copied_not_misread():
    """_row_ptrs tells the compiler every row starts 16-byte aligned; the launchers must make it so."""
    c = decode_case([17, 33], num_kv_heads=2, group=2)
    assert aligned16(_misaligned(c.q)).data_ptr() % 16 == 0 and aligned16(c.q) is c.q
    assert_close(
        paged_decode(_misaligned(c.q), c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale, block_n=16),
        reference_decode(c),
        CPU_TOL,
    )
    p = prefill_case([(5, 20), (1, 33)], num_kv_heads=2, group=2)
    assert_close(
        paged_prefill(
            _misaligned(p.q),
            p.k_cache,
            p.v_cache,
            p.block_tables,
            p.query_start_loc,
            p.seq_lens,
            p.max_query_len,
            p.scale,
        ),
        reference_prefill(p),
        CPU_TOL,
    )
    with pytest.raises(AssertionError, match="16-byte aligned"):
        paged_decode(c.q, _misaligned(c.k_cache), c.v_cache, c.block_tables, c.seq_lens, c.scale)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_empty_context_gives_zeros_not_nan(num_splits):
    """A padded batch row (seq_len 0) has no key at all: every split is empty, m = -inf, l = 0."""
    c = decode_case([0, 33], block_size=8)
    out = run_decode(c, num_splits=num_splits, block_n=16)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_close(out[1:], reference_decode(c)[1:], CPU_TOL)


def test_split_heuristic():
    sms = 132
    assert choose_num_splits(64, 8, 2048, sms) >= 2  # 512 programs on 132 SMs leave a ragged last wave
    assert choose_num_splits(256, 8, 8192, sms) == 1  # plenty of programs already
    assert choose_num_splits(1, 8, 8192, sms) == 32  # few sequences: split, as far as MAX_SPLITS
    assert choose_num_splits(1, 8, 1024, sms) == 4  # ... but into no fewer than 256 tokens each
    assert choose_num_splits(1, 8, 300, sms) == 1  # too short to be worth a split


# --- prefill -----------------------------------------------------------------------------------


def test_prefill_default_tiles_and_head_dim_64():
    c = prefill_case([(17, 17), (1, 33), (5, 20)], num_kv_heads=1, head_dim=64, block_size=8)
    assert_close(run_prefill(c), reference_prefill(c), CPU_TOL)


@settings(max_examples=12, deadline=None, database=None)
@given(
    chunks=st.lists(st.tuples(st.integers(1, 20), st.integers(0, 40)), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 3]),
    block_size=st.sampled_from(BLOCK_SIZES),
    seed=st.integers(0, 99),
)
def test_prefill_random_chunks(chunks, group, block_size, seed):
    """Any mix of chunk lengths and cached-prefix lengths, including tiles that cross blocks."""
    chunks = [(q_len, prefix + q_len) for q_len, prefix in chunks]
    c = prefill_case(chunks, num_kv_heads=1, group=group, head_dim=16, block_size=block_size, seed=seed)
    assert_close(run_prefill(c, block_m=16, block_n=16), reference_prefill(c), CPU_TOL)


@triton.jit
def _softmax_step_probe(s_ptr, v_ptr, mask_ptr, out_ptr, N: tl.constexpr):
    """Run one online-softmax step on an identity q/k (scores = the given s) and store acc, m, l."""
    i = tl.arange(0, N)
    eye = tl.where(i[:, None] == i[None, :], 1.0, 0.0)
    s = tl.load(s_ptr + i[:, None] * N + i[None, :])
    v = tl.load(v_ptr + i[:, None] * N + i[None, :])
    mask = tl.load(mask_ptr + i[:, None] * N + i[None, :]) != 0
    m_i = tl.full([N], float("-inf"), tl.float32)
    m_i, l_i, acc = online_softmax_step(
        s, eye, v, mask, m_i, tl.zeros([N], tl.float32), tl.zeros([N, N], tl.float32), 1.0, "ieee"
    )
    tl.store(out_ptr + i[:, None] * N + i[None, :], acc)
    tl.store(out_ptr + N * N + i, m_i)
    tl.store(out_ptr + N * N + N + i, l_i)


def test_fully_masked_row_stays_finite():
    """A row whose keys are all masked keeps m = -inf, l = 0, acc = 0 instead of (-inf) - (-inf) = NaN."""
    n = 16
    mask = torch.ones(n, n, dtype=torch.int32)
    mask[0] = 0
    s, v = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n * n + 2 * n)
    _softmax_step_probe[(1,)](s, v, mask, out, N=n)
    acc, m, l = out[: n * n].view(n, n), out[n * n : n * n + n], out[n * n + n :]
    assert m[0] == float("-inf") and l[0] == 0 and torch.equal(acc[0], torch.zeros(n))
    p = torch.exp2(s[1:] - s[1:].max(1, keepdim=True).values)
    torch.testing.assert_close(acc[1:], p @ v, atol=CPU_TOL, rtol=CPU_TOL)


# --- the backend behind PagedKVCache -----------------------------------------------------------


def test_backend_mixed_step_matches_torch():
    """Two decodes then two chunks through PagedKVCache: store, decode and prefill together."""
    chunks = [(1, 17), (1, 33), (16, 16), (5, 20)]
    c = prefill_case(chunks, group=3, block_size=8)
    config = LlamaConfig(
        vocab_size=8,
        hidden_size=6 * 32,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=32,
    )
    block_size = c.k_cache.shape[1]
    positions = [range(seq_len - q_len, seq_len) for q_len, seq_len in chunks]
    slots = [
        int(c.block_tables[i, p // block_size]) * block_size + p % block_size
        for i, ps in enumerate(positions)
        for p in ps
    ]
    new_k = torch.randn(c.q.shape[0], 2, 32)
    new_v = torch.randn(c.q.shape[0], 2, 32)
    md = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start_loc=c.query_start_loc,
        seq_lens=c.seq_lens,
        block_tables=c.block_tables,
        max_query_len=16,
        max_seq_len=33,
        num_decodes=2,
    )
    outs = []
    for backend, k_cache, v_cache in [(TritonBackend(), c.k_cache, c.v_cache), (TorchBackend(), c.k_clean, c.v_clean)]:
        cache = PagedKVCache(config, num_blocks=k_cache.shape[0], block_size=block_size, backend=backend)
        cache.k_caches, cache.v_caches, cache.metadata = [k_cache.clone()], [v_cache.clone()], md
        outs.append(cache(0, c.q, new_k, new_v))
    assert_close(outs[0], outs[1], CPU_TOL)


def test_backend_name():
    assert TritonBackend.name == "triton"


ENGINE_PROMPTS = ["The capital of Japan is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 5, 8,"]


def greedy_token_ids(llm, prompts: list[str] | list[list[int]], max_tokens: int) -> list[list[int]]:
    from nanoengine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    key = "prompt_token_ids" if isinstance(prompts[0], list) else "prompts"
    return [list(out.token_ids) for out in llm.generate(**{key: prompts}, sampling_params=params)]


@pytest.mark.model
def test_engine_greedy_matches_torch_backend_on_cpu(llm):
    """The real model through the engine with the kernels on the interpreter: same greedy tokens."""
    from nanoengine import LLM

    if torch.cuda.is_available():
        pytest.skip("the session's LLM runs on CUDA there; test_gpu_engine_greedy_matches_torch_backend covers it")
    assert llm.backend.name == "torch"
    prompts = ENGINE_PROMPTS[:2]
    expected = greedy_token_ids(llm, prompts, 6)
    assert greedy_token_ids(LLM(attention_backend="triton", progress=False), prompts, 6) == expected


# --- GPU ---------------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype,tol", GPU_DTYPES)
def test_gpu_small_cases(dtype, tol, group, block_size):
    check_store(block_size, dtype, "cuda")
    check_ragged_batches(group, block_size, dtype, "cuda", tol)


@gpu
@pytest.mark.parametrize("heads", [(32, 8, 128), (9, 3, 64)])
@pytest.mark.parametrize("batch,max_len", [(64, 2048), (64, 8192), (1, 8192), (4, 8192)])
def test_gpu_decode_large(heads, batch, max_len):
    """Ragged contexts up to max_len, without split-K, with the heuristic's choice and with 7 splits."""
    num_heads, num_kv_heads, head_dim = heads
    lens = torch.randint(1, max_len + 1, (batch,), generator=torch.Generator().manual_seed(batch)).tolist()
    lens[0] = max_len
    c = decode_case(
        lens,
        num_kv_heads=num_kv_heads,
        group=num_heads // num_kv_heads,
        head_dim=head_dim,
        dtype=torch.bfloat16,
        device="cuda",
    )
    ref = reference_decode(c)
    for num_splits in (1, None, 7):
        assert_close(run_decode(c, num_splits=num_splits), ref, 2e-2)


@gpu
@pytest.mark.parametrize("heads", [(32, 8, 128), (9, 3, 64)])
def test_gpu_prefill_large(heads):
    num_heads, num_kv_heads, head_dim = heads
    chunks = [(512, 512), (1024, 3072), (1, 8192), (77, 1000), (2048, 2048)]
    c = prefill_case(
        chunks,
        num_kv_heads=num_kv_heads,
        group=num_heads // num_kv_heads,
        head_dim=head_dim,
        dtype=torch.bfloat16,
        device="cuda",
    )
    assert_close(run_prefill(c), reference_prefill(c), 2e-2)


@gpu
def test_gpu_engine_greedy_matches_torch_backend():
    """Greedy tokens are the same through both backends, in fp32 (in bf16 a rounding difference
    between the kernels could flip a near-tie between the top two logits). Random weights in
    SmolLM2-135M's shapes: the GPU machine has no model package, and the kernels see the same shapes.
    std=0.2 makes every token depend on the whole context, so a wrong K/V read changes the output."""
    from nanoengine import LLM
    from nanoengine.model import LlamaForCausalLM

    model = LlamaForCausalLM.random(LlamaConfig.smollm2_135m(), std=0.2, device="cuda", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 49152, (n,), generator=gen).tolist() for n in (5, 17, 40, 300)]
    # A pool of its own size, not a share of whatever the GPU has free while other processes use it.
    token_ids = {
        backend: greedy_token_ids(
            LLM(model, attention_backend=backend, kv_cache_memory_bytes=2**30, progress=False), prompts, 32
        )
        for backend in ("torch", "triton")
    }
    assert token_ids["triton"] == token_ids["torch"]


@gpu
def test_gpu_cuda_graphs_match_eager():
    """Decode steps replayed from CUDA graphs give the eager engine's greedy tokens, with the batch
    padded up to a captured size (5 requests run in the graph of 8, then fewer as they finish)."""
    from nanoengine import LLM, SamplingParams
    from nanoengine.model import LlamaForCausalLM

    model = LlamaForCausalLM.random(LlamaConfig.smollm2_135m(), std=0.2, device="cuda", dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49152, (n,), generator=gen).tolist() for n in (3, 5, 17, 40, 300)]
    params = [SamplingParams(temperature=0, max_tokens=m, logprobs=2) for m in (40, 8, 16, 24, 32)]
    outputs = {}
    for eager in (False, True):
        llm = LLM(model, enforce_eager=eager, kv_cache_memory_bytes=2**30, progress=False)
        outputs[eager] = [o.outputs[0] for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
        graphs = llm.engine.runner.cuda_graphs
        assert (graphs is None) == eager
    assert graphs is None
    for replayed, eager in zip(outputs[False], outputs[True]):
        assert replayed.token_ids == eager.token_ids
        for got, want in zip(replayed.logprobs, eager.logprobs):  # the logits the graphs computed
            assert got.keys() == want.keys()
            assert all(abs(got[t].logprob - want[t].logprob) < 1e-4 for t in got)
    replayed = LLM(model, kv_cache_memory_bytes=2**30, progress=False)
    replayed.generate(prompt_token_ids=prompts, sampling_params=params)
    assert replayed.engine.runner.cuda_graphs.num_replays == 39, "one prefill step, then 39 replayed decode steps"


@gpu
def test_gpu_replayed_step_leaves_its_metadata():
    """After a decode step replayed from a CUDA graph, kv_cache.metadata is that step's, as after an eager
    step: the course's views read it, and on a GPU they would otherwise show the last prefill's."""
    from nanoengine import LLM, SamplingParams
    from nanoengine.model import LlamaForCausalLM

    model = LlamaForCausalLM.random(LlamaConfig.smollm2_135m(), device="cuda", dtype=torch.float32)
    llm = LLM(model, kv_cache_memory_bytes=2**30, progress=False)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    llm.generate(prompt_token_ids=[list(range(3, 20))], sampling_params=params)
    assert llm.engine.runner.cuda_graphs.num_replays == 4, "one prefill step, then 4 replayed decode steps"
    md = llm.kv_cache.metadata
    assert (md.num_decodes, md.seq_lens.tolist()) == (1, [17 + 4]), "the last step decodes token 5 over 21 cached"


# --- the benchmark script ----------------------------------------------------------------------


def test_bench_interpret_smoke(tmp_path, capsys, monkeypatch):
    """bench/attention.py runs end to end (one tiny shape) and writes its JSON and plot."""
    import importlib.util
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("on CUDA the bench runs its full sweep; run bench/attention.py directly")
    path = Path(__file__).resolve().parents[3] / "bench" / "attention.py"
    spec = importlib.util.spec_from_file_location("bench_attention", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    assert bench.main(["--interpret-smoke", "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "attention_cpu-interpret.json").exists() and (tmp_path / "attention_cpu-interpret.png").exists()
    assert "triton GB/s" in capsys.readouterr().out
