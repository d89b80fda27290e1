"""Our replay buffer and calibration inside other training libraries (``trl``: TRL's GRPO)."""
