"""Draft-model drafts: a smaller model with the target's vocabulary guesses the next k tokens greedily
(vllm/v1/spec_decode/draft_model.py's DraftModelProposer, with vLLM's default draft_sample_method, "greedy").

After the target's forward pass and sampling, the drafter runs over the tokens the step verified plus the token
it sampled, at their positions, which gives the first draft; then k - 1 passes of one token each feed it its own
drafts. Those passes write KV past the target's scheduled tokens, which is why the scheduler reserves
num_lookahead_tokens = k slots (vLLM's VllmConfig.num_lookahead_tokens). vLLM runs the same three parts in
SpecDecodeBaseProposer.propose, with one extra input slot a request for the sampled token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import SpeculativeConfig
from nanoengine.worker.inputs import Batch, ModelInputs, ScheduledChunk

# ModelRunner._prepare_inputs, which the drafter's passes share with the target's.
PrepareInputs = Callable[[Batch], ModelInputs]


@dataclass(slots=True)
class DraftRequest:
    """One request of the step, as a drafter sees it after the target's forward pass and sampling.

    start: the first position the target computed this step, and num_scheduled how many; row: the first of
    those positions' rows in the target's hidden states. token_ids: its tokens, the new one included when
    sampled (its tokens reached their end this step, so it got one). num_slots: the positions its blocks
    cover. num_left: the tokens max_tokens leaves after the new one.
    """

    req_id: str
    start: int
    num_scheduled: int
    row: int
    token_ids: list[int]
    sampled: bool
    num_slots: int
    num_left: int


class DraftModelProposer:
    """Proposes up to k drafts a request and step with a draft model whose KV lives in the target's blocks.

    Invariant: the draft's KV mirrors the target's. kv_cache holds the draft's layers over the same block ids
    as the target's pool, and every slot whose target KV a step verifies gets the draft's KV of the same token
    in that step, through the same block table. So a prefix-cache hit, a recompute after preemption or a
    chunked prompt finds the draft's KV where it finds the target's, and the drafter keeps no state of its own.
    Slots of rejected drafts and of the lookahead hold guesses in both caches until a later step overwrites them.

    A request gets min(k, what max_tokens and max_model_len leave, what its blocks hold) drafts: a scheduler
    that reserves fewer lookahead slots (one of one's own) gets fewer drafts, never KV written outside a
    request's blocks.
    """

    reads_hidden_states = False  # whether forward reads the target's hidden states (EAGLE's do)

    def __init__(self, model, kv_cache: PagedKVCache, config: SpeculativeConfig, max_model_len: int):
        self.model, self.kv_cache = model, kv_cache
        self.k, self.max_model_len = config.num_speculative_tokens, max_model_len

    def first_pass(self, r: DraftRequest) -> tuple[list[int], range | None, int]:
        """For one request: the tokens the first pass writes from r.start on, the target's hidden rows it
        reads (None: none), and its number of drafts. Here: the step's verified tokens and the new one."""
        end = min(r.num_slots, len(r.token_ids)) if r.sampled else r.start + r.num_scheduled
        full = r.sampled and end == len(r.token_ids)
        num = min(self.k, r.num_left, self.max_model_len - end, r.num_slots - end + 1) if full else 0
        return r.token_ids[r.start : end], None, num

    @torch.inference_mode()
    def propose(
        self, prepare_inputs: PrepareInputs, requests: list[DraftRequest], hidden_states: torch.Tensor | None = None
    ) -> dict[str, list[int]]:
        """Write the drafter's KV for the step (first_pass), then draft for each request that gets drafts: the
        greedy token after its last position, then after each draft in turn, one pass a draft."""
        entries: list[tuple[ScheduledChunk, range | None]] = []
        num_drafts: dict[str, int] = {}
        for r in requests:
            tokens, rows, num = self.first_pass(r)
            entries.append((ScheduledChunk(r.req_id, r.start, tokens), rows))
            if num > 0:
                num_drafts[r.req_id] = num
        # One-token requests first, as _prepare_inputs wants; none is empty, since the target wrote each.
        entries.sort(key=lambda entry: len(entry[0].token_ids) > 1)
        batch = [chunk for chunk, _ in entries]
        hidden_in = None
        if self.reads_hidden_states:
            assert hidden_states is not None, "a drafter that reads hidden states runs with the target's graphs off"
            hidden_rows: list[int] = []
            for _, rows in entries:
                assert rows is not None, "a drafter that reads hidden states names the rows each first pass reads"
                hidden_rows += rows
            hidden_in = hidden_states[hidden_rows]
        drafts, hidden = self.draft_step(prepare_inputs, batch, dict.fromkeys(num_drafts, ()), hidden_in)
        last = {chunk.req_id: chunk.start + len(chunk.token_ids) - 1 for chunk in batch}
        for j in range(1, max(num_drafts.values(), default=0)):
            batch_j = [ScheduledChunk(r, last[r] + j, [d[-1]]) for r, d in drafts.items() if num_drafts[r] > j]
            hidden_in = None if hidden is None else torch.stack([hidden[c.req_id] for c in batch_j])
            new, hidden = self.draft_step(
                prepare_inputs, batch_j, {c.req_id: drafts[c.req_id] for c in batch_j}, hidden_in
            )
            drafts.update(new)
        return {r: list(d) for r, d in drafts.items()}

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor | None):
        return self.model(input_ids, positions, self.kv_cache)

    def draft_step(
        self,
        prepare_inputs: PrepareInputs,
        batch: Batch,
        drafts: dict[str, tuple[int, ...]],
        hidden_in: torch.Tensor | None,
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, torch.Tensor] | None]:
        """One forward pass of the drafter over batch. Each request in drafts gets the greedy token after its
        last row appended; returns them, and (for a drafter that reads hidden states) that row's output."""
        inputs = prepare_inputs(batch)
        self.kv_cache.group_metadata = inputs.attn_metadata
        out = self.forward(inputs.input_ids, inputs.positions, hidden_in)
        starts = inputs.query_start_loc
        ids = [chunk.req_id for chunk in batch if chunk.req_id in drafts]
        rows = [starts[i + 1] - 1 for i, chunk in enumerate(batch) if chunk.req_id in drafts]
        if not rows:
            return {}, None
        last = out[torch.tensor(rows, device=out.device)]
        tokens = self.model.compute_logits(last).argmax(dim=-1).tolist()
        hidden = None if hidden_in is None else dict(zip(ids, last))
        return {r: (*drafts[r], t) for r, t in zip(ids, tokens)}, hidden
