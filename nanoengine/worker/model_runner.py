"""Turn a SchedulerOutput into one forward pass over the paged cache (vllm/v1/worker/gpu_model_runner.py).

A speculative verify step feeds a request's last verified token and its drafts d1..dk at their positions,
through the same paged path as any input: to attention it is a short prefill chunk over a cached prefix,
which both backends and the Triton kernels serve as is. CUDA graphs replay pure-decode steps only (one
token per request, DecodeGraphs.can_replay), so a step with any drafts runs eagerly.

With a draft model or an EAGLE head (spec_decode/) the runner also hands the drafter, after sampling, the step's
requests (DraftRequest) and, for EAGLE, the target's hidden states, and keeps its drafts for the engine
(take_draft_token_ids), as vLLM's runner does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from nanoengine.attention.backend import AttentionMetadata
from nanoengine.attention.paged import PagedKVCache
from nanoengine.core.sched.output import PLACEHOLDER_TOKEN_ID, SchedulerOutput
from nanoengine.errors import InvalidRequestError
from nanoengine.model import LlamaForCausalLM
from nanoengine.outputs import Logprob
from nanoengine.sample.logits_processor import RowTokens, apply_logits_processors, uses_logits_processors
from nanoengine.sample.rejection_sampler import rejection_sample
from nanoengine.sample.sampler import compute_logprobs, make_generator, sample
from nanoengine.sampling_params import SamplingParams
from nanoengine.spec_decode.draft_model import DraftModelProposer, DraftRequest
from nanoengine.worker.block_table import BlockTable, BlockTableInterface, MultiGroupBlockTable
from nanoengine.worker.cuda_graphs import DecodeGraphs
from nanoengine.worker.inputs import Batch, ModelInputs, ScheduledChunk
from nanoengine.worker.outputs import ModelRunnerOutput


@dataclass(slots=True)
class CachedRequestState:
    """The runner's own copy of a request's tokens (its blocks are in the BlockTable).

    The runner appends the tokens it samples itself, so the scheduler never resends them.
    """

    req_id: str
    token_ids: list[int]
    num_computed_tokens: int
    sampling_params: SamplingParams
    num_prompt_tokens: int
    eos_token_id: int | None = None
    # Prompt logprobs gathered chunk by chunk while the prompt is prefilled (when asked for).
    prompt_logprobs: list[dict[int, Logprob]] = field(default_factory=list)


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: PagedKVCache,
        device: torch.device,
        block_table_cls: type[BlockTableInterface] = BlockTable,
        cuda_graphs: DecodeGraphs | None = None,
        rejection_sampler=rejection_sample,
        drafter: DraftModelProposer | None = None,
    ):
        self.model, self.kv_cache, self.device = model, kv_cache, device
        # A draft model runs after each forward pass, over the same blocks (None: no drafts, or n-gram ones
        # that the engine proposes between steps).
        self.drafter = drafter
        self._draft_token_ids: dict[str, list[int]] = {}
        self.rejection_sampler = rejection_sampler  # a verify step's accept rule (LLM(rejection_sampler=...))
        self.cuda_graphs = cuda_graphs  # None: every step runs eagerly
        self.block_size = kv_cache.block_size
        self.input_block_table = MultiGroupBlockTable(self.block_size, len(kv_cache.groups), block_table_cls)
        self.requests: dict[str, CachedRequestState] = {}
        # Kept across preemption so a seeded request draws the same numbers after recompute.
        self.generators: dict[str, torch.Generator | None] = {}

    def remove_requests(self, req_ids, keep_generators: bool = False) -> None:
        """Forget requests the scheduler no longer runs: their state and block-table rows, and unless they
        were only preempted (a seeded request draws on after recompute), their generators. Ids the runner
        does not hold are skipped: an aborted request may never have reached it."""
        for req_id in req_ids:
            if self.requests.pop(req_id, None) is not None:
                self.input_block_table.remove_row(req_id)
            if not keep_generators:
                self.generators.pop(req_id, None)

    def _update_states(self, so: SchedulerOutput) -> None:
        self._draft_token_ids = {}
        self.remove_requests(so.finished_req_ids)
        self.remove_requests(so.preempted_req_ids, keep_generators=True)
        for new in so.scheduled_new_reqs:
            params = new.sampling_params
            if params.prompt_logprobs is not None and new.num_computed_tokens:
                raise InvalidRequestError(
                    f"Request {new.req_id} asks for prompt logprobs but was admitted with {new.num_computed_tokens} "
                    "cached tokens, whose logits are never computed. A KV cache manager must give no prefix hit "
                    "to a request whose skip_reading_prefix_cache is True (see KVCacheManager.get_computed_blocks)."
                )
            self.requests[new.req_id] = CachedRequestState(
                new.req_id,
                list(new.prefill_token_ids),
                new.num_computed_tokens,
                params,
                len(new.prompt_token_ids),
                new.eos_token_id,
            )
            self.input_block_table.add_row(new.req_id, new.block_ids)
            if new.req_id not in self.generators:
                self.generators[new.req_id] = make_generator(params.seed)
        cached = so.scheduled_cached_reqs
        for req_id, block_ids, num_computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            self.requests[req_id].num_computed_tokens = num_computed
            self.input_block_table.append_row(req_id, block_ids)

    @staticmethod
    def batch_order(num_scheduled_tokens: dict[str, int]) -> list[str]:
        """The requests in the order the step runs them: decodes first, since the attention backend runs them
        through its decode kernel in one launch (vLLM's reorder_batch_to_split_decodes_and_prefills)."""
        return sorted(num_scheduled_tokens, key=lambda r: num_scheduled_tokens[r] > 1)

    def _prepare_inputs(self, batch: Batch) -> ModelInputs:
        """One forward pass's inputs for batch, whose decodes (one token each) come first: token ids, positions,
        one AttentionMetadata per KV cache group, and where each request's rows start (see ModelInputs)."""
        input_ids: list[int] = []
        positions: list[int] = []
        seq_lens: list[int] = []
        starts = [0]
        for chunk in batch:
            c, tokens = chunk.start, chunk.token_ids
            input_ids += tokens
            positions += range(c, c + len(tokens))
            seq_lens.append(c + len(tokens))
            starts.append(starts[-1] + len(tokens))
        dev = self.device
        query_start_loc = torch.tensor(starts, dtype=torch.int32, device=dev)
        seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
        order = [chunk.req_id for chunk in batch]
        lengths = [len(chunk.token_ids) for chunk in batch]
        num_decodes = next((i for i, n in enumerate(lengths) if n > 1), len(lengths))
        metadata = []
        for table, group in zip(self.input_block_table, self.kv_cache.groups):
            slots = []
            for chunk in batch:
                slots += table.compute_slot_mapping(chunk.req_id, chunk.start, len(chunk.token_ids))
            tables = table.get_block_tables(order)
            metadata.append(
                AttentionMetadata(
                    slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
                    query_start_loc=query_start_loc,
                    seq_lens=seq_lens_t,
                    block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
                    max_query_len=max(lengths),
                    max_seq_len=max(seq_lens),
                    num_decodes=num_decodes,
                    # Cascade attention serves full attention only: under a window the shared prefix is partly
                    # out of sight. (vLLM 0.33 removed cascade attention and reports no common prefix for any group.)
                    num_common_prefix_blocks=0
                    if group.sliding_window
                    else num_common_prefix_blocks(tables[:num_decodes]),
                )
            )
        return ModelInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            attn_metadata=metadata,
            query_start_loc=starts,
        )

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step: the sampled tokens of every request whose scheduled tokens are now all computed (one,
        or after k drafts the accepted ones and one more), with the logprobs asked for, one entry a token."""
        self._update_states(so)
        output = ModelRunnerOutput()
        if not so.num_scheduled_tokens:
            return output
        order = self.batch_order(so.num_scheduled_tokens)
        spec = so.scheduled_spec_decode_tokens
        batch: Batch = []
        for req_id in order:
            state, n, drafts = self.requests[req_id], so.num_scheduled_tokens[req_id], spec.get(req_id, [])
            c = state.num_computed_tokens
            # A placeholder draft (a step padded to 1 + k) is fed as token 0, as vLLM's runner clamps it.
            fed = [0 if d == PLACEHOLDER_TOKEN_ID else d for d in drafts]
            batch.append(ScheduledChunk(req_id, c, state.token_ids[c : c + n - len(drafts)] + fed))
        inputs = self._prepare_inputs(batch)
        metadata, starts = inputs.attn_metadata, inputs.query_start_loc
        graphs = self.cuda_graphs if self.cuda_graphs and self.cuda_graphs.can_replay(metadata[0], len(order)) else None
        # Set for a replayed step too: a replay reads the graph's own buffers, but whoever inspects
        # kv_cache.metadata (an observer) must see this step's, not the last eager one's.
        self.kv_cache.group_metadata = metadata
        if graphs:  # every request decodes one token, so row i is request i's last token
            all_logits = graphs.replay(inputs.input_ids, inputs.positions, metadata[0])
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache)

        def row_logits(rows: list[int]) -> torch.Tensor:
            index = torch.tensor(rows, device=self.device)
            return all_logits[index] if graphs else self.model.compute_logits(hidden[index])

        done = []  # requests whose chunk reaches the end of their tokens get a next token
        for i, req_id in enumerate(order):
            state = self.requests[req_id]
            state.num_computed_tokens += so.num_scheduled_tokens[req_id]
            if state.num_computed_tokens - len(spec.get(req_id, ())) == len(state.token_ids):
                done.append((i, state))
        output.prompt_logprobs_dict = self._gather_prompt_logprobs(order, so.num_scheduled_tokens, starts, row_logits)
        if done:
            self._sample(output, done, spec, starts, row_logits)
        if self.drafter is not None:
            hidden_states = None if graphs else hidden  # a drafter that reads them runs with the graphs off
            self._draft_token_ids = self.drafter.propose(
                self._prepare_inputs, self._draft_requests(batch, starts, done), hidden_states
            )
        return output

    def _draft_requests(self, batch: Batch, starts: list[int], done) -> list[DraftRequest]:
        """The step's requests as the drafter sees them, in batch order."""
        sampled = {state.req_id for _, state in done}
        requests = []
        for chunk, row in zip(batch, starts):
            req_id, state = chunk.req_id, self.requests[chunk.req_id]
            num_left = state.sampling_params.max_tokens - (len(state.token_ids) - state.num_prompt_tokens) - 1
            requests.append(
                DraftRequest(
                    req_id,
                    chunk.start,
                    len(chunk.token_ids),
                    row,
                    state.token_ids,
                    req_id in sampled,
                    self._num_slots(req_id),
                    num_left,
                )
            )
        return requests

    def _num_slots(self, req_id: str) -> int:
        """The positions a request's blocks cover: its row up to the first null block (full attention only)."""
        row = self.input_block_table[0].get_block_tables([req_id])[0]
        return next((i for i, block in enumerate(row) if block == 0), len(row)) * self.block_size

    def _sample(self, output: ModelRunnerOutput, done, spec, starts, row_logits) -> None:
        """Sample (or with drafts, verify) the next tokens of the requests in done, (row index, state) each."""
        scheduled = [spec.get(s.req_id, []) for _, s in done]
        # A request verifies its drafts up to its first placeholder, which is rejected unread (vLLM's rejection
        # sampler rejects -1 too): so a padded step samples its one token as a step without drafts would.
        drafts = [d[: d.index(PLACEHOLDER_TOKEN_ID)] if PLACEHOLDER_TOKEN_ID in d else d for d in scheduled]
        # k + 1 rows for k drafts: the logits after the last verified token and after each draft.
        logits = row_logits(
            [
                r
                for (i, _), f, d in zip(done, scheduled, drafts)
                for r in range(starts[i + 1] - 1 - len(f), starts[i + 1] - len(f) + len(d))
            ]
        )
        params, generators = [s.sampling_params for _, s in done], [self.generators[s.req_id] for _, s in done]
        processed = apply_logits_processors(logits, self._logits_rows(done, drafts))
        if spec:  # a step without drafts samples exactly as decoding without speculation does
            token_lists = self.rejection_sampler(processed, drafts, params, generators)
        else:
            token_lists = [[token] for token in sample(processed, params, generators)]
        firsts = list(itertools.accumulate((len(d) + 1 for d in drafts), initial=0))
        output.logprobs = self._sample_logprobs(logits, firsts, done, token_lists)
        for (_, state), tokens in zip(done, token_lists):
            state.token_ids.extend(tokens)
        output.sampled_token_ids = {state.req_id: tokens for (_, state), tokens in zip(done, token_lists)}

    @staticmethod
    def _logits_rows(done, drafts: list[list[int]]) -> list[RowTokens | None]:
        """Per row of _sample's logits, what logit_bias, min_tokens and the penalties need (None: the request
        uses none of them, the common case, which costs one check a request): row t of a request with drafts
        follows its output tokens and its first t drafts."""
        rows: list[RowTokens | None] = []
        for (_, s), d in zip(done, drafts):
            p, num_prompt = s.sampling_params, s.num_prompt_tokens
            if not uses_logits_processors(p, len(s.token_ids) - num_prompt):
                rows += [None] * (len(d) + 1)
                continue
            prompt, output = s.token_ids[:num_prompt], s.token_ids[num_prompt:]
            rows += [RowTokens(p, prompt, output + d[:t], s.eos_token_id) for t in range(len(d) + 1)]
        return rows

    def take_draft_token_ids(self) -> dict[str, list[int]]:
        """The drafts the draft model proposed in the last step, by request id (vLLM's method of this name);
        each call hands them over once."""
        drafts, self._draft_token_ids = self._draft_token_ids, {}
        return drafts

    @staticmethod
    def _sample_logprobs(logits, firsts, done, token_lists) -> dict[str, list[dict[int, Logprob]]]:
        """For the requests that ask: one entry per emitted token, from the row that predicted it (a request's
        rows start at firsts[j] in logits)."""
        picked = [
            (j, firsts[j] + t, token)
            for j, (_, s) in enumerate(done)
            if s.sampling_params.logprobs is not None
            for t, token in enumerate(token_lists[j])
        ]
        if not picked:
            return {}
        entries = compute_logprobs(
            logits[[row for _, row, _ in picked]],
            [token for *_, token in picked],
            [done[j][1].sampling_params.logprobs for j, _, _ in picked],
        )
        out: dict[str, list[dict[int, Logprob]]] = {}
        for (j, _, _), entry in zip(picked, entries):
            out.setdefault(done[j][1].req_id, []).append(entry)
        return out

    def _gather_prompt_logprobs(self, order, num_scheduled, starts, row_logits) -> dict[str, list[dict[int, Logprob]]]:
        """For requests that ask for them: the logprob of each prompt token this step's chunk predicts
        (row p predicts token p + 1); returned for the requests whose prompt this step completes."""
        complete = {}
        for i, req_id in enumerate(order):
            state = self.requests[req_id]
            if state.sampling_params.prompt_logprobs is None:
                continue
            # This step's chunk: execute_model has just advanced num_computed_tokens past it.
            start = state.num_computed_tokens - num_scheduled[req_id]
            last = min(state.num_computed_tokens, state.num_prompt_tokens - 1)
            if start < last:
                positions = range(start, last)
                state.prompt_logprobs += compute_logprobs(
                    row_logits([starts[i] + p - start for p in positions]),
                    [state.token_ids[p + 1] for p in positions],
                    [state.sampling_params.prompt_logprobs] * len(positions),
                )
            if start < state.num_prompt_tokens <= state.num_computed_tokens:
                complete[req_id] = state.prompt_logprobs
        return complete


def num_common_prefix_blocks(tables: list[list[int]]) -> int:
    """How many leading block ids all the given block tables share (0 for fewer than two tables)."""
    if len(tables) < 2:
        return 0
    n = 0
    for column in zip(*tables):
        if 0 in column or any(b != column[0] for b in column):
            break
        n += 1
    return n
