"""Graduation (issue 45): vLLM 0.33.0's own v1 core classes, loaded from its wheel on a CPU, driven side by side
with nanoengine's parts (the engine's, the worked solutions' or the learner's) on random workloads."""
