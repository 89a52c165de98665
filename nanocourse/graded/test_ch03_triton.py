"""Chapter 03 graded tasks: paged attention in torch and Triton. Run with `make grade CH=03`.

Every cache slot no request owns holds NaN (kernel_lab.random_paged_batch), so one stray load turns
the output into NaN. Shapes stay tiny: on a CPU the kernels run in the Triton interpreter.
"""

import dataclasses
import functools
import inspect
import math
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

triton = pytest.importorskip("triton", reason="Triton is not installed (it publishes wheels for Linux only)")

import itertools

from nanocourse import kernel_lab
from nanocourse.kernel_lab import random_paged_batch
from nanoengine.attention import triton_kernels
from nanoengine.attention.backend import TorchBackend
from nanoengine.attention.triton_backend import TritonBackend


def _prefixed(where: str):
    """assert_close's msg: its own message after `where`, bound now (the loop moves on)."""
    return lambda message: f"{where}: {message}"


CHAPTER = "ch03_triton"
DEVICE = "cpu" if kernel_lab.interpreter_active() else "cuda"
TOL = 1e-4


def _engine_decode_one(q, k_cache, v_cache, block_table, seq_len, scale):
    lens = torch.tensor([seq_len], dtype=torch.int32, device=q.device)
    return TorchBackend().decode(q[None], k_cache, v_cache, block_table[None], lens, scale)[0]


def _engine_merge_splits(m, l, acc):
    """The engine's reduce kernel, which keeps its maxima in log2 units (it uses exp2)."""
    batch, heads, splits, head_dim = acc.shape
    out = torch.empty(batch, heads, head_dim, device=acc.device)
    triton_kernels.reduce_splits_kernel[(batch, heads)](
        acc.contiguous(),
        (m * math.log2(math.e)).contiguous(),
        l.contiguous(),
        out,
        splits,
        # tl.arange needs one lane at least: with no split that lane is masked off, and the row is zeros.
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        SPLITS_PAD=triton.next_power_of_2(max(splits, 1)),
    )
    return out


NANOENGINE = {
    "store_kvcache": triton_kernels.store_kvcache,
    "paged_decode_reference": _engine_decode_one,
    "merge_splits": _engine_merge_splits,
    "paged_decode": triton_kernels.paged_decode,
    "paged_prefill": triton_kernels.paged_prefill,
    "TritonBackend": TritonBackend,
}


def _kernels_ran(impl, loads) -> set[str]:
    """The Triton kernels of impl's own module that read memory under trace_loads (the launcher's module
    is where its kernels live: a torch fallback, or someone else's kernel, leaves this empty)."""
    module = impl.paged_decode.__module__
    return {load.kernel for load in loads if load.module == module}


def _traced(impl, call, batch=None):
    """call() under kernel_lab.trace_loads; on a GPU (no interpreter to watch) just call(). With the batch the
    kernels read, also check that no program loaded a K or V slot its request does not own."""
    if DEVICE != "cpu":
        return call(), None
    with kernel_lab.trace_loads() as loads:
        out = call()
    if batch is not None:
        for name, cache in (("K", batch.k_cache), ("V", batch.v_cache)):
            for program, slots in kernel_lab.slots_read(loads, cache).items():
                stray = sorted(set(slots.tolist()) - set(batch.owned_slots(program[0]).tolist()))
                assert not stray, (
                    f"program {program} (request {program[0]}, seq_len {int(batch.seq_lens[program[0]])}) loaded {name} "
                    f"slots {stray[:8]} its request does not own (the rest of its last block, or padding): mask every "
                    f"load by the request's length, even where the score is masked afterwards"
                )
    return out, _kernels_ran(impl, loads)


def _on_device(batch):
    for name in ("q", "k_cache", "v_cache", "block_tables", "seq_lens"):
        setattr(batch, name, getattr(batch, name).to(DEVICE))
    return batch


def _decode_reference(b):
    return TorchBackend().decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)


def _store_case(num_kv_heads=3, head_dim=16, block_size=8, num_blocks=5, seed=0):
    """New k/v as views of one wider qkv-like tensor (token stride 2*Hkv*D), slots, and caches that
    are views into buffers with one guard block on each side, so a write outside the cache (slot -1
    taken for a real slot) lands in a guard instead of corrupting memory."""
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(7, 2 * num_kv_heads, head_dim, generator=gen).to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:7].to(DEVICE)
    buffers = [torch.randn(num_blocks + 2, block_size, num_kv_heads, head_dim, generator=gen).to(DEVICE) for _ in "kv"]
    return kv[:, :num_kv_heads], kv[:, num_kv_heads:], buffers, slots


def _check_store(impl, k, v, buffers, slots):
    k_cache, v_cache = (buf[1:-1] for buf in buffers)
    expected = [buf.clone() for buf in buffers]
    TorchBackend().store_kvcache(k, v, expected[0][1:-1], expected[1][1:-1], slots)
    impl.store_kvcache(k, v, k_cache, v_cache, slots)
    for name, buf, want in zip("kv", buffers, expected):
        guards = [0, -1]
        assert torch.equal(buf[guards], want[guards]), f"{name}: wrote outside the cache (was slot -1 skipped?)"
        assert torch.equal(buf, want), f"{name}_cache differs from TorchBackend.store_kvcache's"


@pytest.mark.task("03.1", "store_kvcache writes every token's K and V at its slot, in a Triton kernel")
def test_store(impl):
    case = _store_case(num_kv_heads=2, head_dim=32)
    _, ran = _traced(impl, lambda: _check_store(impl, *case))
    assert ran is None or ran, "store_kvcache must launch a Triton kernel of its own module (no tl.load of one ran)"


@pytest.mark.task("03.1b", "store_kvcache skips slot -1 and handles 3 KV heads (padded to 4)")
def test_store_padding_and_three_heads(impl):
    k, v, buffers, slots = _store_case(num_kv_heads=3, block_size=16, seed=1)
    slots[[0, 3]] = -1
    _check_store(impl, k, v, buffers, slots)


# ---- 03.1c: the store kernel, as widely as the others: random batches and a block 2**32 elements in -------------


@st.composite
def _store_batches(draw):
    """(num_kv_heads, head_dim, block_size, num_blocks, slots, seed): distinct real slots, the first (0) and the
    last of the cache among them often, and padding (-1) anywhere."""
    num_kv_heads = draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([16, 32]))
    block_size = draw(st.sampled_from([8, 16]))
    num_blocks = draw(st.integers(1, 4))
    last = num_blocks * block_size - 1
    real = draw(
        st.lists(st.one_of(st.just(0), st.just(last), st.integers(0, last)), min_size=1, max_size=6, unique=True)
    )
    padded = draw(st.lists(st.sampled_from([0, len(real)]), max_size=2))
    slots = list(real)
    for where in padded:
        slots.insert(where, -1)
    return num_kv_heads, head_dim, block_size, num_blocks, slots, draw(st.integers(0, 999))


def _far_store(impl):
    """Two tokens stored at slot 3 of block `far` (2**32 elements past the cache's start, give or take a block) and
    at slot 1 of block 3, into the 4-block probe cache (k_cache and v_cache alike, so v = k)."""
    cache, _ = _far_case(1)
    gen = torch.Generator().manual_seed(9)
    k = torch.randn(2, FAR_SHAPE[1], FAR_SHAPE[2], generator=gen).to(DEVICE)
    expected = cache.clone()
    expected[2, 3], expected[3, 1] = k[0], k[1]
    with _far_block(cache) as (far, pool, strays):
        slots = torch.tensor([far * FAR_SHAPE[0] + 3, 3 * FAR_SHAPE[0] + 1], dtype=torch.int64, device=DEVICE)
        impl.store_kvcache(k, k, pool, pool, slots)
        got = pool.clone() if DEVICE == "cpu" else torch.stack([pool[0], pool[1], pool[far], pool[3]])
    case = f"store_kvcache with slot_mapping [{far * FAR_SHAPE[0] + 3}, {3 * FAR_SHAPE[0] + 1}] (block {far}, then block 3)"
    offset = (far * FAR_SHAPE[0] + 3) * FAR_SHAPE[1] * FAR_SHAPE[2]
    assert not sum(strays), (
        f"write the caches in place: {case} touched unmapped memory in {sum(strays)} store lanes (the grader "
        f"reroutes block {far} of the cache it passed, not of a copy)"
    )
    wrapped = not torch.equal(got[1].nan_to_num(7.0), expected[1].nan_to_num(7.0))
    assert not wrapped, (
        f"{case}: slot {far * FAR_SHAPE[0] + 3} starts at element {offset:,}, which an int32 product wraps to "
        f"{offset % 2**32}, in block 1: widen the slot to int64 before it multiplies a stride"
    )
    torch.testing.assert_close(
        got.nan_to_num(7.0), expected.nan_to_num(7.0), atol=0, rtol=0, msg=lambda m: f"{case}: the cache differs: {m}"
    )


@pytest.mark.task(
    "03.1c", "store_kvcache: random batches with padding and the first slot, and a block 2**32 elements in"
)
@settings(max_examples=12)
@given(batch=_store_batches())
def test_store_random(impl, batch):
    """Random heads, head sizes, block sizes and slots (the first and the last included, padding anywhere), k and v
    views of a wider tensor, caches between guard blocks: the caches must equal TorchBackend.store_kvcache's. Then
    a slot whose element offset is past 2**32."""
    num_kv_heads, head_dim, block_size, num_blocks, slots, seed = batch
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(len(slots), 2 * num_kv_heads, head_dim, generator=gen).to(DEVICE)
    buffers = [torch.randn(num_blocks + 2, block_size, num_kv_heads, head_dim, generator=gen).to(DEVICE) for _ in "kv"]
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    k, v = kv[:, :num_kv_heads], kv[:, num_kv_heads:]
    k_cache, v_cache = (buf[1:-1] for buf in buffers)
    expected = [buf.clone() for buf in buffers]
    TorchBackend().store_kvcache(k, v, expected[0][1:-1], expected[1][1:-1], slot_mapping)
    impl.store_kvcache(k, v, k_cache, v_cache, slot_mapping)
    what = (
        f"store_kvcache of {len(slots)} tokens at slots {slots} into caches of {num_blocks} blocks of {block_size} "
        f"tokens, {num_kv_heads} KV heads of {head_dim}"
    )
    for name, buf, want in zip("kv", buffers, expected):
        assert torch.equal(buf[[0, -1]], want[[0, -1]]), (
            f"{what}: {name} was written outside the cache, in a guard block (is a slot of -1 written, or a slot "
            f"past the cache?)"
        )
        changed = sorted({int(i) for i in (buf[1:-1] != want[1:-1]).flatten(1).any(1).nonzero().flatten()})
        assert not changed, (
            f"{what}: {name}_cache differs from TorchBackend.store_kvcache's in blocks {changed} (each real slot's "
            f"rows, and nothing else)"
        )
    _far_store(impl)


@pytest.mark.task("03.2", "paged_decode_reference: one request, partial last block, GQA group of 3")
def test_decode_reference(impl):
    b = _on_device(random_paged_batch([19, 1, 16, 33], num_kv_heads=2, group=3, block_size=8, seed=2))
    expected = _decode_reference(b)
    for i in range(4):
        out = impl.paged_decode_reference(b.q[i], b.k_cache, b.v_cache, b.block_tables[i], int(b.seq_lens[i]), b.scale)
        assert out.shape == b.q[i].shape, (
            f"request {i}: paged_decode_reference must return [num_heads, head_dim] = "
            f"{list(b.q[i].shape)}, the shape of q; got {list(out.shape)}"
        )
        assert not out.isnan().any(), f"request {i}: NaN, so a slot past seq_len (or of another request) was read"
        torch.testing.assert_close(out, expected[i], atol=TOL, rtol=TOL, msg=_prefixed(f"request {i}"))


def _partials(scores, values, bounds):
    """(m, l, acc) of every range [lo, hi) of the last axis, as the decode kernel's splits give them."""
    ms, ls, accs = [], [], []
    for lo, hi in itertools.pairwise(bounds):
        s = scores[..., lo:hi]
        m = s.amax(-1) if hi > lo else torch.full(s.shape[:-1], -math.inf, device=s.device)
        p = torch.exp(s - m.nan_to_num(neginf=0.0)[..., None])
        ms.append(m)
        ls.append(p.sum(-1))
        accs.append(torch.einsum("...l,...ld->...d", p, values[..., lo:hi, :]))
    return torch.stack(ms, -1), torch.stack(ls, -1), torch.stack(accs, -2)


@pytest.mark.task("03.3", "merge_splits rebuilds the full softmax from split-K partials, empty splits included")
def test_merge_splits(impl):
    gen = torch.Generator().manual_seed(3)
    scores = (torch.randn(2, 3, 40, generator=gen) * 4).to(DEVICE)
    scores[1] += 1000.0  # exp(1000) overflows fp32: only max-relative exponents survive
    values = torch.randn(2, 3, 40, 16, generator=gen).to(DEVICE)
    expected = torch.einsum("...l,...ld->...d", scores.softmax(-1), values)
    for bounds in ([0, 40], [0, 13, 40], [0, 7, 7, 21, 40]):  # the 7..7 split is empty
        out = impl.merge_splits(*_partials(scores, values, bounds))
        assert not out.isnan().any(), f"splits {bounds}: NaN (an empty split's -inf, or an overflowed exp)"
        torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL, msg=_prefixed(f"splits {bounds}"))
    m, l, acc = _partials(scores, values, [0, 0, 0])  # every split empty: a padded batch row
    out = impl.merge_splits(m, l, acc)
    assert torch.equal(out, torch.zeros_like(out)), "with every split empty the output must be zeros, not NaN"
    m, l, acc = torch.empty(2, 3, 0), torch.empty(2, 3, 0), torch.empty(2, 3, 0, 16)
    out = impl.merge_splits(m.to(DEVICE), l.to(DEVICE), acc.to(DEVICE))
    got = "None" if out is None else f"shape {list(out.shape)}, values {out.flatten()[:4].tolist()}..."
    assert out is not None and out.shape == (2, 3, 16) and not out.any(), (
        f"with no split at all (S = 0: m and l [2, 3, 0], acc [2, 3, 0, 16]) there is nothing to attend to: the "
        f"output must be zeros [2, 3, 16], as when every split is empty; got {got}"
    )


@pytest.mark.task("03.4", "paged_decode (Triton) matches TorchBackend over ragged contexts and GQA")
def test_decode_kernel(impl):
    for kw in (
        {"num_kv_heads": 2, "group": 3, "block_size": 8, "head_dim": 16},
        {"num_kv_heads": 1, "group": 4, "block_size": 16, "head_dim": 32},
    ):
        b = _on_device(random_paged_batch([1, 8, 17, 33], **kw, seed=4))
        out, ran = _traced(
            impl,
            functools.partial(impl.paged_decode, b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale),
            b,
        )
        assert ran is None or ran, "paged_decode must run a Triton kernel of its own module, not torch"
        assert out is not None and out.shape == b.q.shape, "return the [B, Hq, D] output"
        assert not out.isnan().any(), f"{kw}: NaN, so a masked or unowned slot was read"
        torch.testing.assert_close(out, _decode_reference(b), atol=TOL, rtol=TOL, msg=_prefixed(f"{kw}"))
    b = _moving_max_batch()
    out = impl.paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    what = (
        "one 40-token request whose keys are scaled by [1, 40, 0.5, 120, 3] block by block, so the online "
        "softmax's running maximum moves a long way between blocks"
    )
    assert out is not None and not out.isnan().any() and not out.isinf().any(), (
        f"{what}: the output holds NaN or inf: exp of a raw score overflows; subtract the running maximum"
    )
    torch.testing.assert_close(
        out,
        _decode_reference(b),
        atol=TOL,
        rtol=TOL,
        msg=lambda m: f"{what}: rescale the sum and the accumulator whenever the maximum moves: {m}",
    )


def _moving_max_batch():
    """One request of 40 tokens whose scores jump between blocks of 8: each block's keys are scaled by
    [1, 40, 0.5, 120, 3], so the running maximum of the online softmax moves by a hundred and more, and
    exp(score) alone overflows fp32."""
    b = random_paged_batch([40], num_kv_heads=1, group=2, block_size=8, head_dim=16, seed=11)
    owned = torch.from_numpy(b.owned_slots(0))
    for j, factor in enumerate([1.0, 40.0, 0.5, 120.0, 3.0]):
        b.k_cache.view(-1, 1, 16)[owned[8 * j : 8 * (j + 1)]] *= factor
    return _on_device(b)


@pytest.mark.task("03.4b", "paged_decode gives zeros, not NaN, for a request with no context")
def test_decode_kernel_empty_context(impl):
    b = _on_device(random_paged_batch([0, 9], num_kv_heads=1, group=2, block_size=8, seed=5))
    out = impl.paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    assert out is not None and torch.equal(out[0], torch.zeros_like(out[0])), (
        "seq_len 0: l stays 0, so guard the final division (acc / l)"
    )
    torch.testing.assert_close(
        out[1],
        _decode_reference(b)[1],
        atol=TOL,
        rtol=TOL,
        msg=lambda m: f"request 1 (9 tokens, batched with an empty request 0) differs from TorchBackend.decode: {m}",
    )


# ---- a block 2**32 elements into the cache, without a 16 GiB pool --------------------------------
FAR_SHAPE = (8, 2, 16)  # block_size, num_kv_heads, head_dim of the probe's cache
FAR_STRIDE = math.prod(FAR_SHAPE)  # elements per block
FAR_SEQ_LEN = 11  # a full block 3, then 3 tokens of the far block


def _far_case(num_new_tokens: int):
    """A cache of 4 blocks, [null, decoy, data, data] (null and decoy hold NaN), and q for num_new_tokens
    tokens with a GQA group of 3."""
    gen = torch.Generator().manual_seed(8)
    cache = torch.full((4, *FAR_SHAPE), torch.nan)
    cache[2:] = torch.randn(2, *FAR_SHAPE, generator=gen)
    q = torch.randn(num_new_tokens, 3 * FAR_SHAPE[1], FAR_SHAPE[2], generator=gen)
    return cache.to(DEVICE), q.to(DEVICE)


def _tables(*block_ids):
    return torch.tensor([[*block_ids, 0]], dtype=torch.int32, device=DEVICE)


def _readable_spans() -> np.ndarray:
    """[start, end) of every readable mapping of this process, sorted by start (Triton runs on Linux only)."""
    with open("/proc/self/maps") as maps:
        spans = [[int(x, 16) for x in span.split("-")] for span, perms, *_ in map(str.split, maps) if perms[0] == "r"]
    return np.array(sorted(spans), dtype=np.uint64)


def _readable(addresses: np.ndarray, spans: np.ndarray) -> np.ndarray:
    i = np.searchsorted(spans[:, 0], addresses, side="right") - 1
    return (i >= 0) & (addresses < spans[np.maximum(i, 0), 1])


def _as_int64(value):
    """An int argument as the GPU compiler passes one annotated tl.int64 (the interpreter types an int by its
    value alone: int32 below 2**31, whatever the annotation)."""
    from triton.runtime.interpreter import TensorHandle

    if isinstance(value, bool) or not isinstance(value, int):
        return value
    int64 = triton.language.int64
    return triton.language.tensor(TensorHandle(np.array([value], np.int64), int64), int64)


@contextmanager
def _far_block(cache):
    """Yield (far, pool, strays): a cache on which block id `far` holds block 2's rows, and far * FAR_STRIDE is
    past 2**32 by exactly one block, so an int32 product wraps to block 1, the NaN decoy.

    On a GPU the pool is real: far + 1 blocks, 16 GiB in fp32. The interpreter gets the 4-block cache itself:
    loads and stores at block far are rerouted to block 2, and kernel arguments annotated tl.int64 get int64
    values as they do when compiled. A lane that would touch unmapped memory (block far of a copy of the cache)
    gets a NaN scratch cell instead of crashing the grader, and is counted in strays.
    """
    strays = []
    if DEVICE != "cpu":
        far = 2**32 // FAR_STRIDE + 1
        need = (far + 1) * FAR_STRIDE * cache.element_size()
        free = torch.cuda.mem_get_info(cache.device)[0]
        assert free > need, (
            f"the int64 probe needs a {need / 2**30:.1f} GiB pool on the GPU and {free / 2**30:.1f} GiB are free: on a "
            f"smaller GPU grade chapter 03 in the interpreter, TRITON_INTERPRET=1 make grade CH=03, which checks the "
            f"same rule without the memory"
        )
        pool = torch.empty(far + 1, *FAR_SHAPE, device=cache.device)
        pool[:4], pool[far] = cache, cache[2]
        yield far, pool, strays
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.interpreter import interpreter_builder as builder
    from triton.runtime.jit import _normalize_ty

    block_bytes = FAR_STRIDE * cache.element_size()
    spans = _readable_spans()
    # Any far block past 2**32 elements wraps to block 1: take one whose window no other tensor can live in.
    far = next(
        far
        for far in (wraps * 2**32 // FAR_STRIDE + 1 for wraps in range(1, 64))
        if not _readable(cache.data_ptr() + far * block_bytes + np.array([0, block_bytes - 1], np.uint64), spans).any()
    )
    window = cache.data_ptr() + far * block_bytes
    shift = np.uint64((far - 2) * block_bytes)
    scratch = np.full(16, 0xFF, np.uint8)  # all ones: NaN as fp16, fp32 or fp64, -1 as an integer

    def route(ptrs, mask):
        nonlocal spans
        addresses = ptrs.data.copy()
        lanes = np.broadcast_to(mask.data.astype(bool), addresses.shape)
        far_lanes = lanes & (addresses >= window) & (addresses < window + block_bytes)
        addresses[far_lanes] -= shift
        stray = lanes & ~_readable(addresses, spans)
        if stray.any():  # maybe a tensor allocated since the spans were read
            spans = _readable_spans()
            stray = lanes & ~_readable(addresses, spans)
        addresses[stray] = scratch.ctypes.data
        strays.append(int(stray.sum()))
        return dataclasses.replace(ptrs, data=addresses)

    def launch(self, *args, grid, warmup, **kwargs):
        wide = {name for name, ty in inspect.get_annotations(self.fn).items() if _normalize_ty(ty) == "i64"}
        args = [_as_int64(v) if name in wide else v for name, v in zip(self.arg_names, args)]
        kwargs = {k: _as_int64(v) if k in wide else v for k, v in kwargs.items()}
        return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    real_run, real_load, real_store = InterpretedFunction.run, builder.create_masked_load, builder.create_masked_store
    InterpretedFunction.run = launch
    builder.create_masked_load = lambda ptrs, mask, *rest, **kw: real_load(route(ptrs, mask), mask, *rest, **kw)
    builder.create_masked_store = lambda ptrs, value, mask, *rest: real_store(route(ptrs, mask), value, mask, *rest)
    try:
        yield far, cache, strays
    finally:
        InterpretedFunction.run = real_run
        del builder.create_masked_load, builder.create_masked_store  # the class's own methods show through again


def _check_far(what, out, expected, far, strays):
    case = f"{what}, one request of {FAR_SEQ_LEN} tokens, block table [3, {far}]"
    assert not sum(strays), (
        f"read the caches in place: {case} touched unmapped memory in {sum(strays)} load or "
        f"store lanes (the grader reroutes block {far} of the cache it passed, not of a copy)"
    )
    why = (
        f"block {far} starts at element {far * FAR_STRIDE:,}, which an int32 product wraps to "
        f"{far * FAR_STRIDE % 2**32}: block 1, all NaN"
    )
    assert out is not None and out.shape == expected.shape, (
        f"{case}: the output must be {list(expected.shape)}, got {None if out is None else list(out.shape)}"
    )
    assert not out.isnan().any(), (
        f"block ids must be widened to int64 before they multiply a stride: {case}, gave NaN ({why})"
    )
    torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL, msg=lambda m: f"{case} ({why}): {m}")


@pytest.mark.task("03.4c", "paged_decode reaches a block 2**32 elements into the cache (int64 addresses)")
def test_decode_kernel_int64_addresses(impl):
    cache, q = _far_case(1)
    seq_lens = torch.tensor([FAR_SEQ_LEN], dtype=torch.int32, device=DEVICE)
    scale = FAR_SHAPE[2] ** -0.5
    expected = TorchBackend().decode(q, cache, cache, _tables(3, 2), seq_lens, scale)
    with _far_block(cache) as (far, pool, strays):
        out = impl.paged_decode(q, pool, pool, _tables(3, far), seq_lens, scale)
    _check_far("paged_decode", out, expected, far, strays)


@pytest.mark.task("03.5", "paged_prefill: chunks attend causally over their cached prefix, in Triton")
def test_prefill(impl):
    b = _on_device(random_paged_batch([5, 19, 24, 9], [5, 3, 16, 1], num_kv_heads=2, group=3, block_size=8, seed=6))
    expected = TorchBackend().prefill(
        b.q, b.k_cache, b.v_cache, b.block_tables, b.query_start_loc, b.seq_lens, b.max_query_len, b.scale
    )
    out, ran = _traced(
        impl,
        lambda: impl.paged_prefill(
            b.q, b.k_cache, b.v_cache, b.block_tables, b.query_start_loc, b.seq_lens, b.max_query_len, b.scale
        ),
    )
    assert ran is None or ran, "paged_prefill must run a Triton kernel of its own module, not torch"
    assert out is not None and out.shape == b.q.shape, (
        f"paged_prefill must return [T, Hq, D] = {list(b.q.shape)}, the shape of q (one row per new token); "
        f"got {None if out is None else list(out.shape)}"
    )
    assert not out.isnan().any(), "NaN: a key past a token's own position, or an unowned slot, was read"
    torch.testing.assert_close(
        out,
        expected,
        atol=TOL,
        rtol=TOL,
        msg=lambda m: (
            f"paged_prefill (4 requests: 5, 3, 16 and 1 new tokens ending "
            f"contexts of 5, 19, 24 and 9) differs from TorchBackend.prefill: {m}"
        ),
    )
    cache, q = _far_case(3)
    seq_lens = torch.tensor([FAR_SEQ_LEN], dtype=torch.int32, device=DEVICE)
    query_start_loc = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)
    scale = FAR_SHAPE[2] ** -0.5
    expected = TorchBackend().prefill(q, cache, cache, _tables(3, 2), query_start_loc, seq_lens, 3, scale)
    with _far_block(cache) as (far, pool, strays):
        out = impl.paged_prefill(q, pool, pool, _tables(3, far), query_start_loc, seq_lens, 3, scale)
    _check_far("paged_prefill (3 new tokens)", out, expected, far, strays)


@pytest.mark.task("03.6", "your kernels serve requests: LLM on your TritonBackend gives torch attention's tokens")
def test_kernels_serve_requests(impl):
    from nanoengine import LLM, SamplingParams
    from nanoengine.config import LlamaConfig
    from nanoengine.model import LlamaForCausalLM

    config = LlamaConfig.tiny(head_dim=16, hidden_size=96)  # the kernels want head_dim >= 16
    model = LlamaForCausalLM.random(config, seed=3, std=0.2, device=DEVICE)  # outputs that depend on the context
    prompts = [list(range(1, 21)), list(range(1, 17)) + [60, 61, 62]]  # the second reuses two 8-token blocks
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    def serve(backend):
        llm = LLM(model, block_size=8, kv_cache_memory_bytes=2**20, attention_backend=backend)
        return llm.generate(prompt_token_ids=prompts, sampling_params=params)  # a batch of two, decoding together

    yours, ran = _traced(impl, lambda: serve(impl.TritonBackend()))
    assert ran is None or len(ran) >= 2, (
        f"your module's kernels must store K/V and attend (two kernels at least); of its kernels these ran: {ran}"
    )
    torch_outs = serve("torch")
    assert yours[1].num_cached_tokens == 16, "the second request's prefill ran over the first one's blocks"
    got, want = [o.token_ids for o in yours], [o.token_ids for o in torch_outs]
    assert got == want, (
        f"greedy tokens on your TritonBackend must equal the torch backend's for both requests: "
        f"expected {want}, got {got}"
    )


# ---- 03.7: random batches, where the interpreter's cost allows --------------------------------------------

BATCHES = st.tuples(
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 12)), min_size=1, max_size=3),  # (context, new tokens)
    st.sampled_from([(1, 1), (1, 3), (2, 2), (3, 1)]),  # (KV heads, GQA group)
    st.sampled_from([8, 16]),
    st.sampled_from([16, 32]),
    st.integers(0, 999),
)


@pytest.mark.task("03.7", "random batches: decode and prefill equal TorchBackend, decode reads only its own slots")
@settings(max_examples=20)
@given(batch=BATCHES)
def test_random_batches(impl, batch):
    """Ragged requests, any GQA group, block size and head size: each kernel's output equals TorchBackend's, and on
    a CPU no decode program loads a slot its request does not own."""
    requests, (num_kv_heads, group), block_size, head_dim, seed = batch
    shape = {"num_kv_heads": num_kv_heads, "group": group, "block_size": block_size, "head_dim": head_dim, "seed": seed}
    what = f"{len(requests)} requests (context, new tokens) {requests}, {shape}"
    b = _on_device(random_paged_batch([c for c, _ in requests], **shape))
    out, _ = _traced(impl, lambda: impl.paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale), b)
    torch.testing.assert_close(
        out, _decode_reference(b), atol=TOL, rtol=TOL, msg=lambda m: f"paged_decode on {what}: {m}"
    )
    seq_lens = [max(c, n) for c, n in requests]  # a chunk ends its context, so it is never longer than it
    b = _on_device(random_paged_batch(seq_lens, [n for _, n in requests], **shape))
    expected = TorchBackend().prefill(
        b.q, b.k_cache, b.v_cache, b.block_tables, b.query_start_loc, b.seq_lens, b.max_query_len, b.scale
    )
    out, _ = _traced(
        impl,
        lambda: impl.paged_prefill(
            b.q, b.k_cache, b.v_cache, b.block_tables, b.query_start_loc, b.seq_lens, b.max_query_len, b.scale
        ),
    )
    torch.testing.assert_close(
        out, expected, atol=TOL, rtol=TOL, msg=lambda m: f"paged_prefill on {what} (contexts {seq_lens}): {m}"
    )
