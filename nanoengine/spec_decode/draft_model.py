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

import torch

from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import SpeculativeConfig
from nanoengine.model import LlamaForCausalLM

# (request id, first position, tokens): one request's share of a forward pass, as ModelRunner._prepare_inputs
# takes it, which returns (input ids, positions, attention metadata per group, each request's first row).
Batch = list[tuple[str, int, list[int]]]


class DraftModelProposer:
    """Proposes up to k drafts a request and step with a draft model whose KV lives in the target's blocks.

    Invariant: the draft's KV mirrors the target's. kv_cache holds the draft's layers over the same block ids
    as the target's pool, and every slot whose target KV a step verifies gets the draft's KV of the same token
    in that step, through the same block table. So a prefix-cache hit, a recompute after preemption or a
    chunked prompt finds the draft's KV where it finds the target's, and the drafter keeps no state of its own.
    Slots of rejected drafts and of the lookahead hold guesses in both caches until a later step overwrites them.
    """

    def __init__(self, model: LlamaForCausalLM, kv_cache: PagedKVCache, config: SpeculativeConfig,
                 max_model_len: int):
        self.model, self.kv_cache = model, kv_cache
        self.k, self.max_model_len = config.num_speculative_tokens, max_model_len

    @torch.inference_mode()
    def propose(self, prepare_inputs: Callable, batch: Batch, num_drafts: dict[str, int]) -> dict[str, list[int]]:
        """Write the draft's KV of batch (each request's verified tokens of this step, and its new token where it
        got one), then draft num_drafts[r] tokens for each request r in it: the greedy token after its last
        one, then after each draft in turn, one pass a draft, at the positions after it."""
        # One-token requests first, as prepare_inputs wants; none is empty, since the target wrote each.
        batch = sorted(batch, key=lambda entry: len(entry[2]) > 1)
        drafts = self._step(prepare_inputs, batch, dict.fromkeys(num_drafts, ()))
        last = {req_id: start + len(tokens) - 1 for req_id, start, tokens in batch}
        for j in range(1, max(num_drafts.values(), default=0)):
            batch_j = [(r, last[r] + j, [d[-1]]) for r, d in drafts.items() if num_drafts[r] > j]
            drafts.update(self._step(prepare_inputs, batch_j, {r: drafts[r] for r, *_ in batch_j}))
        return {r: list(d) for r, d in drafts.items()}

    def _step(self, prepare_inputs: Callable, batch: Batch, drafts: dict[str, tuple[int, ...]]
              ) -> dict[str, tuple[int, ...]]:
        """One forward pass of the draft model over batch; each request in drafts gets the greedy token after
        its last row appended."""
        input_ids, positions, metadata, starts = prepare_inputs(batch)
        self.kv_cache.group_metadata = metadata
        hidden = self.model(input_ids, positions, self.kv_cache)
        rows = [starts[i + 1] - 1 for i, (req_id, *_) in enumerate(batch) if req_id in drafts]
        if not rows:
            return {}
        tokens = self.model.compute_logits(hidden[torch.tensor(rows, device=hidden.device)]).argmax(dim=-1).tolist()
        return {r: (*drafts[r], t) for r, t in zip((r for r, *_ in batch if r in drafts), tokens)}
