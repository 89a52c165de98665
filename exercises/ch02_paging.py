"""Chapter 02 exercises: blocks, block tables and slots.

A request's KV lives in fixed-size blocks scattered over one shared pool. Its block table lists
them in order: token t sits in block `block_table[t // block_size]` at offset `t % block_size`.

Check your work with:   make grade CH=02
Stuck? In the notebook, `from nanocourse import hint; hint("02")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("02", n).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def num_blocks_needed(num_tokens: int, block_size: int) -> int:
    """Task 02.1: how many blocks hold num_tokens tokens (num_tokens >= 0, block_size >= 1).

    Contract: the fewest whole blocks whose block_size slots each hold all num_tokens tokens. A partial block
    still costs a whole block; a length that ends on a block boundary takes no extra block; zero tokens need
    zero blocks. (vLLM 0.33: `cdiv` in vllm/utils/math_utils.py, as
    SingleTypeKVCacheManager.get_num_blocks_to_allocate uses it in vllm/v1/core/single_type_kv_cache_manager.py.)
    Example: num_blocks_needed(17, 16) == 2; num_blocks_needed(16, 16) == 1; num_blocks_needed(0, 16) == 0.
    """
    raise NotImplementedError


def slot_mapping(block_table: Sequence[int], start_pos: int, num_tokens: int, block_size: int) -> list[int]:
    """Task 02.2: the flat cache slot of each of positions start_pos .. start_pos + num_tokens - 1.

    Contract: a list of num_tokens ints, one per position, in position order (empty when num_tokens is 0).
    The caches are [num_blocks, block_size, ...]; viewed flat, block b offset o is slot b * block_size + o,
    and position p lives in the block the table lists for it (entry p // block_size) at offset
    p % block_size. The table's blocks need not be adjacent or sorted. start_pos is where this step's chunk
    begins, not 0: a later prefill chunk starts mid-sequence, and a decode has num_tokens == 1 and
    start_pos == the number of tokens already cached. The slots must drive a real paged forward pass to
    the contiguous cache's result. (vLLM 0.33: BlockTable.compute_slot_mapping and its Triton kernel
    ComputeSlotMappingKernel in vllm/v1/worker/block_table.py, for the whole batch at once.)
    Example: slot_mapping([5, 1], 3, 3, 4) == [23, 4, 5] (position 3 is block 5's last slot, 4 and 5 open
    block 1); slot_mapping([5, 1], 6, 1, 4) == [6].
    """
    raise NotImplementedError


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Task 02.3: copy one request's first seq_len tokens out of the paged cache, in order.

    Contract: cache is one layer's [num_blocks, block_size, num_kv_heads, head_dim]; block_table is a 1-D
    integer tensor (int32 in the engine) that may be longer than needed, padded with 0, the null block.
    Return a contiguous [seq_len, num_kv_heads, head_dim] tensor of the cache's dtype whose row t is
    token t's vector, the one at offset t % block_size of block block_table[t // block_size]: the blocks
    come in table order (not sorted), and the last one is cut at seq_len (a seq_len on a block boundary
    keeps its last block whole). Only the first num_blocks_needed(seq_len, block_size) table entries may
    be read: the padding and the blocks past them may hold anything (NaN in the grader). The cache is not
    changed. On the engine's paged cache, layer by layer, the result equals the contiguous cache's K and V.
    (vLLM 0.33's standard attention kernels have no such step: they read the blocks in place. Only MLA's
    chunked prefill gathers, with `cp_gather_cache` in vllm/_custom_ops.py, which copies a batch's blocks into
    one contiguous buffer; the engine's TorchBackend gathers like this every step.)
    Example: cache[b, o, 0, 0] == 2 * b + o for 6 blocks of 2 tokens, one head of dim 1:
    gather_kv(cache, tensor([4, 1, 0, 0], dtype=torch.int32), 3) has shape [3, 1, 1] and values 8, 9, 2
    (block 4 whole, then block 1's first token).
    """
    raise NotImplementedError


def wasted_slots(seq_lens: Sequence[int], block_size: int) -> int:
    """Task 02.4: the slots a paged cache holds but leaves empty, summed over the requests.

    Contract: each request of length L holds num_blocks_needed(L, block_size) blocks, and wastes only the
    empty tail of its last one: the slots its blocks hold minus its L tokens. A request whose length is a
    multiple of block_size wastes nothing, so do one-token blocks; no requests waste nothing. This is the
    whole of paging's waste (internal fragmentation). (vLLM 0.33 has no function for it: it measures what
    the `cdiv` allocation of SingleTypeKVCacheManager.get_num_blocks_to_allocate,
    vllm/v1/core/single_type_kv_cache_manager.py, leaves empty.)
    Example: wasted_slots([5, 8], 4) == 3 (5 tokens hold 2 blocks = 8 slots, 8 tokens fill theirs);
    wasted_slots([], 4) == 0.
    """
    raise NotImplementedError


class BlockTable:
    """Task 02.5: the model runner's block tables (nanoengine.worker.block_table.BlockTableInterface).

    One row per running request: its block ids in order, as the scheduler hands them out. Rows only
    grow while the request runs, and go when it finishes or is preempted. LLM(block_table_cls=...)
    builds one with the engine's block size and asks it, every step, for each request's slots and
    for the padded block tables of the batch.

    Contract: the engine runs with your BlockTable (chunked prefills, decodes and a preemption that frees a
    request and readmits it) and generates the same tokens as each request alone in a contiguous cache.
    vLLM 0.33: BlockTable in vllm/v1/worker/block_table.py (add_row, append_row, clear_row,
    compute_slot_mapping); it keeps the rows in a preallocated array, zero-padded, indexed by the request's
    row in the batch rather than by its id, and computes slots on the device.
    Example: t = BlockTable(4); t.add_row("a", [7, 2]); t.add_row("b", [5]); t.append_row("a", [9]); then
    t.compute_slot_mapping("a", 8, 1) == [36] and t.get_block_tables(["b", "a"]) == [[5, 0, 0], [7, 2, 9]].
    """

    def __init__(self, block_size: int):
        """Contract: the table remembers block_size (every slot uses it) and starts with no rows.

        Example: BlockTable(4).get_block_tables(["a"]) raises KeyError: there is no row "a" yet.
        """
        raise NotImplementedError

    def add_row(self, req_id: str, block_ids: list[int]) -> None:
        """A new (or readmitted) request: its row becomes block_ids.

        Contract: the row is the table's own copy, so a later change to the caller's list does not change it;
        a readmitted request starts a new row, whatever it had before. (vLLM 0.33: BlockTable.add_row.)
        Example: after ids = [3]; t.add_row("c", ids); ids.append(4): t.get_block_tables(["c"]) == [[3]].
        """
        raise NotImplementedError

    def append_row(self, req_id: str, block_ids: list[int]) -> None:
        """The request got more blocks this step: they go at the end of its row.

        Contract: the request has a row; its blocks so far keep their places and block_ids follow them in
        order. block_ids may be empty (a step that needed no new block): the row stays as it was.
        (vLLM 0.33: BlockTable.append_row.)
        Example: after t.add_row("a", [7, 2]); t.append_row("a", [9]); t.append_row("a", []): a's row is
        [7, 2, 9].
        """
        raise NotImplementedError

    def remove_row(self, req_id: str) -> None:
        """The request finished or was preempted: its row goes.

        Contract: afterwards the table has no row for req_id (get_block_tables([req_id]) raises KeyError, and
        the other rows are padded as if it never was); removing an id that has no row is not an error.
        (vLLM 0.33: BlockTable.clear_row, as the input batch drops a request.)
        Example: t.remove_row("a"); t.remove_row("never-added") both return None.
        """
        raise NotImplementedError

    def compute_slot_mapping(self, req_id: str, start_pos: int, num_tokens: int) -> list[int]:
        """The flat slots of positions start_pos .. start_pos + num_tokens - 1 of the request.

        Contract: exactly slot_mapping's rule (task 02.2) over the request's row and the table's block size,
        from start_pos, not from 0: every step but the first starts mid-sequence.
        (vLLM 0.33: BlockTable.compute_slot_mapping.)
        Example: with block size 4 and a's row [7, 2]: t.compute_slot_mapping("a", 3, 2) == [31, 8].
        """
        raise NotImplementedError

    def get_block_tables(self, req_ids: list[str]) -> list[list[int]]:
        """The rows of req_ids, in that order, each padded with 0 (the null block) to the longest.

        Contract: one list per id, in the order asked; each is the request's row followed by 0s up to the
        length of the longest row among the ids asked (not among all rows). An id with no row (never added,
        or removed) raises KeyError. The kernels read a rectangular [num_requests, max_blocks] tensor;
        padding with the null block is safe because seq_lens keeps every read inside the real blocks.
        (vLLM 0.33: BlockTable.get_device_tensor, whose array is zero-padded to a fixed width.)
        Example: rows a [7, 2, 9] and b [5]: t.get_block_tables(["b", "a"]) == [[5, 0, 0], [7, 2, 9]] and
        t.get_block_tables(["b"]) == [[5]].
        """
        raise NotImplementedError
