"""The verdict of ``experiments/seconds_equal.yaml`` (EQ1-EQ2): the seconds for x = 64, y = 2 to
reach on-policy's final accuracy on cpu_long, its runs as long in seconds as on-policy's 300
updates (theory.md 3.8).

``python -m llm_experiments.study.verdicts.seconds_equal --curves
results/seconds_equal/curves.jsonl.gz --out results/seconds_equal/verdict.json``

Judged as seconds_late's level (``seconds_long.judge_level``, ``seconds_late.ends``): per cell
the ratio of seconds to on-policy's final accuracy over on-policy's (mean over seeds, 95%
seed-bootstrap interval), and where each buffer run ends against on-policy. Reported beside:
each cell's median seconds per update and per generated rollout (``seconds.CellMedians``),
since the on-policy runs come from seconds_late's sweep.
"""

from __future__ import annotations

from dataclasses import asdict

from ..seconds import CellMedians
from .seconds_late import ADVICE, HEADLINE, ends
from .seconds_long import LEVEL, judge_level, runs_by_level, verdict_cli

SEEDS = 5  # registered


def claims(level: dict) -> dict:
    """EQ1-EQ2 of the registration from the level's verdict (empty without the buffer cell)."""
    cell = next((c for c in level["cells"].values()
                 if (c["x"], c["y"]) == ADVICE and not c["adaptive"]), None)
    if cell is None:
        return {}
    return {"EQ1": cell["reached"] == len(level["seeds"]) and cell["ratio"][2] < 1,
            "EQ2": cell["ratio"][0] <= HEADLINE}


def judge(curves: str) -> dict:
    """The verdict of the compacted runs ``curves`` (module docstring)."""
    by_level = runs_by_level(curves)
    if set(by_level) != {4}:
        raise ValueError(f"curves: seconds_equal runs at {LEVEL}=4, got {sorted(by_level)}")
    runs = by_level[4]
    level = judge_level(runs)
    if not level:
        return {"levels": {}, "claims": {}, "complete": False}
    level["ends"] = ends(runs, level["seeds"])
    level["costs"] = {c.label: asdict(CellMedians.of([by[s] for s in level["seeds"]]))
                      for c, by in runs.items()}
    return {"levels": {"4": level}, "claims": claims(level),
            "complete": len(level["seeds"]) >= SEEDS}


def main(argv=None) -> int:
    return verdict_cli(judge, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
