"""One engine step as the model runner sees it (chapter 02): the SchedulerOutput it receives, the request states
and block-table rows _update_states leaves, and the inputs _prepare_inputs builds, decodes first."""

from __future__ import annotations

from nanoengine.core.sched.output import SchedulerOutput


class _LastOutput:
    """An engine StepObserver that keeps the step's SchedulerOutput."""

    so: SchedulerOutput | None = None

    def on_schedule(self, scheduler, so, running_before) -> None:
        self.so = so

    def on_step(self, so, outputs, cache_stats, seconds) -> None:
        pass


def runner_step(engine) -> str:
    """Run one engine step and describe, in the runner's own names, what went in and what it built."""
    observer = _LastOutput()
    engine.observers.append(observer)
    try:
        engine.step()
    finally:
        engine.observers.remove(observer)
    so, runner = observer.so, engine.runner
    cached = so.scheduled_cached_reqs
    lines = ["SchedulerOutput, what the scheduler sends:"]
    lines += [
        f"  new request {d.req_id}: {len(d.prompt_token_ids)} prompt tokens, {d.num_computed_tokens} computed "
        f"(prefix hits), block ids per group {d.block_ids}"
        for d in so.scheduled_new_reqs
    ]
    lines += [
        f"  cached request {r}: {n} computed, new block ids per group {ids}"
        for r, ids, n in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens)
    ]
    lines.append(f"  num_scheduled_tokens {so.num_scheduled_tokens}")
    lines.append("_update_states: the runner's CachedRequestState per request, and its block-table row per group:")
    for req_id in so.num_scheduled_tokens:
        state = runner.requests[req_id]
        rows = [table.get_block_tables([req_id])[0] for table in runner.input_block_table]
        lines.append(
            f"  {req_id}: {len(state.token_ids)} tokens, {state.num_computed_tokens} computed after this step; "
            f"rows {rows}"
        )
    metadata = runner.kv_cache.group_metadata
    lines.append(
        f"_prepare_inputs, decodes first: order {runner.batch_order(so.num_scheduled_tokens)}, "
        f"query_start_loc {metadata[0].query_start_loc.tolist()}, seq_lens {metadata[0].seq_lens.tolist()}, "
        f"num_decodes {metadata[0].num_decodes}"
    )
    windows = [group.sliding_window for group in runner.kv_cache.groups]
    lines += [
        f"  group {g} ({f'window {w}' if w else 'full attention'}) slot_mapping {md.slot_mapping.tolist()}"
        for g, (md, w) in enumerate(zip(metadata, windows))
    ]
    return "\n".join(lines)
