"""Build the task a configuration names (``task.name``)."""

from __future__ import annotations

from . import Task


def make_task(cfg) -> Task:
    """Build the task of a ``TaskConfig``."""
    if cfg.name == "addition":
        from .arithmetic import AdditionTask
        return AdditionTask(cfg.digits, cfg.eval_size, cfg.eval_seed)
    if cfg.name == "long_addition":
        from .long_addition import LongAdditionTask
        return LongAdditionTask(cfg.digits, cfg.eval_size, cfg.eval_seed)
    if cfg.name == "reasoning_gym":
        from .reasoning_gym import ReasoningGymTask
        return ReasoningGymTask(cfg.rg_name, cfg.rg_config, cfg.rg_size, cfg.eval_size,
                                cfg.eval_seed, cfg.prompt_field, cfg.prompt_template)
    from .math_answers import MathAnswerTask
    return MathAnswerTask.from_config(cfg)
