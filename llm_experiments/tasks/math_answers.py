"""Math problems with a final answer (OpenR1-Math / MATH style), graded by ``math-verify``.

Data come from a local JSONL file (one record per line with ``problem_key`` and
``answer_key`` fields) or a hub dataset by name (needs network). The held-out set is a
separate file/dataset, or the last ``eval_size`` records after a seeded shuffle; training
problems whose text is held out are dropped.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from . import ListTask, Problem


def load_records(source: str, split: str) -> list[dict]:
    """Records of a local ``.jsonl`` file, or of a hub dataset split (needs network)."""
    if source.endswith(".jsonl"):
        if not os.path.isfile(source):
            raise ValueError(f"task dataset file {source!r} does not exist")
        with open(source) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    try:
        import datasets
    except ImportError:
        raise ValueError("loading a hub dataset needs the 'tasks' extra") from None
    try:
        return list(datasets.load_dataset(source, split=split))
    except Exception as exc:  # the hub raises many kinds; all mean "not available here"
        raise ValueError(f"cannot load dataset {source!r} (split {split!r}): {exc}") from None


class MathAnswerTask(ListTask):
    """Reward 1 when ``math_verify`` finds the completion's answer equal to the reference."""

    name = "math"

    def __init__(self, train: list[Problem], eval_problems: list[Problem]):
        try:
            import math_verify
        except ImportError:
            raise ValueError("task.name=math needs the 'tasks' extra (math-verify)") from None
        self._mv = math_verify
        super().__init__(train, eval_problems)

    @classmethod
    def from_config(cls, cfg) -> "MathAnswerTask":
        """Load the train and held-out problems of a ``TaskConfig``."""
        def problems(records, offset):
            out = []
            for i, rec in enumerate(records):
                for key in (cfg.problem_key, cfg.answer_key):
                    if key not in rec:
                        raise ValueError(f"dataset record {i} lacks field {key!r} "
                                         f"(task.problem_key / task.answer_key); it has "
                                         f"{sorted(rec)}")
                text = cfg.prompt_template.replace("{problem}", str(rec[cfg.problem_key]))
                out.append(Problem(offset + i, text, str(rec[cfg.answer_key])))
            return out

        records = load_records(cfg.dataset, cfg.split)
        if cfg.eval_dataset:
            held = load_records(cfg.eval_dataset, cfg.eval_split)[:cfg.eval_size]
        else:
            if len(records) <= cfg.eval_size:
                raise ValueError(f"task.eval_size ({cfg.eval_size}) must be smaller than the "
                                 f"dataset ({len(records)} records) without task.eval_dataset")
            order = np.random.default_rng(cfg.eval_seed).permutation(len(records))
            held = [records[i] for i in order[-cfg.eval_size:]]
            records = [records[i] for i in order[:-cfg.eval_size]]
        return cls(problems(records, 0), problems(held, len(records)))

    def reward(self, problem: Problem, completion: str) -> float:
        # math-verify's timeouts use signals, which only work in the main thread.
        """1 if math-verify finds the completion's answer equal to the reference, else 0."""
        main = threading.current_thread() is threading.main_thread()
        kw = {} if main else {"parsing_timeout": None}
        gold = self._mv.parse(problem.answer, **kw)
        pred = self._mv.parse(completion, **kw)
        return float(self._mv.verify(gold, pred, **({} if main else {"timeout_seconds": None})))
