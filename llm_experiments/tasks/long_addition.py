"""Addition with written carries: a procedural task whose completions are long worked solutions.

Shaped like reasoning RL on a CPU: the completion is a scratchpad of ``digits`` lines (one per
column) before the final answer, ~140 characters at 5 digits against a 12-character prompt,
and the reward grades only the final answer. Prompt ``"00417+00925="`` (operands zero-padded
to ``digits``, so every prompt has the same length); line k of the solution (k = 1..digits)::

    .0041+.0092|7+5+0=12|2....;

is the state after column k: both operands shifted right by one (their consumed last digit
replaced by ``.`` on the left), the column's sum ``x+y+carry=ss`` (``ss`` two digits, the
first is the next carry), and the sum's digits so far, newest first, padded with ``.``. Each
character then depends on characters of the line before at fixed offsets, which a small
causal model learns far more easily than looking up the k-th digit of a number. The solution
ends with ``=`` and the sum's ``digits + 1`` digits, most significant first (a leading 0 kept).

Reward: 1 when the text after the last ``=`` is a number equal to a + b, else 0. A completion
with no ``=`` or a non-digit after it is *unparseable* (``parse_answer`` returns None): it
scores 0 and the evaluation counts it (``parseable``, logged as ``eval_unparseable``).
"""

from __future__ import annotations

from replaytheory import checks

from . import Problem
from .arithmetic import AdditionTask

PAD = "."
def worked_solution(a: int, b: int, digits: int) -> str:
    """The reference completion for ``a + b`` (both in [0, 10^digits)); see the module
    docstring for the format."""
    digits = checks.integer("task.digits", digits, 1, 9)
    a = checks.integer("a", a, 0, 10 ** digits - 1)
    b = checks.integer("b", b, 0, 10 ** digits - 1)
    top, bottom = f"{a:0{digits}d}", f"{b:0{digits}d}"
    carry, written, lines = 0, "", []
    for k in range(1, digits + 1):
        x, y = int(top[-1]), int(bottom[-1])
        s = x + y + carry
        top, bottom = PAD + top[:-1], PAD + bottom[:-1]
        written = str(s % 10) + written
        lines.append(f"{top}+{bottom}|{x}+{y}+{carry}={s:02d}|"
                     f"{written}{PAD * (digits - k)};")
        carry = s // 10
    return "".join(lines) + f"={a + b:0{digits + 1}d}"


def parse_answer(completion: str) -> int | None:
    """The final answer of a completion: the integer after its last ``=``, or None when
    there is no ``=`` or the rest is not a non-empty string of digits (unparseable)."""
    if "=" not in completion:
        return None
    tail = completion.rsplit("=", 1)[1].strip()
    return int(tail) if tail.isdigit() and tail.isascii() else None


class LongAdditionTask(AdditionTask):
    """Addition of two ``digits``-digit numbers (1..9) with a written worked solution;
    ``eval_size`` held-out pairs chosen by ``eval_seed`` are never drawn for training
    (the pairs and splits of ``AdditionTask``, another text).

    ``Problem.answer`` is the whole worked solution (what the supervised warm start imitates);
    the reward grades only its final number.
    """

    name = "long_addition"
    # Steps between the warm start's accuracy checks (``warm_start.warm_start``): a check
    # over 512 worked solutions costs ~5 training steps of 32; the supervised curve rises
    # ~0.006 a step near 0.3 (0.03 to 0.58 in 100 steps at 5 digits), so 5 steps overshoot
    # a target by at most ~0.03.
    warm_start_check_every = 5

    def __init__(self, digits: int = 5, eval_size: int = 200, eval_seed: int = 1234):
        super().__init__(digits, eval_size, eval_seed)

    def problem(self, pid: int) -> Problem:
        """The problem of id ``pid`` = a * 10^digits + b, pid in [0, 10^(2 digits))."""
        a, b = divmod(int(pid), self.base)
        return Problem(int(pid), f"{a:0{self.digits}d}+{b:0{self.digits}d}=",
                       worked_solution(a, b, self.digits))

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 when the completion's final answer (``parse_answer``) equals a + b, else 0.0
        (unparseable output included)."""
        got = parse_answer(completion)
        a, b = divmod(problem.pid, self.base)
        return float(got is not None and got == a + b)

    def parseable(self, completion: str) -> bool:
        """Whether the completion has a final answer to grade (``parse_answer``); the
        evaluation logs the share without one (``eval_unparseable``)."""
        return parse_answer(completion) is not None

    def alphabet(self) -> str:
        """See ``Task.alphabet``: digits and ``+=|;.``."""
        return "0123456789+=|;" + PAD
