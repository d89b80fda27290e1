"""The replicate-split ceiling of issue 36's G3: could any per-setting signal meet G3 at the
committed seed counts, or is the criterion dominated by seed noise?

``python -m llm_experiments.study.verdicts.g3_ceiling --out results/advice_ceiling/ceiling.json
[--splits 200] [--seed 0]``

G3 (``replaytheory.advice``, theory.md section 13): on every committed case the advice's
regret is at most the rule's (x = 64, y = sqrt(mu)) and, where on-policy's regret is below the
rule's, at most on-policy's (with the slack ``TOLERANCE`` = 1e-12 of
``advice.goal_summary``). A case is one evidence record of ``advice.EVIDENCE_PATH`` (setting,
run length T in trainer updates, mu; 54 committed). Regret of a cell, in [0, inf) (0 at the
best cell, 1 at the warm start's accuracy): (best - cell) / (best - warm start)
(``advice.Evidence.regret``).

Method. Each case's table is the judge's: per (cell, learning rate, seed) the AUC (mean eval
accuracy in [0, 1] over accounted compute in [0, C(mu)], C(mu) = T (1 + mu / y_max) trainer
updates: ``judge.measures``) of the runs ``judge`` reads (``judge.judged_runs``), at the
case's mu (``judge.sweep_mus``). A split halves the seeds at random into A (the smaller half,
n // 2 seeds) and B (the other n - n // 2); the cases that read the same curves files (a grid
and its windows, at each mu) share their splits, as a replicate of the grid would share its
seeds; ``splits`` splits (>= 1) per grid from ``numpy.random.default_rng([seed,
crc32(curves)])``. In each half every cell is scored as the judge scores it, its learning rate
chosen within that half by the median over the half's seeds
(``replaytheory.stats.verdicts.scores_per_draw``). The arms (``ARMS``), each choosing from A:

1. "own-half rule or on-policy": on-policy if its A score beats the rule's cell's (of equally
   near cells the worse on A, ``Evidence.nearest``), else the rule (the rule where the grid
   has no on-policy cell);
2. "own-half best cell": the cell of the best A score, that cell itself;
3. "rule": always the rule; 4. "on-policy": always on-policy (the rule without its cell).

Each choice is judged on B: regrets from B's scores with the evidence's warm start (the median
step-0 eval accuracy of every run in the case's curves file, all seeds: ``evidence.collect``),
arms 1, 3 and 4 at the cell their (x, y) is scored at (``Evidence.scored_at``), and fails G3
when its regret exceeds ``Evidence.bound`` on B (min of the rule's and on-policy's regret) by
more than ``TOLERANCE``. Per arm: the number of the cases failing per split (mean and
5th-95th percentile over splits, numpy's linear interpolation), the mean regret on B (over
splits and cases) and the share of splits in which every case passes; per case: each arm's
share of failing splits and the share of splits in which A and B agree on which of the rule
and on-policy scores better (strictly). The sanity check: the full-seed scores recomputed
here (``judge.cell_records``) against the committed validation.json's and the evidence's,
which must agree to ``SANITY_TOL``.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from replaytheory import checks
from replaytheory.advice import EVIDENCE_PATH, RULE_HORIZON, Evidence, score_cases
from replaytheory.cli_input import Parser, integer, output_file
from replaytheory.stats.analysis import best_option
from replaytheory.io import write_json
from replaytheory.stats.verdicts import PairedDifference, paired_difference, scores_per_draw

from ..judge import Registration, SweepGrid, cell_records, judged_runs, measures, sweep_mus

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "results"
ARMS = ("own-half rule or on-policy", "own-half best cell", "rule", "on-policy")
TOLERANCE = 1e-12  # G3's slack (replaytheory.advice.goal_summary)
SANITY_TOL = 1e-9  # recomputed full-seed scores against the committed ones
SPLITS = 200
PERCENTILES = (5, 95)
GAP_LEVEL = 0.95  # the interval of the rule's cell minus on-policy, paired by seed
METHOD = ("Per case, the seeds split at random into A (n // 2) and B (the rest), the same "
          "split for every cell and for every case of the same curves files; every cell "
          "scored in each half as the judge scores it (AUC, best learning rate by the "
          "half's median); each arm chooses on A and is judged on B (regrets from B's "
          "scores and the evidence's warm start); G3 fails when the choice's regret on B "
          "exceeds min(rule's, on-policy's) by more than the tolerance. See the module "
          "docstring of llm_experiments/study/verdicts/g3_ceiling.py.")


@dataclass(frozen=True)
class CeilingCase:
    """One committed case: its evidence record (labels, x, y, full-seed scores, warm start,
    mu, T), how its mu was named (``mu_source``), the judge's AUC table (cells in the
    evidence's order, learning rates, seeds), its seeds, the curves files its splits follow
    (``split_key``) and the largest gap of the recomputed full-seed scores to the committed
    validation.json's and the evidence's (``full_seed_gap``, accuracy)."""

    evidence: Evidence
    mu_source: str
    table: np.ndarray
    seeds: tuple[int, ...]
    split_key: str
    full_seed_gap: float = 0.0


@dataclass(frozen=True)
class Halves:
    """Seed indices of each split: ``a`` (splits, n // 2), ``b`` (splits, n - n // 2)."""

    a: np.ndarray
    b: np.ndarray


@dataclass(frozen=True)
class CaseOutcome:
    """One case over the splits: each arm's regret on B and whether it fails G3 there
    (splits, arms), whether A and B agree on rule against on-policy (splits,; None
    without an on-policy cell) and how many of the splits are distinct (n seeds have
    C(n, n // 2) halvings: 10 for 5 seeds, 252 for 10)."""

    regret: np.ndarray
    fails: np.ndarray
    agree: np.ndarray | None
    distinct_splits: int = 0


@dataclass(frozen=True)
class ArmSummary:
    """One arm over the cases: failing cases per split (mean, 5th and 95th percentile,
    least, of ``cases``), mean regret on B and the share of splits where every case
    passes."""

    arm: str
    cases: int
    fails_mean: float
    fails_p05: float
    fails_p95: float
    fails_min: int
    mean_regret_b: float
    p_all_pass: float


def halves(n_seeds: int, splits: int, rng: np.random.Generator) -> Halves:
    """``splits`` random halvings of ``n_seeds`` (>= 2) seeds, each half sorted."""
    if n_seeds < 2:
        raise ValueError(f"a split needs at least 2 seeds, got {n_seeds}")
    order = np.stack([rng.permutation(n_seeds) for _ in range(splits)])
    k = n_seeds // 2
    return Halves(a=np.sort(order[:, :k], axis=1), b=np.sort(order[:, k:], axis=1))


def split_rng(key: str, seed: int) -> np.random.Generator:
    """The generator of the splits of the cases reading the curves ``key``."""
    return np.random.default_rng([seed, zlib.crc32(key.encode())])


def choices_on_b(e_a: Evidence, e_b: Evidence) -> tuple[np.ndarray, bool | None]:
    """(each arm's cell on B (arms,), whether A and B agree that on-policy beats the rule;
    None without on-policy), for the same case scored on halves A (``e_a``) and B."""
    rule = (RULE_HORIZON, math.sqrt(e_a.mu))
    on = e_a.on_policy()
    on_a = on is not None and e_a.score[on] > e_a.score[e_a.nearest(*rule)]
    on_b = on is not None and e_b.score[on] > e_b.score[e_b.nearest(*rule)]
    policy = (1.0, 1.0) if on is not None else rule
    cells = np.array([e_b.scored_at(*(policy if on_a else rule)),
                      int(np.nanargmax(e_a.score)),
                      e_b.scored_at(*rule), e_b.scored_at(*policy)])
    return cells, (None if on is None else on_a == on_b)


def judge_splits(case: CeilingCase, halves_: Halves) -> CaseOutcome:
    """Every arm of ``case`` chosen on each split's A and judged on its B (module
    docstring)."""
    e = case.evidence
    a = scores_per_draw(case.table, halves_.a, "max")  # (cells, splits)
    b = scores_per_draw(case.table, halves_.b, "max")
    regret, fails, agree = [], [], []
    for r in range(a.shape[1]):
        e_a, e_b = replace(e, score=a[:, r]), replace(e, score=b[:, r])
        cells, agrees = choices_on_b(e_a, e_b)
        reg = e_b.regret()[cells]
        regret.append(reg)
        fails.append(reg > e_b.bound(e.mu) + TOLERANCE)
        agree.append(agrees)
    return CaseOutcome(np.array(regret), np.array(fails),
                       None if e.on_policy() is None else np.array(agree, bool),
                       len({tuple(h) for h in halves_.a}))


def ceiling(cases: list[CeilingCase], splits: int = SPLITS, seed: int = 0,
            progress: bool = False) -> list[CaseOutcome]:
    """``judge_splits`` of every case on its grid's ``splits`` splits (``split_rng``)."""
    splits = checks.integer("splits", splits, 1)
    cached: dict = {}
    out = []
    for case in tqdm(cases, desc="g3 ceiling", disable=not progress):
        key = (case.split_key, len(case.seeds))
        if key not in cached:
            cached[key] = halves(len(case.seeds), splits, split_rng(case.split_key, seed))
        out.append(judge_splits(case, cached[key]))
    return out


def summarise(outcomes: list[CaseOutcome]) -> list[ArmSummary]:
    """Each arm over the cases and splits (``ArmSummary``)."""
    fails = np.stack([o.fails for o in outcomes])  # (cases, splits, arms)
    regret = np.stack([o.regret for o in outcomes])
    per_split = fails.sum(axis=0)  # (splits, arms)
    out = []
    for k, arm in enumerate(ARMS):
        lo, hi = np.percentile(per_split[:, k], PERCENTILES)
        out.append(ArmSummary(arm, len(outcomes), float(per_split[:, k].mean()), float(lo),
                              float(hi), int(per_split[:, k].min()),
                              float(np.nanmean(regret[:, :, k])),
                              float(np.mean(per_split[:, k] == 0))))
    return out


def best_lr_scores(table: np.ndarray, cell: int) -> np.ndarray:
    """Per-seed scores (seeds,) of ``cell`` at its learning rate of best median over every
    seed (the judge's choice on the full seeds)."""
    _, lr = best_option(table[cell][None], "max")
    return table[cell, int(lr[0])]


def rule_against_on_policy(case: CeilingCase) -> PairedDifference | None:
    """The rule's cell minus on-policy, AUC paired by seed on every seed, with its 95%
    Student-t interval (``paired_difference``); None without an on-policy cell."""
    e = case.evidence
    on = e.on_policy()
    if on is None:
        return None
    rule = e.nearest(RULE_HORIZON, math.sqrt(e.mu))
    return paired_difference(best_lr_scores(case.table, rule), best_lr_scores(case.table, on),
                             "max", level=GAP_LEVEL)


def case_record(case: CeilingCase, outcome: CaseOutcome, gap: PairedDifference | None) -> dict:
    """One case's line of the report."""
    e = case.evidence
    reg = e.regret()
    on = e.on_policy()
    rule = reg[e.nearest(RULE_HORIZON, math.sqrt(e.mu))]
    return {"setting": e.setting, "run_updates": e.run_updates, "mu": e.mu,
            "mu_source": case.mu_source, "seeds": len(case.seeds),
            "half_sizes": [len(case.seeds) // 2, len(case.seeds) - len(case.seeds) // 2],
            "distinct_splits": outcome.distinct_splits,
            "warm_start": e.warm_start,
            "full_seed_on_policy_beats_rule": None if on is None else bool(reg[on] < rule),
            "fail_share": {arm: float(outcome.fails[:, k].mean())
                           for k, arm in enumerate(ARMS)},
            "agree_share": None if outcome.agree is None else float(outcome.agree.mean()),
            "rule_minus_on_policy": None if gap is None else gap.as_dict(),
            "full_seed_gap": case.full_seed_gap}


def _path(root: Path, path: str) -> str:
    return str(Path(path) if Path(path).is_absolute() else root / path)


def validation_record(results: Path, setting: str, mu_source: str) -> dict:
    """The AUC verdict at ``mu_source`` of ``results/setting/validation.json``."""
    records = json.loads((results / setting / "validation.json").read_text())
    (rec,) = [r for r in records if r["measure"] == "auc" and r["mu_source"] == mu_source]
    return rec


def judged_table(rec: dict, root: Path, cache: dict) -> tuple[SweepGrid, np.ndarray]:
    """(grid, (cells, lrs, seeds) AUC table) of the verdict ``rec`` as ``judge`` scores it;
    ``cache`` keeps the runs of each curves files and loss."""
    reg = Registration.load(_path(root, rec["registration"]["path"]))
    curves = [_path(root, c["path"]) for c in rec["curves"]]
    key = (tuple(curves), reg.loss, json.dumps(reg.warm_start, sort_keys=True))
    if key not in cache:
        runs = judged_runs(curves, reg, only_complete_seeds=False)
        cache[key] = (runs, SweepGrid.of(runs))
    runs, grid = cache[key]
    mu = sweep_mus(grid, runs, reg)[rec["mu_source"]]  # MEASURED or an accounting mu
    if abs(mu - rec["mu"]) > 1e-12:
        raise ValueError(f"{rec['registration']['path']}: mu {mu!r} recomputed, "
                         f"{rec['mu']!r} committed")
    auc = measures(reg)[0]
    return grid, grid.table(lambda r: auc.score(r, mu))


def load_case(record: dict, results: Path = RESULTS, cache: dict | None = None) -> CeilingCase:
    """The case of one evidence record (``evidence.collect``): its verdict's table in the
    evidence's cell order, with the full-seed check (``CeilingCase.full_seed_gap``)."""
    cache = {} if cache is None else cache
    e = Evidence.from_record(record)
    rec = validation_record(results, record["setting"], record["mu_source"])
    grid, table = judged_table(rec, results.parent, cache)
    order = [grid.labels.index(label) for label in e.labels]
    mine = {c["label"]: c["score"] for c in cell_records(grid, table, "max",
                                                         np.zeros(len(grid.cells)))}
    committed = {c["label"]: c["score"] for c in rec["cells"]}
    if set(mine) != set(committed) or set(committed) != set(e.labels):
        raise ValueError(f"{record['setting']} mu {record['mu_source']}: the cells differ "
                         f"from the committed verdict's")
    # the splits' scoring (scores_per_draw) on every seed must give the judge's scores too
    every = scores_per_draw(table[order], np.arange(len(grid.seeds))[None, :], "max")[:, 0]
    gap = max(max(abs(mine[k] - committed[k]), abs(mine[k] - s), abs(v - committed[k]))
              for k, s, v in zip(e.labels, e.score, every))
    return CeilingCase(e, record["mu_source"], table[order], tuple(grid.seeds),
                       "+".join(c["path"] for c in rec["curves"]), float(gap))


def load_cases(evidence: Path = EVIDENCE_PATH, results: Path = RESULTS,
               progress: bool = False) -> list[CeilingCase]:
    """Every committed case (``load_case``); ValueError if a full-seed score disagrees with
    the committed one by more than ``SANITY_TOL``."""
    cache: dict = {}
    records = json.loads(Path(evidence).read_text())
    cases = [load_case(r, Path(results), cache)
             for r in tqdm(records, desc="loading cases", disable=not progress)]
    worst = max(cases, key=lambda c: c.full_seed_gap)
    if worst.full_seed_gap > SANITY_TOL:
        raise ValueError(f"{worst.evidence.setting} mu {worst.mu_source}: a recomputed "
                         f"full-seed score differs from the committed one by "
                         f"{worst.full_seed_gap:.3g} (> {SANITY_TOL:g})")
    return cases


def advice_losses(cases: list[CeilingCase], advice: list[tuple[float, float]]) -> dict:
    """G3's two counts for ``advice`` (one (x, y) per case, scored at ``Evidence.scored_at``)
    on point estimates and beyond the 95% paired interval (``paired_difference`` of the
    advice's cell minus the rule's, or minus on-policy's, per seed at each cell's best
    learning rate): cases where the advice is worse than the rule, and, of the cases where
    on-policy's point estimate beats the rule's, those where it is worse than on-policy."""
    rule_point = rule_resolved = beaten = on_point = on_resolved = 0
    for case, xy in zip(cases, advice):
        e = case.evidence
        mine = best_lr_scores(case.table, e.scored_at(*xy))
        rule = e.nearest(RULE_HORIZON, math.sqrt(e.mu))
        reg = e.regret()
        d = paired_difference(mine, best_lr_scores(case.table, rule), "max", GAP_LEVEL)
        rule_point += bool(reg[e.scored_at(*xy)] > reg[rule] + TOLERANCE)
        rule_resolved += bool(d.high < 0)
        on = e.on_policy()
        if on is None or not reg[on] < reg[rule]:
            continue
        beaten += 1
        d = paired_difference(mine, best_lr_scores(case.table, on), "max", GAP_LEVEL)
        on_point += bool(reg[e.scored_at(*xy)] > reg[on] + TOLERANCE)
        on_resolved += bool(d.high < 0)
    return {"cases": len(cases), "level": GAP_LEVEL,
            "worse_than_rule": rule_point, "worse_than_rule_beyond_interval": rule_resolved,
            "on_policy_beats_rule": beaten, "worse_than_on_policy_there": on_point,
            "worse_than_on_policy_there_beyond_interval": on_resolved}


def gap_summary(gaps: list[PairedDifference | None]) -> dict:
    """Over the cases' ``rule_against_on_policy`` (None: no on-policy cell): how many there
    are, and in how many the 95% interval of the rule's cell minus on-policy covers 0, lies
    above it or lies below it."""
    gaps = [g for g in gaps if g is not None]
    return {"cases": len(gaps), "level": GAP_LEVEL,
            "covers_zero": sum(g.low <= 0 <= g.high for g in gaps),
            "rule_better": sum(g.low > 0 for g in gaps),
            "on_policy_better": sum(g.high < 0 for g in gaps)}


def report(cases: list[CeilingCase], outcomes: list[CaseOutcome], splits: int,
           seed: int) -> dict:
    """The JSON report: method, per arm (``ArmSummary``), the rule against on-policy
    (``gap_summary``), the calculator's advice with its family left out judged on point
    estimates and beyond the paired interval (``advice_losses``), per case
    (``case_record``) and the sanity check."""
    left_out = score_cases([c.evidence for c in cases], leave_out=True)
    gaps = [rule_against_on_policy(c) for c in cases]
    return {"method": METHOD, "splits": splits, "seed": seed,
            "tolerance": TOLERANCE, "percentiles": list(PERCENTILES),
            "warm_start": "the evidence's: median step-0 eval accuracy of every run (all "
                          "seeds) in the case's curves file",
            "arms": [asdict(s) for s in summarise(outcomes)],
            "rule_against_on_policy": gap_summary(gaps),
            "advice_left_out": advice_losses(cases, [c.advice for c in left_out]),
            "cases": [case_record(c, o, g) for c, o, g in zip(cases, outcomes, gaps)],
            "sanity": {"cases": len(cases),
                       "cells": int(sum(len(c.evidence.labels) for c in cases)),
                       "max_full_seed_gap": max(c.full_seed_gap for c in cases),
                       "tolerance": SANITY_TOL}}


def table_lines(doc: dict) -> list[str]:
    """The short table the command prints."""
    n = doc["sanity"]["cases"]
    lines = [f"{'arm':28s} {'failing cases of ' + str(n) + ': mean [p5, p95] min':>36s} "
             f"{'mean regret B':>14s} {'P(all pass)':>11s}"]
    for a in doc["arms"]:
        lines.append(f"{a['arm']:28s} {a['fails_mean']:15.2f} [{a['fails_p05']:5.2f}, "
                     f"{a['fails_p95']:5.2f}] {a['fails_min']:3d} {a['mean_regret_b']:14.3f} "
                     f"{a['p_all_pass']:11.3f}")
    g = doc["rule_against_on_policy"]
    lines.append(f"rule minus on-policy, paired by seed ({g['level']:.0%}): interval covers 0 "
                 f"in {g['covers_zero']} of {g['cases']} cases, rule better in "
                 f"{g['rule_better']}, on-policy better in {g['on_policy_better']}")
    a = doc["advice_left_out"]
    lines.append(f"advice, family left out: worse than the rule in {a['worse_than_rule']} "
                 f"of {a['cases']} ({a['worse_than_rule_beyond_interval']} beyond the paired "
                 f"interval), than a better on-policy in {a['worse_than_on_policy_there']} of "
                 f"{a['on_policy_beats_rule']} ({a['worse_than_on_policy_there_beyond_interval']}"
                 f" beyond it)")
    lines.append(f"sanity: largest full-seed gap {doc['sanity']['max_full_seed_gap']:.2e} over "
                 f"{doc['sanity']['cells']} cells; {doc['splits']} splits, seed {doc['seed']}")
    return lines


def main(argv=None) -> int:
    p = Parser.from_doc("python -m llm_experiments.study.verdicts.g3_ceiling", __doc__)
    p.add_argument("--out", type=output_file, required=True, help="the report (JSON)")
    p.add_argument("--splits", type=integer(1), default=SPLITS,
                   help=f"random halvings per grid, an integer >= 1 (default {SPLITS})")
    p.add_argument("--seed", type=integer(0), default=0, help="the splits' seed (>= 0)")
    p.add_argument("--evidence", default=str(EVIDENCE_PATH), help="the evidence file")
    p.add_argument("--results", default=str(RESULTS), help="the results folder")
    a = p.parse_args(argv)
    try:
        cases = load_cases(Path(a.evidence), Path(a.results), progress=True)
        outcomes = ceiling(cases, a.splits, a.seed, progress=True)
    except ValueError as exc:
        return p.report(exc)
    doc = report(cases, outcomes, a.splits, a.seed)
    write_json(a.out, doc)
    print("\n".join(table_lines(doc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
