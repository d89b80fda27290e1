"""Adapter for ``reasoning-gym`` procedural generators (tasks made by others).

The training and held-out sets come from two generator seeds; held-out prompts are removed
from the training set, so the splits never overlap. Grading uses the generator's own
``score_answer``. For a character-level model, ``prompt_field="metadata.expression"`` (for
example) re-renders an English question as its bare expression.
"""

from __future__ import annotations

import os
import tempfile

from . import ListTask, Problem


def _field(entry: dict, path: str) -> str:
    value = entry
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"task.prompt_field {path!r} is not in the reasoning-gym entry "
                             f"(top-level keys: {sorted(entry)})")
        value = value[part]
    return str(value)


class ReasoningGymTask(ListTask):
    """``size`` training and ``eval_size`` held-out problems of generator ``rg_name``."""

    name = "reasoning_gym"

    def __init__(self, rg_name: str, rg_config: dict, size: int, eval_size: int,
                 eval_seed: int, prompt_field: str = "question",
                 prompt_template: str = "{problem}"):
        # Importing reasoning_gym writes a matplotlib cache under $HOME unless told otherwise;
        # one fixed folder, so repeated runs do not leave a new temp folder each.
        os.environ.setdefault("MPLCONFIGDIR",
                              os.path.join(tempfile.gettempdir(), "llm_experiments-mpl"))
        try:
            import reasoning_gym
        except ImportError:
            raise ValueError("task.name=reasoning_gym needs the 'tasks' extra "
                             "(pip install -e '.[tasks]')") from None
        try:
            train = reasoning_gym.create_dataset(rg_name, size=size, seed=eval_seed + 1,
                                                 **rg_config)
            held = reasoning_gym.create_dataset(rg_name, size=eval_size, seed=eval_seed,
                                                **rg_config)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"task.rg_name={rg_name!r} with task.rg_config={rg_config!r}: "
                             f"{exc}") from None
        self._datasets = {"train": train, "eval": held}
        self._entries: dict[int, tuple] = {}

        def problems(split, offset):
            out = []
            for i, entry in enumerate(self._datasets[split]):
                pid = offset + i
                self._entries[pid] = (split, entry)
                text = prompt_template.replace("{problem}", _field(entry, prompt_field))
                out.append(Problem(pid, text, str(entry["answer"])))
            return out

        super().__init__(problems("train", 0), problems("eval", len(train)))

    def reward(self, problem: Problem, completion: str) -> float:
        """The generator's own ``score_answer`` in [0, 1]."""
        split, entry = self._entries[problem.pid]
        return float(self._datasets[split].score_answer(completion.strip(), entry) or 0.0)
