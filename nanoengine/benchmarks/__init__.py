"""Benchmark datasets and measurements, run by the scripts in bench/ (vLLM: vllm/benchmarks/)."""
