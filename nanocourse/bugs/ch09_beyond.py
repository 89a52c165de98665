"""Seeded bugs for chapter 09: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch09_beyond.py, its replacement)
    (
        "09.1",
        "counts every equal position, not only the leading run",
        "return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))",
        "return sum(x == y for x, y in zip(a, b))",
    ),
    (
        "09.1",
        "a full match counted as the longer length",
        "return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))",
        "return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), max(len(a), len(b)))",
    ),
    (
        "09.1",
        "walks a's length only, reading past the end of a shorter b",
        "return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))",
        "return next((i for i in range(len(a)) if a[i] != b[i]), len(a))",
    ),
    (
        "09.1",
        "os.path.commonprefix, which cannot order a tuple against a list",
        "return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))",
        "import os; return len(os.path.commonprefix([a, b]))",
    ),
    (
        "09.2",
        "the match goes on past a partial edge",
        "            if shared < len(edge):\n                break\n",
        "",
    ),
    (
        "09.2",
        "a partial edge counts as a whole one",
        "            pos += shared\n            if shared < len(edge):",
        "            pos += len(edge) if shared else 0\n            if shared < len(edge):",
    ),
    (
        "09.2",
        "a match that stops inside an edge counts only that edge's tokens, not those above it",
        "            if shared < len(edge):\n                break\n",
        "            if shared < len(edge):\n                return shared\n",
    ),
    (
        "09.2b",
        "no split: a diverging insert overwrites the shared edge",
        (
            "            if shared < len(edge):  # split: the shared part, then the old rest below it\n"
            "                child = {edge[shared]: (edge[shared:], child)}\n                node[tokens[pos]] = (edge[:shared], child)\n"
        ),
        (
            "            if shared < len(edge):\n                node[tokens[pos]] = (tokens[pos:], {})\n"
            "                self.num_tokens += len(tokens) - pos - shared\n                return len(tokens) - pos - shared\n"
        ),
    ),
    (
        "09.2b",
        "stored tokens counted per insert, shared ones again",
        "                self.num_tokens += len(tokens) - pos\n",
        "                self.num_tokens += len(tokens)\n",
    ),
    (
        "09.2b",
        "a split drops the subtree below the edge it cuts",
        "                child = {edge[shared]: (edge[shared:], child)}\n",
        "                child = {edge[shared]: (edge[shared:], {})}\n",
    ),
    (
        "09.2c",
        "a split drops the subtree below the edge it cuts",
        "                child = {edge[shared]: (edge[shared:], child)}\n",
        "                child = {edge[shared]: (edge[shared:], {})}\n",
    ),
    (
        "09.2c",
        "a match that stops inside an edge counts only that edge's tokens, not those above it",
        "            if shared < len(edge):\n                break\n",
        "            if shared < len(edge):\n                return shared\n",
    ),
    (
        "09.3",
        "no cap on the protected segment",
        "        while len(protected) > protected_cap:\n",
        "        while False:\n",
    ),
    (
        "09.3",
        "demoted blocks go to the head of probation",
        "            probation.append(protected.popleft())",
        "            probation.appendleft(protected.popleft())",
    ),
    (
        "09.4",
        "the most loaded replica wins ties",
        "key=lambda r: (-matches[r], loads[r], r)",
        "key=lambda r: (-matches[r], -loads[r], r)",
    ),
    (
        "09.4",
        "any cached block counts, not the leading run",
        "        while n < len(request_hashes) and request_hashes[n] in held:\n            n += 1\n",
        "        n = sum(h in held for h in request_hashes)\n",
    ),
    (
        "09.4",
        "the least load among the best matches, looked up among all replicas",
        "return min(range(len(matches)), key=lambda r: (-matches[r], loads[r], r))",
        "return loads.index(min(loads[r] for r in range(len(matches)) if matches[r] == max(matches)))",
    ),
    (
        "09.5",
        "removals ignored",
        (
            "                counts[block_hash] = counts.get(block_hash, 0) - 1\n                if counts[block_hash] <= 0:\n"
            "                    del counts[block_hash]\n"
        ),
        "                pass\n",
    ),
    ("09.5", "a clear is ignored", "            counts.clear()\n", "            pass\n"),
    (
        "09.5",
        "a removal of a hash the index never held raises KeyError",
        "                counts[block_hash] = counts.get(block_hash, 0) - 1\n",
        "                counts[block_hash] -= 1\n",
    ),
    (
        "09.5",
        "a removal of a hash the index never held leaves a count of -1",
        "                if counts[block_hash] <= 0:\n",
        "                if counts[block_hash] == 0:\n",
    ),
]
