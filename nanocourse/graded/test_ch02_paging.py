"""Chapter 02 graded tasks: blocks, block tables and slots. Run with `make grade CH=02`."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanocourse.differential import Story
from nanocourse.kv_memory import greedy_generate
from nanoengine import LLM, SamplingParams
from nanoengine.attention import ContiguousKVCache, TorchBackend
from nanoengine.attention.backend import AttentionMetadata
from nanoengine.attention.backend import gather_kv as engine_gather_kv
from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import LlamaConfig
from nanoengine.core import KVCacheManager
from nanoengine.model import LlamaForCausalLM
from nanoengine.request import Request
from nanoengine.worker.block_table import BlockTable


def _prefixed(where: str):
    """assert_close's msg: its own message after `where`, bound now (the loop moves on)."""
    return lambda message: f"{where}: {message}"


CHAPTER = "ch02_paging"


def _engine_num_blocks(num_tokens, block_size):
    """What the engine's KVCacheManager really allocates for a request of num_tokens."""
    manager = KVCacheManager(block_size, num_tokens // block_size + 2, enable_caching=False)
    manager.allocate_slots(Request("r", [0] * num_tokens), num_tokens)
    return len(manager.get_block_ids("r")[0])  # one list per KV cache group; this model has one


def _engine_slot_mapping(block_table, start_pos, num_tokens, block_size):
    """The slots the engine's model runner computes for one request's chunk (its BlockTable)."""
    table = BlockTable(block_size)
    table.add_row("r", list(block_table))
    return table.compute_slot_mapping("r", start_pos, num_tokens)


def _engine_wasted(seq_lens, block_size):
    return sum(_engine_num_blocks(n, block_size) * block_size - n for n in seq_lens)


NANOENGINE = {
    "num_blocks_needed": _engine_num_blocks,
    "slot_mapping": _engine_slot_mapping,
    "gather_kv": engine_gather_kv,
    "wasted_slots": _engine_wasted,
    "BlockTable": BlockTable,
}

BLOCK_SIZE, TABLE = 4, [7, 2, 9, 4]  # deliberately out of order: pages need not be adjacent
CHUNKS = [6, 5, 1, 1]  # two prefill chunks, then two decodes: 13 tokens in 4 blocks


@pytest.fixture(scope="module")
def tiny():
    config = LlamaConfig.tiny()
    model = LlamaForCausalLM.random(config, seed=0)
    tokens = torch.randint(0, config.vocab_size, (sum(CHUNKS),), generator=torch.Generator().manual_seed(0))
    reference = ContiguousKVCache(config, len(tokens))
    with torch.no_grad():
        hidden = model(tokens, torch.arange(len(tokens)), reference)
    return SimpleNamespace(config=config, model=model, tokens=tokens, reference=reference, hidden=hidden)


def run_paged(tiny, slots_fn):
    """Feed the tokens chunk by chunk through a PagedKVCache whose unused slots hold NaN.

    Returns the cache and the hidden states of every position, as the contiguous run computes them.
    """
    cache = PagedKVCache(tiny.config, num_blocks=10, block_size=BLOCK_SIZE, backend=TorchBackend())
    for layer in cache.k_caches + cache.v_caches:
        layer.fill_(float("nan"))  # a write or a read at the wrong slot shows up as NaN
    hidden, start = [], 0
    for n in CHUNKS:
        cache.metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots_fn(TABLE, start, n, BLOCK_SIZE), dtype=torch.int64),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32),
            seq_lens=torch.tensor([start + n], dtype=torch.int32),
            block_tables=torch.tensor([TABLE], dtype=torch.int32),
            max_query_len=n,
            max_seq_len=start + n,
            num_decodes=int(n == 1),
        )
        with torch.no_grad():
            hidden.append(tiny.model(tiny.tokens[start : start + n], torch.arange(start, start + n), cache))
        start += n
    return cache, torch.cat(hidden)


@pytest.mark.task("02.1", "num_blocks_needed rounds up, and zero tokens need no block")
def test_num_blocks_needed(impl):
    cases = {(0, 16): 0, (1, 16): 1, (16, 16): 1, (17, 16): 2, (40, 16): 3, (1000, 256): 4, (7, 1): 7}
    for (n, size), blocks in cases.items():
        assert impl.num_blocks_needed(n, size) == blocks, f"{n} tokens in blocks of {size} need {blocks} blocks"


@pytest.mark.task("02.2", "slot_mapping: block_table[p // size] * size + p % size for each position")
def test_slot_mapping(impl):
    assert list(impl.slot_mapping([7, 3, 9], 0, 5, 4)) == [28, 29, 30, 31, 12], "a prefill from position 0"
    assert list(impl.slot_mapping([7, 3, 9], 6, 4, 4)) == [14, 15, 36, 37], "a chunk starting mid-block"
    assert list(impl.slot_mapping([7, 3, 9], 9, 1, 4)) == [37], "a decode: one position"
    assert list(impl.slot_mapping([5], 0, 0, 16)) == [], "no tokens, no slots"


@pytest.mark.task("02.2b", "your slot_mapping drives a real paged forward pass to the contiguous result")
def test_slot_mapping_runs_the_model(impl, tiny):
    _, hidden = run_paged(tiny, impl.slot_mapping)
    assert not hidden.isnan().any(), "attention read a slot that was never written: check the mapping"
    torch.testing.assert_close(
        hidden,
        tiny.hidden,
        rtol=0,
        atol=1e-5,
        msg=lambda m: (
            f"hidden states of the paged run (your slot_mapping, block table "
            f"{TABLE}, chunks of {CHUNKS} tokens) differ from the contiguous "
            f"cache's: {m}"
        ),
    )


@pytest.mark.task("02.3", "gather_kv reads the right blocks in table order and stops at seq_len")
def test_gather_kv(impl):
    cache = torch.full((10, 4, 2, 3), float("nan"))
    table = torch.tensor([5, 2, 7, 0, 0], dtype=torch.int32)  # padded with the null block
    for block in (5, 2, 7):
        cache[block] = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(block))
    out = impl.gather_kv(cache, table, 10)
    assert out.shape == (10, 2, 3), (
        f"gather_kv(cache, table [5, 2, 7, 0, 0], seq_len=10) with 4-token blocks must return [seq_len, num_kv_heads, "
        f"head_dim] = [10, 2, 3]: read ceil(10 / 4) = 3 blocks, then cut at seq_len; got {list(out.shape)}"
    )
    torch.testing.assert_close(
        out,
        torch.cat([cache[5], cache[2], cache[7, :2]]),
        rtol=0,
        atol=0,
        msg=lambda m: (
            "gather_kv(cache, [5, 2, 7, 0, 0], 10) must be blocks 5, 2, 7 in table "
            f"order, the last cut to its first 2 tokens: {m}"
        ),
    )
    assert impl.gather_kv(cache, table, 8).shape == (8, 2, 3), "a length that ends on a block boundary"
    past = torch.tensor([5, 2, 7, 99], dtype=torch.int32)  # an entry past the needed ones may hold anything
    try:
        out = impl.gather_kv(cache, past, 10)
    except IndexError as error:
        raise AssertionError(
            f"gather_kv(cache of 10 blocks, table [5, 2, 7, 99], 10) read entry 3 (block 99), "
            f"past the 3 entries 10 tokens need: only those may be read ({error})"
        ) from error
    assert out.shape == (10, 2, 3), f"gather_kv(cache, [5, 2, 7, 99], 10): expected [10, 2, 3], got {list(out.shape)}"
    half = impl.gather_kv(cache.to(torch.bfloat16), table, 10)
    assert half.dtype == torch.bfloat16, (
        f"gather_kv on a bfloat16 cache (the engine's dtype on a GPU) must return the cache's dtype, bfloat16; got "
        f"{half.dtype}"
    )


@pytest.mark.task("02.3b", "gather_kv reads back what the engine stored: the contiguous K and V")
def test_gather_kv_reads_the_engine_cache(impl, tiny):
    cache, _ = run_paged(tiny, _engine_slot_mapping)
    table, n = torch.tensor(TABLE + [0, 0], dtype=torch.int32), len(tiny.tokens)
    for layer in range(tiny.config.num_hidden_layers):
        for name, paged, contiguous in (
            ("K", cache.k_caches, tiny.reference.k),
            ("V", cache.v_caches, tiny.reference.v),
        ):
            torch.testing.assert_close(
                impl.gather_kv(paged[layer], table, n),
                contiguous[layer],
                rtol=0,
                atol=1e-5,
                msg=_prefixed(
                    f"layer {layer} {name}: gather_kv(cache, {table.tolist()}, {n}) over the engine's paged "
                    f"cache differs from the contiguous cache's {name}"
                ),
            )


@pytest.mark.task("02.4", "wasted_slots counts only the empty tail of each request's last block")
def test_wasted_slots(impl):
    got = impl.wasted_slots([16, 17, 1, 40], 16)
    assert got == 0 + 15 + 15 + 8, (
        f"wasted_slots([16, 17, 1, 40], 16) must be 0 + 15 + 15 + 8 = 38: each request "
        f"wastes only the empty tail of its last block (blocks x 16 - length); got {got}"
    )
    assert impl.wasted_slots([16, 17, 1, 40], 1) == 0, "one-token blocks waste nothing"
    got = impl.wasted_slots([1000], 256)
    assert got == 24, f"wasted_slots([1000], 256) must be 24: 1000 tokens hold 4 blocks = 1024 slots; got {got}"
    got = impl.wasted_slots([], 16)
    assert got == 0, f"wasted_slots([], 16) must be 0: no requests, no blocks, no waste; got {got}"


@pytest.mark.task("02.5", "BlockTable keeps one growing row per request and maps positions to slots")
def test_block_table(impl):
    table = impl.BlockTable(4)
    table.add_row("a", [7, 2])
    table.add_row("b", [5])
    assert list(table.compute_slot_mapping("a", 2, 4)) == [30, 31, 8, 9], "positions 2..5 of a"
    table.append_row("a", [9])
    table.append_row("b", [])
    assert list(table.compute_slot_mapping("a", 8, 2)) == [36, 37], "the appended block holds positions 8..11"
    assert [list(r) for r in table.get_block_tables(["b", "a"])] == [[5, 0, 0], [7, 2, 9]], (
        "rows in the asked order, padded with the null block 0"
    )
    table.remove_row("a")
    table.remove_row("never-added")
    rows = [list(r) for r in table.get_block_tables(["b"])]
    assert rows == [[5]], (
        f"after remove_row('a'), get_block_tables(['b']) must be [[5]]: b's row, padded only to "
        f"the longest of the rows asked for; got {rows}"
    )
    with pytest.raises(KeyError):
        table.get_block_tables(["a"])  # a removed row is gone
    table.add_row("a", [3])
    assert list(table.compute_slot_mapping("a", 0, 2)) == [12, 13], "a readmitted request starts a new row"


@pytest.mark.task("02.5b", "your BlockTable runs the engine: chunked prefills, decodes and a preemption")
def test_block_table_runs_the_engine(impl):
    model = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=1, std=0.2)  # outputs that depend on the context
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = [list(range(10 + 20 * i, 27 + 20 * i)) for i in range(3)]

    # 16 blocks of 4 tokens, counted in blocks so that the size holds in any dtype
    llm = LLM(
        model,
        block_size=4,
        num_gpu_blocks_override=16,
        max_num_batched_tokens=12,
        block_table_cls=impl.BlockTable,
        progress=False,
    )
    tokens = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
    assert llm.get_stats().num_preemptions > 0, "15 usable blocks cannot hold three 27-token requests at once"
    alone = [greedy_generate(model, p, params.max_tokens).token_ids for p in prompts]  # no paging, no engine
    assert tokens == alone, "the same tokens as each request run alone in one contiguous cache"


# ---- 02.6: random operations against a plain dict of lists ------------------------------------------------

ROW_OPS = st.lists(
    st.tuples(
        st.sampled_from(["add_row", "append_row", "remove_row", "compute_slot_mapping", "get_block_tables"]),
        st.sampled_from("abcd"),
        st.lists(st.integers(0, 30), max_size=3),
        st.integers(0, 12),
        st.randoms(use_true_random=False),
    ),
    max_size=30,
)


def _rows_args(op, req_id, ids, k, rnd, rows, block_size):
    """The arguments of one call, None for a call the contract leaves open (a row that does not exist yet to
    append to or map)."""
    if op in ("add_row", "append_row"):
        return None if op == "append_row" and req_id not in rows else (req_id, list(ids))
    if op == "remove_row":
        return (req_id,)
    if op == "compute_slot_mapping":
        if req_id not in rows:
            return None
        capacity = len(rows[req_id]) * block_size
        start = rnd.randrange(capacity + 1)
        return (req_id, start, min(k, capacity - start))
    return (sorted("abcd", key=lambda _: rnd.random())[: 1 + k % 4],)


def _rows_call(story, table, op, args):
    """table.op(*args) as plain lists, or the words "raised KeyError"; after add_row the caller changes its list,
    which must not reach the table."""
    args = [list(a) if isinstance(a, list) else a for a in args]
    try:
        result = story.call(f"{op}({', '.join(map(repr, args))})", getattr(table, op), *args, expected=(KeyError,))
    except KeyError:
        return "raised KeyError"
    if op == "add_row":
        args[1].append(99)
    return None if result is None else [r if isinstance(r, int) else list(r) for r in result]


class RowModel:
    """The contract of BlockTable as a plain dict of lists."""

    def __init__(self, block_size):
        self.block_size, self.rows = block_size, {}

    def add_row(self, req_id, block_ids):
        self.rows[req_id] = list(block_ids)

    def append_row(self, req_id, block_ids):
        self.rows[req_id] += block_ids

    def remove_row(self, req_id):
        self.rows.pop(req_id, None)

    def compute_slot_mapping(self, req_id, start_pos, num_tokens):
        row, size = self.rows[req_id], self.block_size
        return [row[p // size] * size + p % size for p in range(start_pos, start_pos + num_tokens)]

    def get_block_tables(self, req_ids):
        width = max(len(self.rows[r]) for r in req_ids)
        return [self.rows[r] + [0] * (width - len(self.rows[r])) for r in req_ids]


@pytest.mark.task("02.6", "under random operations your BlockTable keeps the rows a plain dict of lists would")
@settings(max_examples=300)
@given(block_size=st.integers(1, 4), ops=ROW_OPS)
def test_block_table_matches_a_model(impl, block_size, ops):
    """Your BlockTable and RowModel (the contract as a dict of lists) get the same calls; each call's result, or
    its KeyError, must agree, and after each call so must every row (padded as get_block_tables pads)."""
    table, model = impl.BlockTable(block_size), RowModel(block_size)
    story = Story(f"BlockTable({block_size})", reference="the contract's")
    for op, req_id, ids, k, rnd in ops:
        args = _rows_args(op, req_id, ids, k, rnd, model.rows, block_size)
        if args is None:
            continue
        story.add(
            f"{op}({', '.join(map(repr, args))})"
            + (", then the caller appends 99 to its list" if op == "add_row" else "")
        )
        expected, got = _rows_call(story, model, op, args), _rows_call(story, table, op, args)
        story.compare({"what it returned or raised": got}, {"what it returned or raised": expected})
        if model.rows:
            every = sorted(model.rows)
            story.compare(
                {f"get_block_tables({every})": _rows_call(story, table, "get_block_tables", [every])},
                {f"get_block_tables({every})": model.get_block_tables(every)},
            )
