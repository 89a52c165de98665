"""Chapter 02 solutions: blocks, block tables and slots."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def num_blocks_needed(num_tokens: int, block_size: int) -> int:
    """Task 02.1: how many blocks hold num_tokens tokens."""
    return -(-num_tokens // block_size)


def slot_mapping(block_table: Sequence[int], start_pos: int, num_tokens: int, block_size: int) -> list[int]:
    """Task 02.2: the flat cache slot of each position of this step's chunk."""
    return [
        block_table[p // block_size] * block_size + p % block_size for p in range(start_pos, start_pos + num_tokens)
    ]


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Task 02.3: one request's first seq_len tokens, contiguous."""
    blocks = block_table[: num_blocks_needed(seq_len, cache.shape[1])].long()
    return cache[blocks].flatten(0, 1)[:seq_len]


def wasted_slots(seq_lens: Sequence[int], block_size: int) -> int:
    """Task 02.4: held but empty slots, summed over the requests."""
    return sum(num_blocks_needed(n, block_size) * block_size - n for n in seq_lens)


class BlockTable:
    """Task 02.5: one growing row of block ids per running request.

    Invariant: rows[req_id] lists the request's blocks in position order (token t sits in block
    rows[req_id][t // block_size]); a row only grows, until the request finishes or is preempted.
    """

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.rows: dict[str, list[int]] = {}

    def add_row(self, req_id: str, block_ids: list[int]) -> None:
        self.rows[req_id] = list(block_ids)  # a copy: the caller owns its list and may change it

    def append_row(self, req_id: str, block_ids: list[int]) -> None:
        self.rows[req_id].extend(block_ids)

    def remove_row(self, req_id: str) -> None:
        self.rows.pop(req_id, None)

    def compute_slot_mapping(self, req_id: str, start_pos: int, num_tokens: int) -> list[int]:
        return slot_mapping(self.rows[req_id], start_pos, num_tokens, self.block_size)

    def get_block_tables(self, req_ids: list[str]) -> list[list[int]]:
        width = max(len(self.rows[r]) for r in req_ids)
        return [self.rows[r] + [0] * (width - len(self.rows[r])) for r in req_ids]
