"""The calculator's advice scored on every committed setting and window (theory.md section 13):
``python -m figures.advice [--out DIR]`` writes ``advice.md`` and ``advice.json``.

For each evidence record (``replaytheory.advice.EVIDENCE_PATH``: a judged grid window at one
mu), the advice at that record's run length and mu, in sample (from all the evidence) and
leaving the record's family out (from the other families alone), with its regret, the rule's
(x = 64, y = sqrt(mu)) and on-policy's; the counts the goal reads (issue 36 G3: the advice's
regret at most the rule's everywhere, at most on-policy's where on-policy beats the rule, mean
at most 0.05).

A development check, not registered and not the calculator's (``pilot_cases``): what a
per-setting signal would buy. A pilot picks among the left-out advice, the rule's cell and
on-policy by their scores in the same setting's shortest window at the same mu, and is scored
on the setting's longer windows. The pilot window is the first updates of the very runs it is
scored on (same seeds), so the check is optimistic; a user's pilot would be separate runs.
The registered pilot is that (``registered_pilot``: ``results/pilot/verdict.json``, written by
``python -m llm_experiments.study.verdicts.pilot judge``; theory.md 13.3).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from figures.style import figure_parser, write_text
from replaytheory.advice import (RULE_HORIZON, Evidence, advise, case_at, goal_summary,
                                 load_evidence, score_cases)

PILOT_VERDICT = Path(__file__).resolve().parents[1] / "results" / "pilot" / "verdict.json"
CEILING = Path(__file__).resolve().parents[1] / "results" / "advice_ceiling" / "ceiling.json"

def pilot_cases(evidence: list[Evidence]) -> dict:
    """{"advice": cases, "pilot": cases} on every record with a shorter window of its family
    at its mu (module docstring): the left-out advice, and the pilot's pick."""
    shortest: dict = {}
    for e in evidence:
        key = (e.family, round(e.mu, 3))
        if key not in shortest or e.run_updates < shortest[key].run_updates:
            shortest[key] = e
    out: dict = {"advice": [], "pilot": []}
    for e in evidence:
        pilot = shortest[(e.family, round(e.mu, 3))]
        if pilot.run_updates >= e.run_updates:
            continue
        a = advise(e.mu, e.run_updates, evidence=evidence, exclude_families=(e.family,))
        cells = [(a.horizon, a.replay_ratio), (RULE_HORIZON, math.sqrt(e.mu))]
        cells += [(1.0, 1.0)] if pilot.on_policy() is not None else []
        pick = max(cells, key=lambda c: pilot.score[pilot.nearest(*c)])
        out["advice"].append(case_at(e, cells[0]))
        out["pilot"].append(case_at(e, pick))
    return out


def _summary_row(name: str, s: dict) -> str:
    return (f"| {name} | {s['cases']} | {s['mean_regret']:.3f} | {s['mean_rule_regret']:.3f} | "
            f"{s['mean_on_policy_regret']:.3f} | {s['worse_than_rule']} | "
            f"{s['on_policy_beats_rule']} | {s['worse_than_on_policy_there']} | "
            f"{s['goal_met']} |")


def table(scores: dict) -> str:
    """The score as markdown."""
    lines = ["# The advice scored on every committed setting and window (theory.md 13)", "",
             "Regret: the share of the best cell's gain over the warm start lost (AUC at the "
             "record's mu). In sample: advice from all the evidence; left out: from the other "
             "setting families alone.", "",
             "| | cases | advice | rule | on-policy | worse than rule | on-policy beats rule "
             "| worse than on-policy there | goal met |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [_summary_row(name, s) for name, s in scores["summary"].items()]
    pilot = scores["pilot_check"]
    lines += ["", "A development check (not registered, not the calculator's): a pilot that picks "
              "among the left-out advice, the rule and on-policy by their scores in the same "
              "setting's shortest window, scored on its longer windows (optimistic: the pilot "
              "is the first updates of the same runs).", "",
              "| | cases | regret | rule | on-policy | worse than rule | on-policy beats rule "
              "| worse than on-policy there | goal met |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [_summary_row(name, s) for name, s in pilot.items()]
    lines += ["", "| setting | T | mu | advice (in) | regret | advice (left out) | regret | "
              "rule | on-policy |", "|---|---|---|---|---|---|---|---|---|"]
    for a, b in zip(scores["in_sample"], scores["left_out"]):
        on = "-" if a["on_policy_regret"] is None else f"{a['on_policy_regret']:.3f}"
        lines.append(f"| {a['setting']} | {a['run_updates']} | {a['mu']:.2f} | "
                     f"x={a['advice'][0]:g}, y={a['advice'][1]:g} | {a['regret']:.3f} | "
                     f"x={b['advice'][0]:g}, y={b['advice'][1]:g} | {b['regret']:.3f} | "
                     f"{a['rule_regret']:.3f} | {on} |")
    return "\n".join(lines) + "\n"


def registered_pilot(verdict: dict) -> str:
    """The registered pilot's verdict (PL1-PL3, ``experiments/pilot.yaml``) as markdown."""
    if not verdict or not verdict["rows"]:
        return ""
    status = "verdict" if verdict["complete"] else "INTERIM, not the verdict"
    prices = sorted({r["price"] for r in verdict["rows"]})
    c = verdict["claims"]
    d = c["PL2_difference"]
    lines = ["", "## The registered pilot (PL1-PL3, experiments/pilot.yaml; theory.md 13.3)", "",
             f"{len(verdict['rows'])} (case, seed) pilots of {verdict['cases']} cases x "
             f"{len(verdict['seeds'])} seeds ({status}); price "
             f"{', '.join(f'{p:.0%}' for p in prices)} more updates than the run, not charged "
             "to the regret below.", "",
             "| | cases | regret | rule | on-policy | worse than rule | on-policy beats rule "
             "| worse than on-policy there | goal met |", "|---|---|---|---|---|---|---|---|---|",
             _summary_row("pilot", verdict["pilot"]),
             _summary_row("advice alone, left out", verdict["advice_alone"]), "",
             "Pilot minus advice alone, per seed's mean regret: " +
             ("-" if d is None else f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]") + ".", ""]
    k = verdict["picks"]
    lines += [f"Picks: {', '.join(f'{n} {m}' for n, m in k['counts'].items())}; an arm of least "
              f"regret on the record in {k['right']} of {len(verdict['rows'])}. Always picking "
              f"such an arm would give mean regret {k['oracle_mean_regret']:.3f}.", ""]
    words = {"PL1": "G3 over every (case, seed)", "PL2": "mean regret below the advice's",
             "PL3": "worse than the rule less often than the advice"}
    lines += [f"* {k} ({w}): {'holds' if c[k] else 'fails'}" for k, w in words.items()]
    return "\n".join(lines) + "\n"


def ceiling_section(doc: dict) -> str:
    """The replicate-split ceiling of G3 (``llm_experiments.study.verdicts.g3_ceiling``;
    theory.md 13.4) as markdown; empty without its report."""
    if not doc:
        return ""
    n = doc["sanity"]["cases"]
    lines = ["", "## The ceiling of G3 at the committed seeds (theory.md 13.4)", "",
             f"Each grid's seeds split at random into halves A and B ({doc['splits']} splits); "
             "an arm chooses on A and G3 is judged on B. Not registered: an analysis of the "
             "committed runs.", "",
             f"| arm | cases failing G3 of {n}: mean [5th, 95th] | mean regret on B "
             "| share of splits where all pass |", "|---|---|---|---|"]
    lines += [f"| {a['arm']} | {a['fails_mean']:.1f} [{a['fails_p05']:.0f}, "
              f"{a['fails_p95']:.0f}] | {a['mean_regret_b']:.3f} | {a['p_all_pass']:.3f} |"
              for a in doc["arms"]]
    g = doc["rule_against_on_policy"]
    lines += ["", f"The rule's cell minus on-policy, paired by seed on every seed: the "
              f"{g['level']:.0%} interval covers 0 in {g['covers_zero']} of {g['cases']} "
              f"cases (rule better in {g['rule_better']}, on-policy in "
              f"{g['on_policy_better']}).", ""]
    a = doc["advice_left_out"]
    lines += [f"The advice with its family left out, judged on point estimates (G3) and beyond "
              f"the paired {a['level']:.0%} interval: worse than the rule in "
              f"{a['worse_than_rule']} of {a['cases']} ({a['worse_than_rule_beyond_interval']}"
              f" beyond it), worse than a better on-policy in "
              f"{a['worse_than_on_policy_there']} of {a['on_policy_beats_rule']} "
              f"({a['worse_than_on_policy_there_beyond_interval']} beyond it).", ""]
    return "\n".join(lines)


def main(argv=None) -> list[Path]:
    p = figure_parser(__doc__)
    a = p.parse_args(argv)
    evidence = load_evidence()
    cases = {"in_sample": score_cases(evidence), "left_out": score_cases(evidence,
                                                                         leave_out=True)}
    scores = {k: [c.__dict__ for c in v] for k, v in cases.items()}
    scores["summary"] = {k: goal_summary(v) for k, v in cases.items()}
    scores["pilot_check"] = {f"{k}, left out": goal_summary(v)
                             for k, v in pilot_cases(evidence).items()}
    path = PILOT_VERDICT
    scores["registered_pilot"] = json.loads(path.read_text()) if path.exists() else {}
    ceiling = json.loads(CEILING.read_text()) if CEILING.exists() else {}
    text = table(scores) + registered_pilot(scores["registered_pilot"]) + \
        ceiling_section(ceiling)
    return [write_text(text, "advice.md", a.out),
            write_text(json.dumps(scores, indent=1), "advice.json", a.out)]


if __name__ == "__main__":
    main()
