"""What the model runner hands back after a step (vllm/v1/outputs.py): the runner's output, which the scheduler
reads; the user-facing outputs are in nanoengine/outputs.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from nanoengine.outputs import Logprob


@dataclass(slots=True)
class ModelRunnerOutput:
    """What one forward pass produced (vllm/v1/outputs.py), which the engine hands to
    Scheduler.update_from_output and then reads the logprobs from.

    sampled_token_ids: the tokens sampled for each request whose scheduled tokens reached its end (a prompt
    chunk that is not the last samples nothing): one token, or after k draft tokens the accepted drafts and
    one more (1 to k + 1), which the scheduler appends until a stop condition. vLLM's shape, a list per
    request, keyed here by request id where vLLM keeps req_ids beside the lists.
    logprobs: for those of them that asked, per sampled token the token's and the top-k logprobs.
    prompt_logprobs_dict: for a request that asked, every prompt token's, once its prompt is complete.
    Invariant: logprobs' and prompt_logprobs_dict's keys are keys of sampled_token_ids, and
    len(logprobs[r]) == len(sampled_token_ids[r]).
    """

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[dict[int, Logprob]]] = field(default_factory=dict)
    prompt_logprobs_dict: dict[str, list[dict[int, Logprob]]] = field(default_factory=dict)
