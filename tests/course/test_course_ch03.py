"""Chapter 03's kernel lab, driven from Python: what it shows is what the engine's kernels did."""

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (it publishes wheels for Linux only)")
pytestmark = pytest.mark.triton

from nanocourse import kernel_lab as kl
from nanoengine.attention.backend import TorchBackend

interpreter = pytest.mark.skipif(not kl.interpreter_active(), reason="the lab traces the Triton interpreter")


@interpreter
def test_batch_poisons_every_slot_no_request_owns():
    b = kl.random_paged_batch([19, 11], block_size=8, seed=3)
    owned = np.concatenate([b.owned_slots(0), b.owned_slots(1)])
    assert len(set(owned.tolist())) == 30, "requests never share a slot"
    flat = b.k_cache.view(-1, *b.k_cache.shape[2:])
    free = np.setdiff1d(np.arange(flat.shape[0]), owned)
    assert flat[owned].isfinite().all() and flat[free].isnan().all()
    assert (b.block_tables[:, -1] == 0).all(), "tables end in null-block padding"
    assert 0 not in b.owned_slots(0) // 8, "block 0 is the null block"


@interpreter
def test_trace_sees_exactly_the_slots_the_block_table_names():
    b = kl.random_paged_batch([19, 11], block_size=8, seed=1)
    run = kl.run_decode(b)
    assert run.matches and run.programs == [(0, 0, 0), (1, 0, 0)]
    for seq in (0, 1):
        assert np.array_equal(run.slots_of(seq), np.sort(b.owned_slots(seq)))


@interpreter
def test_trace_shows_a_wrong_block_table():
    """Hand the kernel a table with two entries swapped: the trace and the reference both notice."""
    b = kl.random_paged_batch([19, 11], block_size=8, seed=1)
    right = b.owned_slots(0)
    b.block_tables[0, [0, 2]] = b.block_tables[0, [2, 0]]
    run = kl.run_decode(b)
    assert not np.array_equal(run.slots_of(0), np.sort(right)), "the kernel followed the swapped table"
    assert run.has_nan, "the swapped table sends the last block's full 8 slots through a 3-token block"


@interpreter
def test_split_k_programs_cover_disjoint_ranges():
    b = kl.random_paged_batch([40, 11], block_size=8, seed=0)
    run = kl.run_decode(b, num_splits=3)
    assert run.matches
    parts = [run.reads[p] for p in run.programs if p[0] == 0 and p in run.reads]
    assert len(parts) == 3 and sum(map(len, parts)) == 40 == len(np.unique(np.concatenate(parts)))


@interpreter
def test_prefill_run_matches_and_programs_are_request_tile_head():
    b = kl.random_paged_batch([20, 16], [5, 16], num_kv_heads=1, group=2, seed=2)
    run = kl.run_prefill(b, block_m=16)
    assert run.matches and run.programs == [(r, 0, h) for r in (0, 1) for h in (0, 1)]
    assert np.array_equal(run.slots_of(0), np.sort(b.owned_slots(0)))


@interpreter
def test_lab_sliders_rerun_the_kernel_and_redraw_the_pool():
    lab = kl.KernelLab()
    assert lab.run.matches and "✓ matches" in lab.summary.value
    lab.context.value, lab.group.value, lab.block_size.value, lab.splits.value = 33, 3, 16, 2
    b, run = lab.batch, lab.run
    assert int(b.seq_lens[0]) == 33 and b.block_size == 16 and b.q.shape[1] == 3
    assert {p[2] for p in run.programs} == {0, 1}, "two splits launched"
    cells = lab.pool.value
    assert cells.count('data-state="read"') == 33 + lab.NEIGHBOUR_LEN
    assert cells.count('data-state="missed"') == cells.count('data-state="stray"') == 0
    assert cells.count("<tr>") == b.k_cache.shape[0]
    expected = TorchBackend().decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    assert torch.equal(run.ref, expected)
    assert f"table {b.block_tables[0].tolist()}" in lab.summary.value
    assert "pads them to 16 rows" in lab.summary.value
    before = lab.batch.block_tables.clone()
    lab.reshuffle.click()
    assert lab.seed == 1 and not torch.equal(before, lab.batch.block_tables)


@interpreter
def test_pool_html_marks_missed_and_stray_slots():
    b = kl.random_paged_batch([9, 11], block_size=8, seed=0)
    run = kl.run_decode(b)
    first, *_ = run.reads
    run.reads[first] = np.append(run.reads[first][1:], 0)  # forget one real slot, claim the null block's slot 0
    cells = kl.pool_html(b, run)
    assert cells.count('data-state="missed"') == 1 and cells.count('data-state="stray"') == 1


def test_decode_step_bytes_matches_the_bench_formula():
    # Llama-3-8B heads, B=64, L=2048, bf16, 128-entry tables: K+V dominate at 512 MiB.
    n = kl.decode_step_bytes([2048] * 64, 32, 8, 128, 2, 128)
    assert n == 2 * 64 * 2048 * 8 * 128 * 2 + 2 * 64 * 32 * 128 * 2 + 64 * 128 * 4 + 64 * 4
