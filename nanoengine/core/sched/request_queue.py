"""The waiting queue, one class per scheduling policy (vllm/v1/core/sched/request_queue.py).

The scheduler asks the queue which request comes next and never asks which policy is in force,
so any scheduler written against RequestQueue serves both policies.

vLLM's RequestQueue is an abstract base class that also has prepend_requests and remove_requests;
vLLM 0.33 has the same two policies (SchedulingPolicy.FCFS and PRIORITY). Its priority heap holds the
Requests themselves, ordered by Request.__lt__ on (priority, arrival_time, request_id). Here the heap
holds tuples, so Request needs no ordering of its own, and the request id breaks exact ties too.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Protocol

from nanoengine.request import Request


class SchedulingPolicy(enum.Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"


class RequestQueue(Protocol):
    """Waiting requests in the order they should be admitted.

    prepend_request puts a preempted request back: at the front under FCFS (it keeps its turn),
    at its (priority, arrival) place under PRIORITY, where the order is the key and not the history.
    """

    def add_request(self, request: Request) -> None: ...
    def pop_request(self) -> Request: ...
    def peek_request(self) -> Request: ...
    def prepend_request(self, request: Request) -> None: ...
    def remove_request(self, request: Request) -> None: ...
    # Truthiness falls back to __len__, so a queue needs no __bool__ of its own (deque has none).
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Request]: ...
    def __contains__(self, request: object) -> bool: ...


class FCFSRequestQueue(deque[Request]):
    """First come, first served: a deque, oldest at the left."""

    def add_request(self, request: Request) -> None:
        self.append(request)

    def pop_request(self) -> Request:
        return self.popleft()

    def peek_request(self) -> Request:
        if not self:
            raise IndexError("peek_request on an empty queue")
        return self[0]

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def remove_request(self, request: Request) -> None:
        self.remove(request)


class PriorityRequestQueue:
    """Lowest priority value first, then earliest arrival: a heap of (priority, arrival, id, request).

    The request id breaks exact ties, so requests themselves are never compared. Iteration yields
    the requests in the order they would pop.
    """

    __slots__ = ("_heap",)

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._heap: list[tuple[int, float, str, Request]] = []
        for request in requests:
            self.add_request(request)

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, request.request_id, request))

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek_request on an empty queue")
        return self._heap[0][-1]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def remove_request(self, request: Request) -> None:
        self._heap = [entry for entry in self._heap if entry[-1] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap, key=lambda e: e[:3]))

    def __contains__(self, request: object) -> bool:
        return any(entry[-1] is request for entry in self._heap)


def create_request_queue(policy: SchedulingPolicy | str) -> RequestQueue:
    policy = SchedulingPolicy(policy)
    return FCFSRequestQueue() if policy is SchedulingPolicy.FCFS else PriorityRequestQueue()
