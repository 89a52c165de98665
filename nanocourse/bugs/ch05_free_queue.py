"""Seeded bugs for chapter 05: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch05_free_queue.py, its replacement)
    (
        "05.1",
        "the blocks linked in reverse",
        "        self.num_free_blocks = 0\n        self.append_n(blocks)",
        "        self.num_free_blocks = 0\n        self.prepend_n(list(reversed(blocks)))",
    ),
    (
        "05.1",
        "the walk starts at the head sentinel",
        "        blocks, block = [], self.fake_free_list_head.next_free_block",
        "        blocks, block = [], self.fake_free_list_head",
    ),
    (
        "05.2",
        "popleft_n pops from the tail",
        "            block = self.fake_free_list_head.next_free_block",
        "            block = self.fake_free_list_tail.prev_free_block",
    ),
    (
        "05.2",
        "append_n reverses the blocks",
        "self._splice(blocks, self.fake_free_list_tail.prev_free_block)",
        "self._splice(list(reversed(blocks)), self.fake_free_list_tail.prev_free_block)",
    ),
    (
        "05.2",
        "popleft_n hands out sentinels when asked for too many",
        "if not 0 <= n <= self.num_free_blocks:",
        "if n < 0:",
    ),
    (
        "05.3",
        "remove leaves the block's links set",
        "        block.prev_free_block = block.next_free_block = None\n",
        "",
    ),
    ("05.3", "remove forgets the count", "        self.num_free_blocks -= 1\n", ""),
    (
        "05.4",
        "prepend_n puts the blocks at the tail",
        "self._splice(blocks, self.fake_free_list_head)",
        "self._splice(blocks, self.fake_free_list_tail.prev_free_block)",
    ),
    (
        "05.4",
        "prepend_n reverses the blocks",
        "self._splice(blocks, self.fake_free_list_head)",
        "self._splice(list(reversed(blocks)), self.fake_free_list_head)",
    ),
    (
        "05.5",
        "popleft_n pops from the tail",
        "            block = self.fake_free_list_head.next_free_block",
        "            block = self.fake_free_list_tail.prev_free_block",
    ),
    (
        "05.5",
        "append_n reverses the blocks",
        "self._splice(blocks, self.fake_free_list_tail.prev_free_block)",
        "self._splice(list(reversed(blocks)), self.fake_free_list_tail.prev_free_block)",
    ),
    (
        "05.6",
        "remove leaves the block's links set",
        "        block.prev_free_block = block.next_free_block = None\n",
        "",
    ),
    (
        "05.6",
        "popleft_n hands out sentinels when asked for too many",
        "if not 0 <= n <= self.num_free_blocks:",
        "if n < 0:",
    ),
    (
        "05.6",
        "popleft_n takes a negative count as none",
        "if not 0 <= n <= self.num_free_blocks:",
        "if not n <= self.num_free_blocks:",
    ),
    (
        "05.6",
        "popleft_n pops what there is before it finds too few",
        '        if not 0 <= n <= self.num_free_blocks:\n            raise ValueError(f"cannot pop {n} blocks from a queue of {self.num_free_blocks}")\n        taken = []\n        for _ in range(n):\n            block = self.fake_free_list_head.next_free_block\n',
        '        taken = []\n        for _ in range(n):\n            block = self.fake_free_list_head.next_free_block\n            if block is self.fake_free_list_tail:\n                raise ValueError("too few free blocks")\n',
    ),
    (
        "05.6",
        "append_n reverses the blocks",
        "self._splice(blocks, self.fake_free_list_tail.prev_free_block)",
        "self._splice(list(reversed(blocks)), self.fake_free_list_tail.prev_free_block)",
    ),
]
