"""nanoengine: a small LLM inference engine that mirrors vLLM v1."""
