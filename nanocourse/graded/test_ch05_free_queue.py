"""Chapter 05 graded tasks: the free-block queue. Run with `make grade CH=05`."""

import functools
import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanocourse.differential import Story, within
from nanoengine.core import FreeKVCacheBlockQueue, KVCacheBlock

CHAPTER = "ch05_free_queue"
NANOENGINE = {"FreeKVCacheBlockQueue": FreeKVCacheBlockQueue}


def make(impl, n):
    blocks = [KVCacheBlock(block_id=i) for i in range(n)]
    return impl.FreeKVCacheBlockQueue(blocks), blocks


def walk(queue):
    """queue.get_all_free_blocks(), stopped after a second: links that form a cycle would make the walk
    run, and its list grow, until memory runs out."""
    return within(1, queue.get_all_free_blocks, "your get_all_free_blocks (do your links form a cycle?)")


def ids(queue):
    return [b.block_id for b in walk(queue)]


def block_ids(blocks):
    """The block ids of a list of blocks, for a failure message (anything that is not a list of blocks as it is)."""
    try:
        return [getattr(b, "block_id", b) for b in blocks]
    except TypeError:
        return blocks


def assert_linked(queue, blocks):
    """The queue's order, its count and every block's two links tell the same story."""
    inside = walk(queue)
    assert queue.num_free_blocks == len(inside), "num_free_blocks must match the blocks in the list"
    for left, right in itertools.pairwise(inside):
        assert left.next_free_block is right and right.prev_free_block is left, "links must agree both ways"
    members = {id(b) for b in inside}
    for b in blocks:
        if id(b) not in members:
            assert b.prev_free_block is None and b.next_free_block is None, (
                f"block {b.block_id} left the queue but kept its links"
            )


@pytest.mark.task("05.1", "__init__ links the blocks in order; get_all_free_blocks walks head to tail")
def test_init_and_walk(impl):
    queue, blocks = make(impl, 5)
    walked = walk(queue)
    assert walked == blocks and queue.num_free_blocks == 5, (
        f"a new queue of blocks 0..4 must walk head to tail as [0, 1, 2, 3, 4], sentinels excluded, with "
        f"num_free_blocks 5; got {block_ids(walked)} and num_free_blocks {queue.num_free_blocks}"
    )
    assert blocks[1].prev_free_block is blocks[0] and blocks[1].next_free_block is blocks[2], (
        "the links live in the blocks themselves (prev_free_block / next_free_block)"
    )
    assert blocks[0].prev_free_block is not None and blocks[4].next_free_block is not None, (
        "the end blocks link to sentinels, not to None"
    )
    empty, _ = make(impl, 0)
    walked = walk(empty)
    assert walked == [] and empty.num_free_blocks == 0, (
        f"a queue of no blocks (head sentinel linked straight to the tail sentinel) must walk as [] with "
        f"num_free_blocks 0; got {block_ids(walked)} and num_free_blocks {empty.num_free_blocks}"
    )
    head, tail = (getattr(empty, name, None) for name in ("fake_free_list_head", "fake_free_list_tail"))
    assert head is not None and tail is not None and head.next_free_block is tail and tail.prev_free_block is head, (
        "the sentinels are self.fake_free_list_head and self.fake_free_list_tail (vLLM's names, which chapter 05's "
        "diagram follows), linked straight to each other in an empty queue"
    )


@pytest.mark.task("05.2", "popleft, popleft_n, append and append_n: FIFO order, popped blocks unlinked")
def test_pop_and_append(impl):
    queue, blocks = make(impl, 6)
    got = queue.popleft()
    assert got is blocks[0], (
        f"popleft() on a new queue of blocks 0..5 must return the head, block 0; "
        f"got block {getattr(got, 'block_id', got)}"
    )
    got = queue.popleft_n(2)
    assert got == blocks[1:3], f"then popleft_n(2) must return blocks [1, 2], head first; got {block_ids(got)}"
    got = queue.popleft_n(0)
    assert got == [], f"popleft_n(0) must return [] and take nothing; got {block_ids(got)}"
    assert ids(queue) == [3, 4, 5], f"after popping blocks 0, 1 and 2 the queue must be [3, 4, 5]; got {ids(queue)}"
    queue.append(blocks[1])
    queue.append_n([blocks[0], blocks[2]])
    assert ids(queue) == [3, 4, 5, 1, 0, 2], (
        f"append(block 1), then append_n([block 0, block 2]) on [3, 4, 5] must give [3, 4, 5, 1, 0, 2]: both add at "
        f"the tail, keeping the given order; got {ids(queue)}"
    )
    got = queue.popleft_n(6)
    assert got == [blocks[i] for i in (3, 4, 5, 1, 0, 2)], (
        f"popleft_n(6) on [3, 4, 5, 1, 0, 2] must return all six blocks, head first, in that order; "
        f"got {block_ids(got)}"
    )
    assert_linked(queue, blocks)
    with pytest.raises(ValueError):
        queue.popleft()  # an empty queue must refuse, not hand out its tail sentinel


@pytest.mark.task("05.3", "remove unlinks a block at the head, in the middle or at the tail, in O(1)")
def test_remove(impl):
    for index in (0, 3, 5):
        queue, blocks = make(impl, 6)
        queue.remove(blocks[index])
        assert ids(queue) == [i for i in range(6) if i != index], f"remove(block {index})"
        assert_linked(queue, blocks)
    queue, blocks = make(impl, 1)
    queue.remove(blocks[0])
    assert ids(queue) == [] and queue.num_free_blocks == 0, (
        f"remove(block 0) on a one-block queue must leave it empty: walk [] and num_free_blocks 0; got "
        f"{ids(queue)} and num_free_blocks {queue.num_free_blocks}"
    )
    queue.append(blocks[0])
    assert ids(queue) == [0], "a removed block can come back"

    # 2,000 removes in a 200,000-block queue: a constant-time remove takes about a millisecond; one that
    # searches the list for the block (list.remove, deque.remove, a walk) takes seconds.
    queue, blocks = make(impl, 200_000)
    middle = blocks[50_000:150_000:50]
    start = time.perf_counter()
    for block in middle:
        queue.remove(block)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.25, f"2,000 removes took {elapsed:.2f} s: remove must relink neighbours, not search"
    assert queue.num_free_blocks == 198_000, (
        f"2,000 removes from a 200,000-block queue must leave num_free_blocks "
        f"at 198,000 (remove counts the block out); got {queue.num_free_blocks}"
    )


@pytest.mark.task("05.4", "prepend_n puts blocks at the head in their given order")
def test_prepend_n(impl):
    queue, blocks = make(impl, 6)
    taken = queue.popleft_n(4)
    queue.prepend_n([taken[3], taken[1]])
    queue.prepend_n([])
    queue.append_n([])
    assert ids(queue) == [3, 1, 4, 5], (
        f"prepend_n([block 3, block 1]) on [4, 5] must give [3, 1, 4, 5]: the blocks go to the head in their given "
        f"order, and prepend_n([]) and append_n([]) change nothing; got {ids(queue)}"
    )
    queue.prepend_n([taken[0]])
    assert queue.popleft() is blocks[0], "prepended blocks are handed out first"
    assert_linked(queue, blocks)


def finish(llm, prompt, params, max_steps=50):
    """Run one prompt to completion, or fail after max_steps: a broken queue can stall the scheduler."""
    llm.engine.add_request(llm.tokenizer.encode(prompt), params)
    for _ in range(max_steps):
        if done := llm.engine.step():
            return done[0]
    pytest.fail(f"the engine finished no request in {max_steps} steps: is a block handed out twice, or lost?")


class ListQueue:
    """The free queue as a plain Python list: O(n) remove, but plainly right. The engine on this queue is
    the reference the learner's queue is held to (in the nanoengine mode too, so the engine's own queue
    is never checked against itself)."""

    def __init__(self, blocks):
        self.items = list(blocks)

    @property
    def num_free_blocks(self):
        return len(self.items)

    def popleft(self):
        return self.popleft_n(1)[0]

    def popleft_n(self, n):
        if not 0 <= n <= len(self.items):
            raise ValueError(f"cannot pop {n} of {len(self.items)}")
        taken, self.items = self.items[:n], self.items[n:]
        return taken

    def remove(self, block):
        self.items.remove(block)

    def append(self, block):
        self.items.append(block)

    def append_n(self, blocks):
        self.items += blocks

    def prepend_n(self, blocks):
        self.items = list(blocks) + self.items

    def get_all_free_blocks(self):
        return list(self.items)


@pytest.mark.task("05.5", "your queue runs the real engine: same greedy tokens, same prefix-cache hits")
def test_plugs_into_the_engine(impl):
    import torch

    from nanoengine import LLM, SamplingParams

    torch.set_num_threads(1)  # this process only: two threads on a busy 2-core machine run several times slower
    # 12 blocks of 8 tokens: the long prompt evicts cached blocks, and the later chats take the system
    # prompt's blocks back out of the middle of the free queue.
    pool_kwargs = {"num_gpu_blocks_override": 12, "block_size": 8, "progress": False}
    theirs = LLM(free_queue_cls=impl.FreeKVCacheBlockQueue, **pool_kwargs)
    engines = {"a plain list": LLM(free_queue_cls=ListQueue, **pool_kwargs), "yours": theirs}
    system = "You are a patient tutor. Answer in one short sentence."
    prompts = [
        theirs.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}])
        for q in ("What is a KV cache?", "What is a free list?")
    ]
    prompts.insert(1, "Count: " + "one two three four five six seven eight nine ten " * 6)
    prompts.append(prompts[2])
    params = SamplingParams(temperature=0, max_tokens=3)
    runs = {name: [finish(llm, p, params) for p in prompts] for name, llm in engines.items()}
    assert [o.token_ids for o in runs["yours"]] == [o.token_ids for o in runs["a plain list"]], (
        "greedy tokens must not change"
    )
    cached = [o.num_cached_tokens for o in runs["yours"]]
    assert cached == [o.num_cached_tokens for o in runs["a plain list"]], f"prefix-cache hits differ: {cached}"
    assert cached[0] == cached[1] == 0 and cached[2] > 0 and cached[3] > cached[2], (
        "the second chat reuses the system prompt, and its repeat reuses more"
    )
    pool = theirs.engine.kv_cache_manager.block_pool
    free = walk(pool.free_block_queue)
    assert len({b.block_id for b in free}) == len(free) == pool.num_gpu_blocks - 1, "every block is free again, once"


OPS = st.lists(
    st.tuples(
        st.sampled_from(["popleft", "popleft_n", "append", "append_n", "prepend_n", "remove"]),
        st.integers(-1, 4),
        st.randoms(use_true_random=False),
    ),
    max_size=40,
)


def _links(block):
    """A block's two links as block ids (-1: a sentinel, None: no link)."""
    return tuple(None if b is None else b.block_id for b in (block.prev_free_block, block.next_free_block))


def _observe(queue, blocks, result) -> dict:
    return {
        "what the call returned (block ids) or raised": result,
        "the queue, head to tail": [b.block_id for b in walk(queue)],
        "num_free_blocks": queue.num_free_blocks,
        "each block's (prev_free_block, next_free_block) ids, -1 a sentinel": [_links(b) for b in blocks],
    }


def _call(queue, blocks, op, arg):
    """queue.op on the blocks that arg names (an id, a list of ids, or popleft_n's count), as the block ids it
    returned, or the words "raised ValueError"."""
    if op == "popleft":
        args = ()
    elif op == "popleft_n":
        args = (arg,)
    else:
        args = ([blocks[i] for i in arg] if isinstance(arg, list) else blocks[arg],)
    try:
        result = getattr(queue, op)(*args)
    except ValueError:
        return "raised ValueError"
    return block_ids(result) if isinstance(result, list) else getattr(result, "block_id", result)


def _model_view(model, n, result) -> dict:
    """What _observe would show of a correct linked queue holding the list model's blocks."""
    ids = [b.block_id for b in model.items]
    links = {i: (([-1] + ids)[j], (ids + [-1])[j + 1]) for j, i in enumerate(ids)}
    return {
        "what the call returned (block ids) or raised": result,
        "the queue, head to tail": ids,
        "num_free_blocks": len(ids),
        "each block's (prev_free_block, next_free_block) ids, -1 a sentinel": [
            links.get(i, (None, None)) for i in range(n)
        ],
    }


@pytest.mark.task("05.6", "under random operations your queue behaves like a Python list, links and errors included")
@settings(max_examples=300)
@given(n=st.integers(0, 8), ops=OPS)
def test_matches_a_list_model(impl, n, ops):
    """Your queue and the plain list of 05.5 get the same calls, invalid ones included (popleft on an empty
    queue, popleft_n of more blocks than are free, or of -1); after each, what it returned or raised, the order,
    the count and every block's links must be what the list implies."""
    queue, blocks = make(impl, n)
    model_blocks = [KVCacheBlock(block_id=i) for i in range(n)]
    model = ListQueue(model_blocks)
    story = Story(f"a new queue of blocks 0..{n - 1}" if n else "a new empty queue", reference="the list's")
    for op, k, rnd in ops:
        inside = [b.block_id for b in model.items]
        outside = [i for i in range(n) if i not in inside]
        if op in ("append", "remove") and not (outside if op == "append" else inside):
            continue
        if op in ("append", "remove"):
            arg = rnd.choice(outside if op == "append" else inside)
        elif op in ("append_n", "prepend_n"):
            arg = rnd.sample(outside, min(max(k, 0), len(outside)))
        else:
            arg = k if op == "popleft_n" else None
        story.add(f"{op}({'' if arg is None else arg if isinstance(arg, int) else f'blocks {arg}'})")
        expected = _call(model, model_blocks, op, arg)
        got = within(2, functools.partial(_call, queue, blocks, op, arg), f"your {op}")
        story.compare(_observe(queue, blocks, got), _model_view(model, n, expected))
