"""What one forward pass reads: the requests' shares of the batch and the tensors ModelRunner._prepare_inputs builds
from them (vLLM's V2 runner keeps the latter in InputBatch, vllm/v1/worker/gpu/input_batch.py). The target model's
pass and a drafter's passes (spec_decode/) build theirs the same way."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoengine.attention.backend import AttentionMetadata


@dataclass(slots=True)
class ScheduledChunk:
    """One request's share of a forward pass: token_ids at positions start, start + 1, ...

    Invariants: token_ids is not empty, and the request's block table covers positions up to
    start + len(token_ids) - 1 (the pass writes their KV there); start is the number of the request's tokens whose
    KV is already in the cache, which the pass attends to.
    """

    req_id: str
    start: int
    token_ids: list[int]


# The requests of one forward pass, each once, in the order their rows come: the decodes (one token each) first.
Batch = list[ScheduledChunk]


@dataclass(slots=True)
class ModelInputs:
    """ModelRunner._prepare_inputs's result for a Batch: one row per token, the requests' rows in batch order.

    Invariants: input_ids and positions have one entry per row; request i of the batch owns rows
    query_start_loc[i] .. query_start_loc[i + 1] - 1, so query_start_loc starts at 0, has one entry per request and a
    last one, the number of rows, and its last row for request i is query_start_loc[i + 1] - 1. attn_metadata holds
    one AttentionMetadata per KV cache group, in group order, each over these rows.
    """

    input_ids: torch.Tensor  # int64, one token id per row
    positions: torch.Tensor  # int64, each row's position in its request
    attn_metadata: list[AttentionMetadata]
    query_start_loc: list[int]  # the first row of each request, then the number of rows
