"""Turn a SchedulerOutput into one forward pass over the paged cache (vllm/v1/worker/gpu_model_runner.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoengine.attention.backend import AttentionMetadata
from nanoengine.attention.paged import PagedKVCache
from nanoengine.model import LlamaForCausalLM
from nanoengine.sampler import make_generator, sample
from nanoengine.sampling_params import SamplingParams
from nanoengine.scheduler import SchedulerOutput


@dataclass(slots=True)
class CachedRequestState:
    """The runner's own copy of a request: its tokens and its block table.

    The runner appends the tokens it samples itself, so the scheduler never resends them.
    """

    req_id: str
    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int
    sampling_params: SamplingParams


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: PagedKVCache, device: torch.device):
        self.model, self.kv_cache, self.device = model, kv_cache, device
        self.block_size = kv_cache.block_size
        self.requests: dict[str, CachedRequestState] = {}
        # Kept across preemption so a seeded request draws the same numbers after recompute.
        self.generators: dict[str, torch.Generator | None] = {}

    def _update_states(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            self.generators.pop(req_id, None)
        for req_id in so.preempted_req_ids:
            self.requests.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            params = new.request.sampling_params
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, list(new.token_ids), list(new.block_ids), new.num_computed_tokens, params
            )
            if new.req_id not in self.generators:
                self.generators[new.req_id] = make_generator(params.seed)
        cached = so.scheduled_cached_reqs
        for req_id, block_ids, num_computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            state = self.requests[req_id]
            state.block_ids.extend(block_ids)
            state.num_computed_tokens = num_computed

    def _prepare_inputs(self, order: list[str], num_scheduled: dict[str, int]):
        bs = self.block_size
        input_ids, positions, slots, seq_lens, starts = [], [], [], [], [0]
        for req_id in order:
            state, n = self.requests[req_id], num_scheduled[req_id]
            c = state.num_computed_tokens
            input_ids += state.token_ids[c : c + n]
            pos = range(c, c + n)
            positions += pos
            slots += [state.block_ids[p // bs] * bs + p % bs for p in pos]
            seq_lens.append(c + n)
            starts.append(starts[-1] + n)
        width = max(len(self.requests[r].block_ids) for r in order)
        tables = [self.requests[r].block_ids + [0] * (width - len(self.requests[r].block_ids)) for r in order]
        dev = self.device
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            max_query_len=max(num_scheduled[r] for r in order),
            max_seq_len=max(seq_lens),
            num_decodes=(num_decodes := sum(num_scheduled[r] == 1 for r in order)),
            num_common_prefix_blocks=_common_prefix(tables[:num_decodes]),
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        return ids, torch.tensor(positions, dtype=torch.int64, device=dev), metadata, starts

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> dict[str, int]:
        """Run one step; return the sampled token of every request whose prompt is now complete."""
        self._update_states(so)
        if not so.num_scheduled_tokens:
            return {}
        # Decodes first: the attention backend runs them through its decode kernel in one launch.
        order = sorted(so.num_scheduled_tokens, key=lambda r: so.num_scheduled_tokens[r] > 1)
        input_ids, positions, metadata, starts = self._prepare_inputs(order, so.num_scheduled_tokens)
        self.kv_cache.metadata = metadata
        hidden = self.model(input_ids, positions, self.kv_cache)

        done = []  # requests whose chunk reaches the end of their tokens get a next token
        for i, req_id in enumerate(order):
            state = self.requests[req_id]
            state.num_computed_tokens += so.num_scheduled_tokens[req_id]
            if state.num_computed_tokens == len(state.token_ids):
                done.append((i, state))
        if not done:
            return {}
        rows = torch.tensor([starts[i + 1] - 1 for i, _ in done], device=self.device)
        logits = self.model.compute_logits(hidden[rows])
        tokens = sample(logits, [s.sampling_params for _, s in done], [self.generators[s.req_id] for _, s in done])
        for (_, state), token in zip(done, tokens):
            state.token_ids.append(token)
        return {state.req_id: token for (_, state), token in zip(done, tokens)}


def _common_prefix(tables: list[list[int]]) -> int:
    """How many leading block ids all the given block tables share (0 for fewer than two tables)."""
    if len(tables) < 2:
        return 0
    n = 0
    for column in zip(*tables):
        if 0 in column or any(b != column[0] for b in column):
            break
        n += 1
    return n
