"""The RL update: losses, per-sample gradients, the replay buffer, the schedule and the trainer (update and rollout grading)."""
