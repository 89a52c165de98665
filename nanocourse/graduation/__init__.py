"""Graduation (issue 45): vLLM 0.33.0's own v1 core classes, loaded from its wheel on a CPU, driven side by side
with nanoengine's parts (the engine's, the worked solutions' or the learner's) on random workloads.

    wheel.py            fetch the wheel once into the course's cache (pip download; offline: WheelError)
    loader.py           execute the real files from the zip under their `vllm.` names, then leave sys.modules
    standins.py         the project's minimal stand-ins for what those files import (checked against the wheel)
    config.py           stand-ins for vLLM's config classes: the values its Scheduler and manager read
    vllm_side.py        vLLM's classes built for the run, its Scheduler behind replay_workload's interface, traces
    common.py           the parts a run graduates, results, hash classes, what is compared around on purpose
    kv_checks.py        block hashes, the pool and free queue, the KV cache manager and coordinator
    scheduler_check.py  the scheduler, through nanocourse/differential.py's replay_workload
    run.py              graduate(): one run's progress bar and report (certificate), for a notebook cell or the CLI
    __main__.py         `python -m nanocourse.graduation` / `make graduate`: its arguments, and --known

The engine never imports this package.
"""
