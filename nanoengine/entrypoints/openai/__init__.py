"""The OpenAI-compatible server (vllm/entrypoints/openai/)."""
