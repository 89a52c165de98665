"""Chapter 02 exercises: blocks, block tables and slots.

A request's KV lives in fixed-size blocks scattered over one shared pool. Its block table lists
them in order: token t sits in block `block_table[t // block_size]` at offset `t % block_size`.

Check your work with:   make grade CH=02
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def num_blocks_needed(num_tokens: int, block_size: int) -> int:
    """Task 02.1: how many blocks hold num_tokens tokens (num_tokens >= 0).

    A partial block still costs a whole block; zero tokens need zero blocks.

    Hints: this is a ceiling division. In integer arithmetic, -(-a // b) rounds up.
    """
    raise NotImplementedError


def slot_mapping(block_table: Sequence[int], start_pos: int, num_tokens: int, block_size: int) -> list[int]:
    """Task 02.2: the flat cache slot of each of positions start_pos .. start_pos + num_tokens - 1.

    The caches are [num_blocks, block_size, ...]; viewed flat, block b offset o is slot
    b * block_size + o. Return a list of ints, one per position. start_pos is where this step's
    chunk begins: a decode has num_tokens == 1 and start_pos == the number of tokens already cached.

    Hints: for each position p, look up the block holding it, then add p's offset inside that block.
    """
    raise NotImplementedError


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Task 02.3: copy one request's first seq_len tokens out of the paged cache, in order.

    cache is one layer's [num_blocks, block_size, num_kv_heads, head_dim]; block_table is a 1-D
    integer tensor that may be longer than needed (padded with 0, the null block). Return a
    contiguous [seq_len, num_kv_heads, head_dim] tensor: row t is token t's vector.

    Hints:
    - Index the cache with the table's first num_blocks_needed(seq_len, block_size) entries
      (cast them with .long()): that gives [n, block_size, Hkv, D].
    - Merge the first two dimensions (.flatten(0, 1)), then cut the unused tail of the last block.
    - Never read a block past the ones the request needs: unused blocks may hold anything.
    """
    raise NotImplementedError


def wasted_slots(seq_lens: Sequence[int], block_size: int) -> int:
    """Task 02.4: the slots a paged cache holds but leaves empty, summed over the requests.

    Each request of length L holds num_blocks_needed(L, block_size) blocks; only the tail of its
    last block is empty. This is the whole of paging's waste (internal fragmentation).

    Hints: blocks held * block_size - tokens, per request.
    """
    raise NotImplementedError


class BlockTable:
    """Task 02.5: the model runner's block tables (nanoengine.worker.block_table.BlockTableInterface).

    One row per running request: its block ids in order, as the scheduler hands them out. Rows only
    grow while the request runs, and go when it finishes or is preempted. LLM(block_table_cls=...)
    builds one with the engine's block size and asks it, every step, for each request's slots and
    for the padded block tables of the batch.
    """

    def __init__(self, block_size: int):
        """Keep the block size, and a dict from request id to its row (a list of block ids)."""
        raise NotImplementedError

    def add_row(self, req_id: str, block_ids: list[int]) -> None:
        """A new (or readmitted) request: its row is a copy of block_ids."""
        raise NotImplementedError

    def append_row(self, req_id: str, block_ids: list[int]) -> None:
        """The request got more blocks this step: extend its row (block_ids may be empty)."""
        raise NotImplementedError

    def remove_row(self, req_id: str) -> None:
        """The request finished or was preempted: forget its row (no error if it has none)."""
        raise NotImplementedError

    def compute_slot_mapping(self, req_id: str, start_pos: int, num_tokens: int) -> list[int]:
        """The flat slots of positions start_pos .. start_pos + num_tokens - 1 of the request.

        Hints: this is your slot_mapping (task 02.2) on the request's row.
        """
        raise NotImplementedError

    def get_block_tables(self, req_ids: list[str]) -> list[list[int]]:
        """The rows of req_ids, in that order, each padded with 0 (the null block) to the longest.

        Hints: the kernels read a rectangular [num_requests, max_blocks] tensor; padding with the
        null block is safe because seq_lens keeps every read inside the real blocks.
        """
        raise NotImplementedError
