"""Procedural multi-digit addition, the task a tiny model can learn on a CPU.

Prompt ``"a+b="`` with operands uniform in [0, 10^digits); the answer is written least
significant digit first (``"17+25="`` -> ``"24"``), which a small causal model learns far more
easily than the usual order because each digit then depends only on digits already written.
``digits`` is the difficulty knob. Reward 1 for an exact answer, else 0.
"""

from __future__ import annotations

import numpy as np

from replaytheory import checks

from . import Problem


class AdditionTask:
    """Addition of two ``digits``-digit numbers; ``eval_size`` held-out pairs chosen by
    ``eval_seed`` are never drawn for training."""

    name = "addition"

    def __init__(self, digits: int = 2, eval_size: int = 200, eval_seed: int = 1234):
        self.digits = checks.integer("task.digits", digits, 1, 9)
        self.base = 10 ** self.digits
        n_pairs = self.base ** 2
        self.eval_size = checks.integer("task.eval_size", eval_size, 1, n_pairs // 2)
        rng = np.random.default_rng(eval_seed)
        eval_ids = rng.choice(n_pairs, self.eval_size, replace=False) if n_pairs < 2**24 \
            else np.unique(rng.integers(0, n_pairs, self.eval_size * 2))[:self.eval_size]
        self._held_out = set(int(i) for i in eval_ids)
        self.eval_problems = [self.problem(int(i)) for i in eval_ids]

    def problem(self, pid: int) -> Problem:
        """The problem of id ``pid`` = a * 10^digits + b."""
        a, b = divmod(pid, self.base)
        return Problem(pid, f"{a}+{b}=", str(a + b)[::-1])

    def sample_train(self, n: int, rng: np.random.Generator) -> list[Problem]:
        """See ``Task.sample_train`` (uniform pairs, held-out ones redrawn)."""
        out: list[Problem] = []
        while len(out) < n:
            ids = rng.integers(0, self.base ** 2, n - len(out))
            out.extend(self.problem(int(i)) for i in ids if int(i) not in self._held_out)
        return out

    def reward(self, problem: Problem, completion: str) -> float:
        """1 for the exact least-significant-digit-first answer, else 0."""
        return float(completion.strip() == problem.answer)

    def alphabet(self) -> str:
        """See ``Task.alphabet``."""
        return "0123456789+="
