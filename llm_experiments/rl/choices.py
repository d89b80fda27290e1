"""The RL update's choice lists, as plain tuples: config.py checks its fields against them.

This module imports nothing, so that config.py can name the choices without importing torch or
the modules that implement them (which import config back).
"""

# How rollouts are produced (``schedule.mode``; ``schedule.Production``).
MODES = ("on_policy", "sync", "async")

# The losses with an importance ratio pi / pi_behaviour (``trainer.loss``; each rule in
# ``objectives``, theory.md section 12).
RATIO_LOSSES = ("grpo", "grpo_unclipped", "grpo_truncated", "cispo", "m2po", "neg_clip",
                "neg_cap", "neg_veto")
# The policy losses (``losses.policy_loss``): asymre uses log pi alone.
LOSSES = (*RATIO_LOSSES, "asymre")

# How the direct forward lays out a batch (``run.train_layout``; ``losses.choose_layout``).
LAYOUTS = ("shared_prompts", "sequences", "auto")
