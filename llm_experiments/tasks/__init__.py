"""Tasks with verifiable rewards: a problem is a prompt and a reference answer.

Every task exposes the same small interface (``Task``): draw training problems with a numpy
generator, a fixed held-out list that never overlaps the training problems, and a reward in
[0, 1] for a completion. ``make.make_task`` builds the one named in a ``TaskConfig``.

This module holds the interface and imports nothing of ours, so that the tasks and config.py
import it without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


# The tasks ``make.make_task`` builds (``task.name``).
TASKS = ("addition", "long_addition", "reasoning_gym", "math")


@dataclass(frozen=True)
class Problem:
    """pid: unique id within the task; prompt: text given to the model; answer: reference."""

    pid: int
    prompt: str
    answer: str


class Task(Protocol):
    """What a run needs of a task."""
    name: str
    eval_problems: list[Problem]

    def sample_train(self, n: int, rng: np.random.Generator) -> list[Problem]:
        """``n`` training problems drawn with ``rng`` (never one of ``eval_problems``)."""

    def reward(self, problem: Problem, completion: str) -> float:
        """Verifiable reward of a decoded completion (end-of-sequence removed), in [0, 1]."""

    def alphabet(self) -> str:
        """Every character of prompts and answers (for a character-level tokenizer)."""


class ListTask:
    """A task over fixed train/eval lists of problems; subclasses define ``reward``."""

    name = "list"

    def __init__(self, train: list[Problem], eval_problems: list[Problem]):
        held_out = {p.prompt for p in eval_problems}
        self.train = [p for p in train if p.prompt not in held_out]
        if not self.train:
            raise ValueError(f"task {self.name}: no training problems left after removing "
                             f"the held-out ones")
        if not eval_problems:
            raise ValueError(f"task {self.name}: the held-out set is empty")
        self.eval_problems = list(eval_problems)

    def sample_train(self, n: int, rng: np.random.Generator) -> list[Problem]:
        """See ``Task.sample_train`` (uniform over the training list)."""
        return [self.train[i] for i in rng.integers(0, len(self.train), n)]

    def alphabet(self) -> str:
        """See ``Task.alphabet``."""
        chars = {c for p in self.train + self.eval_problems for c in p.prompt + p.answer}
        return "".join(sorted(chars))
