"""The calculator's advice scored on every committed setting and window (theory.md section 13):
``python -m figures.advice [--out DIR]`` writes ``advice.md`` and ``advice.json``.

For each evidence record (``replaytheory.advice.EVIDENCE_PATH``: a judged grid window at one
mu), the advice at that record's run length and mu, in sample (from all the evidence) and
leaving the record's family out (from the other families alone), with its regret, the rule's
(x = 64, y = sqrt(mu)) and on-policy's; the counts the goal reads (issue 36 G3: the advice's
regret at most the rule's everywhere, at most on-policy's where on-policy beats the rule, mean
at most 0.05).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from figures.style import write_text
from replaytheory.advice import load_evidence, score_cases

GOAL_MEAN = 0.05


def summary(cases) -> dict:
    """Means and the goal's counts over scored cases."""
    worse_rule = [c for c in cases if c.regret > c.rule_regret + 1e-12]
    beaten = [c for c in cases if c.on_policy_regret is not None
              and c.on_policy_regret < c.rule_regret]
    worse_on = [c for c in beaten if c.regret > c.on_policy_regret + 1e-12]
    mean = float(np.mean([c.regret for c in cases]))
    return {"cases": len(cases), "mean_regret": mean,
            "mean_rule_regret": float(np.mean([c.rule_regret for c in cases])),
            "mean_on_policy_regret": float(np.mean([c.on_policy_regret for c in cases
                                                    if c.on_policy_regret is not None])),
            "worse_than_rule": len(worse_rule), "on_policy_beats_rule": len(beaten),
            "worse_than_on_policy_there": len(worse_on),
            "goal_met": not worse_rule and not worse_on and mean <= GOAL_MEAN}


def table(scores: dict) -> str:
    """The score as markdown."""
    lines = ["# The advice scored on every committed setting and window (theory.md 13)", "",
             "Regret: the share of the best cell's gain over the warm start lost (AUC at the "
             "record's mu). In sample: advice from all the evidence; left out: from the other "
             "setting families alone.", "",
             "| | cases | advice | rule | on-policy | worse than rule | on-policy beats rule "
             "| worse than on-policy there | goal met |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in scores["summary"].items():
        lines.append(f"| {name} | {s['cases']} | {s['mean_regret']:.3f} | "
                     f"{s['mean_rule_regret']:.3f} | {s['mean_on_policy_regret']:.3f} | "
                     f"{s['worse_than_rule']} | {s['on_policy_beats_rule']} | "
                     f"{s['worse_than_on_policy_there']} | {s['goal_met']} |")
    lines += ["", "| setting | T | mu | advice (in) | regret | advice (left out) | regret | "
              "rule | on-policy |", "|---|---|---|---|---|---|---|---|---|"]
    for a, b in zip(scores["in_sample"], scores["left_out"]):
        on = "-" if a["on_policy_regret"] is None else f"{a['on_policy_regret']:.3f}"
        lines.append(f"| {a['setting']} | {a['run_updates']} | {a['mu']:.2f} | "
                     f"x={a['advice'][0]:g}, y={a['advice'][1]:g} | {a['regret']:.3f} | "
                     f"x={b['advice'][0]:g}, y={b['advice'][1]:g} | {b['regret']:.3f} | "
                     f"{a['rule_regret']:.3f} | {on} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> list[Path]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="output folder (default figures/out)")
    a = p.parse_args(argv)
    evidence = load_evidence()
    cases = {"in_sample": score_cases(evidence), "left_out": score_cases(evidence,
                                                                         leave_out=True)}
    scores = {k: [c.__dict__ for c in v] for k, v in cases.items()}
    scores["summary"] = {k: summary(v) for k, v in cases.items()}
    return [write_text(table(scores), "advice.md", a.out),
            write_text(json.dumps(scores, indent=1), "advice.json", a.out)]


if __name__ == "__main__":
    main()
