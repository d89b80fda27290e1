"""llm_experiments: an LLM RL training harness with a replay buffer (torch, transformers)."""
