"""A request as the scheduler and the KV cache manager see it (vllm/v1/request.py)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nanoengine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from nanoengine.core.kv_cache_utils import BlockHash

# Hashes the request's full blocks that block_hashes does not cover yet and returns their hashes, in order
# (kv_cache_utils.get_request_block_hasher builds one).
BlockHasher = Callable[["Request"], list["BlockHash"]]


class RequestStatus(enum.IntEnum):
    """Ordered so that every finished status compares above PREEMPTED."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


@dataclass(slots=True, eq=False)
class Request:
    """Token ids, progress counters and the block hashes of one request.

    block_hashes always holds one hash per full block of all_token_ids when a
    block hasher is set; append tokens only through append_output_token_ids
    so that the hashes keep up.

    spec_token_ids: draft tokens proposed for the next step (speculative decoding), not yet verified. They
    are never part of all_token_ids, num_tokens or block_hashes; num_tokens_with_spec counts them too.
    """

    request_id: str
    prompt_token_ids: list[int]
    # How to sample and when to stop; the scheduler reads max_tokens and ignore_eos from it. The default is
    # SamplingParams(), as vLLM's LLM.generate defaults it.
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    eos_token_id: int | None = None
    block_hasher: BlockHasher | None = field(default=None, repr=False)
    cache_salt: str | None = None
    lora_name: str | None = None
    priority: int = 0
    arrival_time: float = field(default_factory=time.time)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    # -1 until the scheduler records the prefix-cache hit at admission.
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    output_token_ids: list[int] = field(default_factory=list, init=False)
    block_hashes: list[BlockHash] = field(default_factory=list, init=False, repr=False)
    spec_token_ids: list[int] = field(default_factory=list, init=False)
    # Whether the last step scheduled for it stopped short of its num_tokens (a prompt chunk that is not the
    # last): set with num_computed_tokens when a step is scheduled, as vLLM's Request.is_prefill_chunk is.
    is_prefill_chunk: bool = field(default=False, init=False)
    # Where a prefix that some attention type had cached past this request's hit ends (0: none), set at each
    # prefix-cache lookup (KVCacheManager.get_computed_blocks), as vLLM's scheduler sets Request.shared_prefix_boundary:
    # sparse sliding groups keep the blocks that end there, so later requests sharing the prefix hit it whole.
    shared_prefix_boundary: int = field(default=0, init=False)
    # Async scheduling (vLLM 0.33's Request fields of these names). num_in_flight_tokens: tokens of scheduled
    # steps whose output is not processed yet; num_computed_tokens counts them already. num_output_placeholders:
    # the tokens those steps will sample, counted by the AsyncScheduler as if sampled, so the next step can be
    # scheduled before they are known. num_stale_output_tokens: the in-flight share of a preempted request,
    # whose output is still appended on return but must not move its reset counters.
    num_in_flight_tokens: int = field(default=0, init=False)
    num_output_placeholders: int = field(default=0, init=False)
    num_stale_output_tokens: int = field(default=0, init=False)
    _all_token_ids: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self._all_token_ids = self.prompt_token_ids.copy()
        self._hash_new_full_blocks()

    def attach_block_hasher(self, block_hasher: BlockHasher) -> None:
        """Set the hasher after construction and rehash every full block."""
        self.block_hasher = block_hasher
        self.block_hashes = []
        self._hash_new_full_blocks()

    def _hash_new_full_blocks(self) -> None:
        if self.block_hasher is not None:
            self.block_hashes.extend(self.block_hasher(self))

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output tokens. Read-only: do not mutate the list."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """Prompt logprobs need every prompt position's logits, which a prefix-cache hit would skip."""
        return self.sampling_params.prompt_logprobs is not None

    @property
    def stop_reason(self) -> int | None:
        """The stop token that finished the request (vLLM's Request.stop_reason): its last token, when
        Scheduler.check_stop stopped it on one of stop_token_ids rather than on EOS (which it checks first);
        None otherwise. A stop string's stop_reason is the engine's, which matches text."""
        if self.status != RequestStatus.FINISHED_STOPPED or not self.output_token_ids:
            return None
        last, params = self.output_token_ids[-1], self.sampling_params
        stopped_on_eos = last == self.eos_token_id and not params.ignore_eos
        return last if last in params.stop_token_ids and not stopped_on_eos else None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = (token_ids,)
        self.output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        self._hash_new_full_blocks()
