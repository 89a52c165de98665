"""What the engine reports while it serves (vllm/v1/metrics/)."""
