"""EAGLE drafts (vllm/v1/spec_decode/eagle.py's EagleProposer, EAGLE-1): a draft head reads the target's hidden
states (model/llama_eagle.py).

The head's input at position p is the target's hidden state at p with the token at p + 1, so its first pass over
a step covers the positions the step verified, each with the token after it; the last of them carries the new
token, and its output gives the first draft. Each later pass feeds a draft at the next position with the head's
own output in place of a hidden state.

A position's head KV thus depends on the token after it. A prefix-cache hit may end where another request went
on with another token, so with EAGLE the hit search drops the last hit block and the target computes it again,
the head rebuilding its KV there with this request's next token (use_eagle in the KV cache coordinator; vLLM's
SpeculativeConfig.needs_eagle_block_drop; by default vLLM 0.33 hashes each block with the token after it instead,
num_hash_lookahead_tokens, and drops nothing).
"""

from __future__ import annotations

import torch

from nanoengine.spec_decode.draft_model import DraftModelProposer, DraftRequest


class EagleProposer(DraftModelProposer):
    """A DraftModelProposer whose model is an EAGLE head: the same passes and KV in the target's blocks, each
    first-pass position shifted to the token after it and fed the target's hidden state there.

    Invariant: every position whose target KV a step verifies gets the head's KV in that step, built from the
    target's hidden state there and the request's next token. The target's CUDA graphs stay off, since their
    replays give logits, not hidden states (vLLM captures the hidden states too).
    """

    reads_hidden_states = True

    def first_pass(self, r: DraftRequest) -> tuple[list[int], range | None, int]:
        """The positions the step verified, each with the token after it: through the new token when sampled,
        else through the first token of the prompt's next chunk. Drafts: pass j writes KV at the new token's
        position + j - 1, so one lookahead slot fewer than a draft model's is needed."""
        end = len(r.token_ids) if r.sampled else r.start + r.num_scheduled + 1
        tokens = r.token_ids[r.start + 1 : end]
        num = min(self.k, r.num_left, self.max_model_len - end, r.num_slots - end + 2) if r.sampled else 0
        return tokens, range(r.row, r.row + len(tokens)), num

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor | None):
        return self.model(input_ids, positions, hidden_states, self.kv_cache)
