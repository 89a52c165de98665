"""Chapter 03 graded tasks: paged attention in torch and Triton. Run with `make grade CH=03`.

Every cache slot no request owns holds NaN (kernel_lab.random_paged_batch), so one stray load turns
the output into NaN. Shapes stay tiny: on a CPU the kernels run in the Triton interpreter.
"""

import math

import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton is not installed (it publishes wheels for Linux only)")

from nanoengine.attention import triton_kernels
from nanoengine.attention.backend import TorchBackend
from nanoengine.attention.triton_backend import TritonBackend
from nanocourse import kernel_lab
from nanocourse.kernel_lab import random_paged_batch

CHAPTER = "ch03_triton"
DEVICE = "cpu" if kernel_lab.interpreter_active() else "cuda"
TOL = 1e-4


def _engine_decode_one(q, k_cache, v_cache, block_table, seq_len, scale):
    lens = torch.tensor([seq_len], dtype=torch.int32, device=q.device)
    return TorchBackend().decode(q[None], k_cache, v_cache, block_table[None], lens, scale)[0]


def _engine_merge_splits(m, l, acc):  # noqa: E741
    """The engine's reduce kernel, which keeps its maxima in log2 units (it uses exp2)."""
    batch, heads, splits, head_dim = acc.shape
    out = torch.empty(batch, heads, head_dim, device=acc.device)
    triton_kernels._reduce_splits_kernel[(batch, heads)](
        acc.contiguous(), (m * math.log2(math.e)).contiguous(), l.contiguous(), out, splits,
        out.stride(0), out.stride(1), HEAD_DIM=head_dim, SPLITS_PAD=triton.next_power_of_2(splits))
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


def _traced(impl, call):
    """call() under kernel_lab.trace_loads; on a GPU (no interpreter to watch) just call()."""
    if DEVICE != "cpu":
        return call(), None
    with kernel_lab.trace_loads() as loads:
        out = call()
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


@pytest.mark.task("03.2", "paged_decode_reference: one request, partial last block, GQA group of 3")
def test_decode_reference(impl):
    b = _on_device(random_paged_batch([19, 1, 16, 33], num_kv_heads=2, group=3, block_size=8, seed=2))
    expected = _decode_reference(b)
    for i in range(4):
        out = impl.paged_decode_reference(b.q[i], b.k_cache, b.v_cache, b.block_tables[i], int(b.seq_lens[i]), b.scale)
        assert out.shape == b.q[i].shape, (f"request {i}: paged_decode_reference must return [num_heads, head_dim] = "
                                           f"{list(b.q[i].shape)}, the shape of q; got {list(out.shape)}")
        assert not out.isnan().any(), f"request {i}: NaN, so a slot past seq_len (or of another request) was read"
        torch.testing.assert_close(out, expected[i], atol=TOL, rtol=TOL, msg=lambda m: f"request {i}: {m}")


def _partials(scores, values, bounds):
    """(m, l, acc) of every range [lo, hi) of the last axis, as the decode kernel's splits give them."""
    ms, ls, accs = [], [], []
    for lo, hi in zip(bounds, bounds[1:]):
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
        torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL, msg=lambda m: f"splits {bounds}: {m}")
    m, l, acc = _partials(scores, values, [0, 0, 0])  # every split empty: a padded batch row
    out = impl.merge_splits(m, l, acc)
    assert torch.equal(out, torch.zeros_like(out)), "with every split empty the output must be zeros, not NaN"


@pytest.mark.task("03.4", "paged_decode (Triton) matches TorchBackend over ragged contexts and GQA")
def test_decode_kernel(impl):
    for kw in (dict(num_kv_heads=2, group=3, block_size=8, head_dim=16), dict(num_kv_heads=1, group=4, block_size=16, head_dim=32)):
        b = _on_device(random_paged_batch([1, 8, 17, 33], **kw, seed=4))
        out, ran = _traced(impl, lambda: impl.paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale))
        assert ran is None or ran, "paged_decode must run a Triton kernel of its own module, not torch"
        assert out is not None and out.shape == b.q.shape, "return the [B, Hq, D] output"
        assert not out.isnan().any(), f"{kw}: NaN, so a masked or unowned slot was read"
        torch.testing.assert_close(out, _decode_reference(b), atol=TOL, rtol=TOL, msg=lambda m: f"{kw}: {m}")


@pytest.mark.task("03.4b", "paged_decode gives zeros, not NaN, for a request with no context")
def test_decode_kernel_empty_context(impl):
    b = _on_device(random_paged_batch([0, 9], num_kv_heads=1, group=2, block_size=8, seed=5))
    out = impl.paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    assert out is not None and torch.equal(out[0], torch.zeros_like(out[0])), \
        "seq_len 0: l stays 0, so guard the final division (acc / l)"
    torch.testing.assert_close(out[1], _decode_reference(b)[1], atol=TOL, rtol=TOL,
                               msg=lambda m: f"request 1 (9 tokens, batched with an empty request 0) differs from "
                                             f"TorchBackend.decode: {m}")


@pytest.mark.task("03.5", "paged_prefill: chunks attend causally over their cached prefix, in Triton")
def test_prefill(impl):
    b = _on_device(random_paged_batch([5, 19, 24, 9], [5, 3, 16, 1], num_kv_heads=2, group=3, block_size=8, seed=6))
    expected = TorchBackend().prefill(b.q, b.k_cache, b.v_cache, b.block_tables, b.query_start_loc, b.seq_lens,
                                      b.max_query_len, b.scale)
    out, ran = _traced(impl, lambda: impl.paged_prefill(b.q, b.k_cache, b.v_cache, b.block_tables, b.query_start_loc,
                                                        b.seq_lens, b.max_query_len, b.scale))
    assert ran is None or ran, "paged_prefill must run a Triton kernel of its own module, not torch"
    assert out is not None and out.shape == b.q.shape, (
        f"paged_prefill must return [T, Hq, D] = {list(b.q.shape)}, the shape of q (one row per new token); "
        f"got {None if out is None else list(out.shape)}")
    assert not out.isnan().any(), "NaN: a key past a token's own position, or an unowned slot, was read"
    torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL,
                               msg=lambda m: f"paged_prefill (4 requests: 5, 3, 16 and 1 new tokens ending "
                                             f"contexts of 5, 19, 24 and 9) differs from TorchBackend.prefill: {m}")


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
    assert ran is None or len(ran) >= 2, \
        f"your module's kernels must store K/V and attend (two kernels at least); of its kernels these ran: {ran}"
    torch_outs = serve("torch")
    assert yours[1].num_cached_tokens == 16, "the second request's prefill ran over the first one's blocks"
    got, want = [o.token_ids for o in yours], [o.token_ids for o in torch_outs]
    assert got == want, (f"greedy tokens on your TritonBackend must equal the torch backend's for both requests: "
                         f"expected {want}, got {got}")
