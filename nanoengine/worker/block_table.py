"""Each running request's block ids, and where its tokens go (vllm/v1/worker/block_table.py)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class BlockTableInterface(Protocol):
    """The block-table seam (LLM(block_table_cls=...)): each running request's block ids, and where its tokens go.

    Row of a request: its block ids in order; token t lives in block row[t // block_size] at offset
    t % block_size, flat slot row[t // block_size] * block_size + t % block_size. Rows only grow
    while a request runs (the KV cache manager never replaces a block), and go when it finishes or
    is preempted. vLLM's BlockTable (vllm/v1/worker/block_table.py) keeps the same rows in a
    preallocated array indexed by the request's batch row, and computes slots on the device.
    """

    def add_row(self, req_id: str, block_ids: list[int]) -> None: ...
    def append_row(self, req_id: str, block_ids: list[int]) -> None: ...
    def remove_row(self, req_id: str) -> None: ...
    def compute_slot_mapping(self, req_id: str, start_pos: int, num_tokens: int) -> list[int]: ...
    def get_block_tables(self, req_ids: list[str]) -> list[list[int]]: ...


class BlockTable:
    """The engine's BlockTableInterface: rows in a dict, padded with the null block (0) on request."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.rows: dict[str, list[int]] = {}

    def add_row(self, req_id: str, block_ids: list[int]) -> None:
        self.rows[req_id] = list(block_ids)

    def append_row(self, req_id: str, block_ids: list[int]) -> None:
        self.rows[req_id].extend(block_ids)

    def remove_row(self, req_id: str) -> None:
        self.rows.pop(req_id, None)

    def compute_slot_mapping(self, req_id: str, start_pos: int, num_tokens: int) -> list[int]:
        row, bs = self.rows[req_id], self.block_size
        return [row[p // bs] * bs + p % bs for p in range(start_pos, start_pos + num_tokens)]

    def get_block_tables(self, req_ids: list[str]) -> list[list[int]]:
        """The rows of req_ids, in that order, padded with the null block to the longest."""
        width = max(len(self.rows[r]) for r in req_ids)
        return [self.rows[r] + [0] * (width - len(self.rows[r])) for r in req_ids]


class MultiGroupBlockTable:
    """One block table per KV cache group (vLLM's MultiGroupBlockTable, vllm/v1/worker/block_table.py).

    A request's block ids arrive as one list per group, and each group's table keeps that group's rows: a hybrid
    model's full-attention and sliding layers index different blocks for the same tokens. Every group's table is
    of one class, the engine's BlockTable or the one given through LLM(block_table_cls=...).
    """

    def __init__(self, block_size: int, num_groups: int, block_table_cls: type[BlockTableInterface] = BlockTable):
        self.block_tables = [block_table_cls(block_size) for _ in range(num_groups)]

    def __getitem__(self, group_id: int) -> BlockTableInterface:
        return self.block_tables[group_id]

    def __iter__(self):
        return iter(self.block_tables)

    def add_row(self, req_id: str, block_ids: tuple[list[int], ...]) -> None:
        for table, group_block_ids in zip(self.block_tables, block_ids, strict=True):
            table.add_row(req_id, group_block_ids)

    def append_row(self, req_id: str, block_ids: tuple[list[int], ...]) -> None:
        for table, group_block_ids in zip(self.block_tables, block_ids, strict=True):
            table.append_row(req_id, group_block_ids)

    def remove_row(self, req_id: str) -> None:
        for table in self.block_tables:
            table.remove_row(req_id)
