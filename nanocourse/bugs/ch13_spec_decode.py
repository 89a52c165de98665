"""Seeded bugs for chapter 13: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch13_spec_decode.py, its replacement)
    (
        "13.3",
        "the rejected draft not removed from the distribution the recovered token is drawn from",
        "        probs[draft] = 0.0\n",
        "",
    ),
    (
        "13.3",
        "acceptance against the raw softmax, before temperature, top-k and top-p",
        "if float(torch.rand((), generator=gen)) < float(probs[draft]):",
        "if float(torch.rand((), generator=gen)) < float(rows[i].softmax(-1)[draft]):",
    ),
    (
        "13.3",
        "the bonus token drawn from the last draft's row, not the row after it",
        "rows[len(drafts)]",
        "rows[max(len(drafts) - 1, 0)]",
    ),
    (
        "13.3",
        "accepted with probability 1 - p(draft)",
        "if float(torch.rand((), generator=gen)) < float(probs[draft]):",
        "if float(torch.rand((), generator=gen)) >= float(probs[draft]) and float(probs[draft]) > 0:",
    ),
    (
        "13.3",
        "u drawn from torch's global generator, not the request's",
        "if float(torch.rand((), generator=gen)) < float(probs[draft]):",
        "if float(torch.rand(())) < float(probs[draft]):",
    ),
    (
        "13.3",
        "one u per request, reused for every draft",
        (
            "    for i, draft in enumerate(drafts):\n        probs = target_probs(rows[i], params)\n"
            "        if float(torch.rand((), generator=gen)) < float(probs[draft]):"
        ),
        (
            "    u = float(torch.rand((), generator=gen))\n    for i, draft in enumerate(drafts):\n"
            "        probs = target_probs(rows[i], params)\n        if u < float(probs[draft]):"
        ),
    ),
    (
        "13.4",
        "the drafts not cut to the tokens scheduled",
        "verified[req_id] = request.spec_token_ids[:num_spec]",
        "verified[req_id] = list(request.spec_token_ids)",
    ),
    ("13.4", "spec_token_ids not cleared", "            request.spec_token_ids = []\n", ""),
    (
        "13.4",
        "the verified list is the request's own spec_token_ids, then emptied in place",
        "                verified[req_id] = request.spec_token_ids[:num_spec]\n            request.spec_token_ids = []\n",
        (
            "                del request.spec_token_ids[num_spec:]\n                verified[req_id] = request.spec_token_ids\n"
            "            request.spec_token_ids.clear()\n"
        ),
    ),
    (
        "13.4",
        "spec_token_ids cleared only for the requests that verify some drafts",
        "                verified[req_id] = request.spec_token_ids[:num_spec]\n            request.spec_token_ids = []\n",
        "                verified[req_id] = request.spec_token_ids[:num_spec]\n                request.spec_token_ids = []\n",
    ),
    (
        "13.4",
        "a prompt chunk verifies drafts too (every scheduled token but one taken for a draft)",
        "num_spec = num_new + request.num_computed_tokens - request.num_tokens",
        "num_spec = num_new - 1",
    ),
    (
        "13.5",
        "no rollback: the rejected drafts' slots kept as computed",
        "            request.num_computed_tokens -= num_rejected\n",
        "            pass\n",
    ),
    (
        "13.5",
        "the rollback off by one (the recovered token counted as a rejected draft)",
        "num_rejected = len(spec_token_ids) - (len(new_token_ids) - 1)",
        "num_rejected = len(spec_token_ids) - len(new_token_ids)",
    ),
    (
        "13.5",
        "a stop mid-run not trimming: the stop checked after the last token only",
        "            if status is not None:\n",
        "            if status is not None and num_new == len(new_token_ids):\n",
    ),
    (
        "13.5",
        "the tokens dropped at a stop left counted as computed",
        "                request.num_computed_tokens -= len(new_token_ids) - num_new\n",
        "",
    ),
    (
        "13.6",
        "no rollback: the rejected drafts' slots kept as computed",
        "            request.num_computed_tokens -= num_rejected\n",
        "            pass\n",
    ),
    (
        "13.6",
        "the drafts not cut to the tokens scheduled",
        "verified[req_id] = request.spec_token_ids[:num_spec]",
        "verified[req_id] = list(request.spec_token_ids)",
    ),
    (
        "13.6",
        "spec_token_ids cleared only for the requests that verify some drafts",
        "                verified[req_id] = request.spec_token_ids[:num_spec]\n            request.spec_token_ids = []\n",
        "                verified[req_id] = request.spec_token_ids[:num_spec]\n                request.spec_token_ids = []\n",
    ),
    (
        "13.6",
        "the tokens dropped at a stop left counted as computed",
        "                request.num_computed_tokens -= len(new_token_ids) - num_new\n",
        "",
    ),
    (
        "13.6",
        "the rollback off by one (the recovered token counted as a rejected draft)",
        "num_rejected = len(spec_token_ids) - (len(new_token_ids) - 1)",
        "num_rejected = len(spec_token_ids) - len(new_token_ids)",
    ),
    (
        "13.7",
        "never shrinking: a rejection keeps k where it was",
        "            return accepted\n",
        "            return proposed\n",
    ),
    (
        "13.7",
        "no probe at k = 0: a request whose drafts failed once never proposes again",
        "return 1 if len(history) % 4 == 0 else 0",
        "return 0",
    ),
    (
        "13.7",
        "a fixed k: vLLM's rule, k = 2 at every step",
        "        proposed, accepted = history[-1]\n",
        "        return 2\n",
    ),
]
