"""The sequence lengths of ``long_addition``'s prompts and worked solutions, in characters
(= tokens of the char tokenizer): a leaf that imports nothing of ours, so that config.py can
check that a solution fits the sampler and the model without importing the task."""

from __future__ import annotations

from replaytheory import checks

# Characters per solution line besides the three digit fields: "+", "|", "x+y+c=ss", "|", ";".
LINE_EXTRA = 12


def prompt_chars(digits: int) -> int:
    """Characters (= tokens of the char tokenizer) of a prompt: 2 digits + 2."""
    return 2 * checks.integer("task.digits", digits, 1, 9) + 2


def solution_chars(digits: int) -> int:
    """Characters of a worked solution, end-of-sequence excluded: ``digits`` lines of
    3 digits + 12, then ``=`` and ``digits + 1`` answer digits (142 at 5 digits)."""
    d = checks.integer("task.digits", digits, 1, 9)
    return d * (3 * d + LINE_EXTRA) + 1 + (d + 1)
