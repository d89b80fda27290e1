"""The adaptive horizon over uncertain tokens (U1-U4, ``experiments/adaptive_uncertain.yaml``
and ``adaptive_uncertain_long.yaml``; theory.md 12.7), for ``figures.losses.report``.

Per setting, paired by seed: the arm (tau = 0.1 over the tokens sampled below 0.5) against
x = 64 (the advice's own comparison, ``replaytheory.adaptive_advice.compare_adaptive``) and
against the arm over every token at tau = 0.05 on the same setting (its committed runs, matched
by every setting but horizon, threshold, token bound and seed); the drop share, the share of
tokens the statistic reads and the mean staleness of what it trained on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from figures.losses.transfer import drop_share
from figures.losses.verdicts import staleness
from figures.unclipped import auc
from llm_experiments.study.results import load_runs
from replaytheory.adaptive_advice import ARMS, AdaptivePair, compare_adaptive, judge_arm
from replaytheory.evidence import collect_adaptive, paired_signature, setting_names
from replaytheory.loss_advice import paired_interval

UNCERTAIN, ALL_TOKENS = ARMS
GRIDS = ("adaptive_uncertain", "adaptive_uncertain_long")
LONG = "adaptive_uncertain_long"
# the grids holding the arm over every token at tau = 0.05 on the same settings
ALL_TOKEN_GRIDS = ("horizon_adaptive", "horizon_adaptive_lr2", "adaptive_transfer",
                   "adaptive_long")
SEEDS = {"adaptive_uncertain": 10, LONG: 3}  # registered per setting (pairs may be fewer)


def _arm_runs(results: Path, grids, arm) -> dict:
    """{signature: {seed: run}} of ``arm``'s runs in ``grids``."""
    out: dict = {}
    for g in grids:
        path = results / g / "curves.jsonl.gz"
        for r in load_runs(str(path)) if path.exists() else []:
            if (float(r.get("buffer.drop_logr2") or 0) == arm.tau
                    and float(r.get("buffer.drop_tokens_below_p") or 1) == arm.below_p):
                out.setdefault(paired_signature(r.settings), {})[int(r.settings["run.seed"])] = r
    return out


def judge_uncertain(results: Path) -> dict:
    """Rows per setting and U1-U4 as far as the runs allow; empty before any run."""
    arm = {g: _arm_runs(results, (g,), UNCERTAIN) for g in GRIDS}
    if not any(arm.values()):
        return {}
    every = _arm_runs(results, ALL_TOKEN_GRIDS, ALL_TOKENS)
    pairs = [AdaptivePair.from_record(r) for r in collect_adaptive(results)]
    vs64 = {c.setting: c for c in compare_adaptive(pairs, UNCERTAIN)}
    rows = {}
    for g, by_sig in arm.items():
        names = setting_names(g, set(by_sig))
        for sig, runs in by_sig.items():
            other = every.get(sig, {})
            d = paired_interval({s: auc(r) for s, r in runs.items()},
                                {s: auc(r) for s, r in other.items()})
            c = vs64.get(names[sig])
            rows[names[sig]] = {
                "grid": g, "seeds": len(runs), "paired": 0 if c is None else c.seeds,
                "minus_x64": None if c is None else (c.mean, c.low, c.high),
                "minus_every_token": None if d is None else (d.mean, d.low, d.high),
                "drop_share": float(np.mean([drop_share(r) for r in runs.values()])),
                "uncertain_share": float(np.mean([np.nanmean(np.asarray(
                    r.train["uncertain_share"], float)) for r in runs.values()])),
                "staleness": float(np.mean([staleness(r) for r in runs.values()]))}
    return {"rows": rows, "claims": _claims(rows, pairs),
            "complete": all(r["seeds"] >= SEEDS[r["grid"]] for r in rows.values())
            and len(rows) == UNCERTAIN.min_settings}


def _claims(rows: dict, pairs) -> dict:
    long = [r for r in rows.values() if r["grid"] == LONG]
    tiny = [r for r in rows.values() if r["grid"] != LONG]
    out: dict = {}
    if long:
        out["U1"] = 0.2 <= long[0]["drop_share"] <= 0.6
        out["U2"] = long[0]["minus_x64"] is not None and long[0]["minus_x64"][0] >= -0.01
    if tiny and all(r["minus_x64"] and r["minus_every_token"] for r in tiny):
        out["U3"] = all(r["minus_x64"][0] >= -0.01 and abs(r["minus_every_token"][0]) <= 0.02
                        for r in tiny)
    verdict = judge_arm(UNCERTAIN, pairs)
    out["U4"], out["rule"] = verdict.named, verdict.reason
    return out


WORDS = {"U1": "on cpu_long it drops 20-60% with no per-setting constant",
         "U2": "on cpu_long no worse than x = 64 (mean >= -0.01)",
         "U3": "on each cpu_tiny setting no worse than x = 64 and within 0.02 of tau = 0.05 "
               "over every token",
         "U4": "the advice's rule names it"}


def _cell(v) -> str:
    return "-" if v is None else f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"


def uncertain_table(v: dict) -> str:
    """U1-U4 as markdown (verdict once every registered seed is in)."""
    if not v:
        return ""
    status = "verdict" if v["complete"] else "INTERIM, not the verdict"
    lines = ["## The adaptive horizon over uncertain tokens (U1-U4, "
             "experiments/adaptive_uncertain.yaml)", "",
             f"tau = {UNCERTAIN.tau:g} over the tokens sampled below {UNCERTAIN.below_p:g}, "
             f"horizon 1024, grpo, y = 2; paired by seed ({status}).", "",
             "| setting | seeds (paired with x = 64) | minus x = 64 | minus tau = 0.05 over every "
             "token | drop share | tokens read | mean staleness |", "|---|---|---|---|---|---|---|"]
    for name, r in sorted(v["rows"].items()):
        lines.append(f"| {name} | {r['seeds']} ({r['paired']}) | {_cell(r['minus_x64'])} | "
                     f"{_cell(r['minus_every_token'])} | {r['drop_share']:.2f} | "
                     f"{r['uncertain_share']:.3f} | {r['staleness']:.1f} |")
    c = v["claims"]
    lines += ["", f"The advice's rule: {c['rule']}.", ""]
    lines += [f"* {k} ({w}): {'holds' if c[k] else 'fails'}" for k, w in WORDS.items() if k in c]
    return "\n".join(lines) + "\n"
