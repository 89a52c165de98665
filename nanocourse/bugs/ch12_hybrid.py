"""Seeded bugs for chapter 12: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch12_hybrid.py, its replacement)
    (
        "12.1",
        "the window off by one: the query's own token not counted",
        "return max(num_computed_tokens - self.sliding_window + 1, 0)",
        "return max(num_computed_tokens - self.sliding_window, 0)",
    ),
    (
        "12.1",
        "a negative count early in the request",
        "return max(num_computed_tokens - self.sliding_window + 1, 0)",
        "return num_computed_tokens - self.sliding_window + 1",
    ),
    (
        "12.2",
        "frees a block still inside the window (rounds the skipped blocks up)",
        "last = min(self.get_num_skipped_tokens(num_computed_tokens) // self.block_size, len(blocks)) - 1",
        "last = min(-(-self.get_num_skipped_tokens(num_computed_tokens) // self.block_size), len(blocks)) - 1",
    ),
    (
        "12.2",
        "the skipped count not capped at the blocks the request holds",
        "last = min(self.get_num_skipped_tokens(num_computed_tokens) // self.block_size, len(blocks)) - 1",
        "last = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size - 1",
    ),
    ("12.2", "frees the blocks but leaves them in the table", "            blocks[last] = self.null_block\n", ""),
    (
        "12.3",
        "the hit searched from the left, as for full attention",
        "for i in reversed(range(num_blocks)):",
        "for i in range(num_blocks):",
    ),
    (
        "12.3",
        "a whole window of cached blocks asked for, not W - 1 tokens",
        "needed = (self.sliding_window - 1 + self.block_size - 1) // self.block_size",
        "needed = (self.sliding_window + self.block_size - 1) // self.block_size",
    ),
    (
        "12.3",
        "a short run from block 0 not taken",
        "if cached and (run >= needed or i == 0):",
        "if cached and run >= needed:",
    ),
    (
        "12.3",
        "a run checked on a miss too: at W = 1 a hit of null blocks",
        "if cached and (run >= needed or i == 0):",
        "if run >= needed or (i == 0 and run):",
    ),
    (
        "12.2",
        "each skipped block released on its own, block 0 first (right for unhashed blocks, wrong for cached ones)",
        "        self.block_pool.free_blocks(freed)\n",
        "        for block in reversed(freed):\n            self.block_pool.free_blocks([block])\n",
    ),
    (
        "12.2",
        "the skipped blocks freed first to last",
        "self.block_pool.free_blocks(freed)",
        "self.block_pool.free_blocks(reversed(freed))",
    ),
    (
        "12.2",
        "a request with no entry gets an empty one",
        "        blocks = self.req_to_blocks.get(request_id, [])\n",
        "        blocks = self.req_to_blocks.setdefault(request_id, [])\n",
    ),
    (
        "12.5",
        "the skipped blocks freed first to last",
        "self.block_pool.free_blocks(freed)",
        "self.block_pool.free_blocks(reversed(freed))",
    ),
    (
        "12.5",
        "a run checked on a miss too: at W = 1 a hit of null blocks",
        "if cached and (run >= needed or i == 0):",
        "if run >= needed or (i == 0 and run):",
    ),
    ("12.5", "EAGLE's extra block not asked for", " + int(self.use_eagle)", ""),
    (
        "12.5",
        "EAGLE's last hit block kept",
        "            if self.use_eagle and end:\n                blocks.pop()\n",
        "",
    ),
    (
        "12.4",
        "frees a block a query still sees (the window off by one the other way)",
        "return max(num_computed_tokens - self.sliding_window + 1, 0)",
        "return max(num_computed_tokens - self.sliding_window + 2, 0)",
    ),
    (
        "12.4",
        "never frees anything: the table grows with the request",
        "        blocks = self.req_to_blocks.get(request_id, [])\n",
        "        blocks = []\n",
    ),
]
