"""Advice from measurement: a loss, a horizon and a replay ratio chosen from the committed
grids so that, on every setting measured at the user's run length and mu, the advice loses no
more than the rule x = 64, y = sqrt(mu), nor than on-policy training where on-policy beats the
rule (theory.md section 13).

No horizon model predicts the measured optima (sections 11.10-11.19), so the horizon is taken
from evidence, not from the model. The evidence (``EVIDENCE_PATH``, written by
``python -m replaytheory.evidence``) holds, per judged grid window (setting, run
length T, mu), every cell's AUC point estimate and the warm start's accuracy. The regret of a
cell is the share of the best cell's gain over the warm start that it loses,
(best - cell) / (best - warm start) (``stats.verdicts.regret_gain``).

``advise`` keeps the evidence at the run length nearest the user's (log scale; the longest
runs when it is not given) and, per setting, the mu nearest the user's; a candidate (x, y) is
scored in each setting at its nearest grid cell (log distance, the worse of equally near
cells). Among the candidates whose regret is at most min(rule's, on-policy's) in every kept
setting it takes the one of least mean regret; when none is, the one whose largest excess over
that bound is least. The band is every candidate within ``epsilon`` of the advice's mean
regret. In-sample the dominance holds by construction wherever a candidate satisfies it;
``score_cases(..., leave_out=True)`` is the honest test: each setting's advice from the other
families' evidence alone.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import checks
from .adaptive_advice import AdaptiveAdvice, AdaptivePair, choose_adaptive, load_adaptive_evidence
from .loss_advice import LossComparison, LossGrid, choose_loss, describe, load_loss_evidence

EVIDENCE_PATH = Path(__file__).resolve().parent / "data" / "horizon_evidence.json"
RULE_HORIZON = 64.0  # the rule's x (updates); its y is sqrt(mu)
GOAL_MEAN = 0.05  # issue 36 G3: the advice's mean regret at most this
EPSILON = 0.02  # the band: mean regret within this of the advice's (share of the best gain)
ON_POLICY = "on-policy"


@dataclass(frozen=True)
class Evidence:
    """One judged grid window: cell labels, horizons x and replay ratios y (on-policy x = y =
    1), AUC scores, the warm start's accuracy; setting, family, run_updates (T), mu."""

    setting: str
    family: str
    run_updates: int
    mu: float
    warm_start: float
    labels: tuple[str, ...]
    x: np.ndarray
    y: np.ndarray
    score: np.ndarray

    @classmethod
    def from_record(cls, r: dict) -> "Evidence":
        cells = r["cells"]
        return cls(r["setting"], r["family"], int(r["run_updates"]), float(r["mu"]),
                   float(r["warm_start"]), tuple(c["label"] for c in cells),
                   np.array([c["x"] for c in cells], float),
                   np.array([c["y"] for c in cells], float),
                   np.array([c["score"] for c in cells], float))

    def regret(self) -> np.ndarray:
        """Each cell's regret, (best - cell) / (best - warm start)."""
        best = np.nanmax(self.score)
        return (best - self.score) / (best - self.warm_start)

    def nearest(self, x: float, y: float) -> int:
        """The cell nearest (x, y) in log distance; of equally near cells the worse."""
        d = np.hypot(np.log(self.x / x), np.log(self.y / y))
        near = np.flatnonzero(d <= d.min() + 1e-9)
        return int(near[np.argmax(self.regret()[near])])

    def on_policy(self) -> int | None:
        """The on-policy cell's index, None when the grid has none."""
        return self.labels.index(ON_POLICY) if ON_POLICY in self.labels else None

    def scored_at(self, x: float, y: float) -> int:
        """The cell that advice of (x, y) is scored at: on-policy's when x <= 1 and y <= 1 (the
        advice then says on-policy) and the grid has it, else ``nearest`` (a grid's buffer of
        one step at y = 1 is as near (1, 1) but is not on-policy training)."""
        on = self.on_policy()
        return on if on is not None and x <= 1 and y <= 1 else self.nearest(x, y)

    def bound(self, mu: float) -> float:
        """The regret the advice may not exceed here: the rule's, or on-policy's where it is
        smaller."""
        reg = self.regret()
        rule = reg[self.nearest(RULE_HORIZON, math.sqrt(mu))]
        on = self.on_policy()
        return float(rule if on is None else min(rule, reg[on]))


def load_evidence(path: str | Path = EVIDENCE_PATH) -> list[Evidence]:
    """The evidence records of ``path`` (a JSON list, ``evidence.collect``)."""
    return [Evidence.from_record(r) for r in json.loads(Path(path).read_text())]


@dataclass(frozen=True)
class Spread:
    """A quantity over the kept settings: its mean, least and largest value."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values) -> "Spread":
        v = np.asarray(values, float)
        return cls(float(v.mean()), float(v.min()), float(v.max()))


@dataclass(frozen=True)
class BandMember:
    """A candidate within the band: x, y and its regret over the kept settings (mean, least,
    largest)."""

    horizon: float
    replay_ratio: float
    regret: float
    regret_low: float
    regret_high: float


@dataclass(frozen=True)
class Advice:
    """What to run and why (see the module docstring).

    loss: the trainer loss (``trainer.loss`` / TRL ``loss_type``), chosen by
    ``loss_advice.choose_loss``; loss_comparisons: each stale-rollout loss minus grpo at the
    advised horizon on the loss grids it was chosen from. horizon: x in trainer
    updates (1 = on-policy). replay_ratio: y, average uses of a rollout. band: the
    candidates within ``epsilon`` of the advice's mean regret, horizon-sorted. regret,
    rule_regret, on_policy_regret: mean regret over the kept settings of the advice, the rule
    and on-policy (None without on-policy cells). dominates: whether the advice's regret is
    at most min(rule's, on-policy's) in every kept setting. gain: the advice's AUC minus
    on-policy's over the kept settings (a ``Spread``, accuracy points, at equal compute at
    the matched mu; None without on-policy cells). evidence: the settings kept;
    run_updates, mu: where they were matched. provenance: where each part comes from.
    adaptive: the adaptive buffer as an alternative to the fixed horizon
    (``adaptive_advice.choose_adaptive``, theory.md 13.2; ``adaptive.named`` says whether the
    rule names it), None for on-policy advice or a loss it was not measured with.
    """

    loss: str
    horizon: float
    replay_ratio: float
    band: tuple[BandMember, ...]
    epsilon: float
    regret: float
    rule_regret: float
    on_policy_regret: float | None
    dominates: bool
    gain: Spread | None
    evidence: tuple[str, ...]
    run_updates: int
    mu: float
    provenance: dict = field(default_factory=dict)
    loss_comparisons: tuple[LossComparison, ...] = ()
    adaptive: AdaptiveAdvice | None = None

    @property
    def on_policy(self) -> bool:
        return self.horizon <= 1.0 and self.replay_ratio <= 1.0

    def names(self, rollouts_per_step: int) -> dict:
        """The advice in the names users know, for R = ``rollouts_per_step`` (integer >= 1)
        new rollouts per update: ``loss_type``; ``max_staleness`` (x, the largest version lag
        a rollout may have when used: AReaL's ``max_head_offpolicyness``, verl's staleness
        bound); ``replay_buffer_size`` (N = x R rollouts); ``batch_size`` (B = y R);
        ``per_device_train_batch_size`` (R, for ``ReplayGRPOTrainer``); and
        ``steps_per_generation`` (1: a generation every update; TRL's k > 1 only batches
        generation, the horizon and the replay ratio stay those of the buffer)."""
        r = checks.integer("rollouts_per_step", rollouts_per_step, 1)
        return {"loss_type": self.loss, "max_staleness": int(round(self.horizon)),
                "replay_buffer_size": int(round(self.horizon * r)),
                "batch_size": max(1, int(round(self.replay_ratio * r))),
                "per_device_train_batch_size": r, "steps_per_generation": 1}

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("band", "gain")}
        d["band"] = [b.__dict__ for b in self.band]
        d["loss_comparisons"] = [c.__dict__ for c in self.loss_comparisons]
        d["gain"] = None if self.gain is None else self.gain.__dict__
        d["adaptive"] = None if self.adaptive is None else self.adaptive.to_dict()
        d["evidence"] = list(self.evidence)
        return d


def matched(evidence: list[Evidence], mu: float, run_updates: int | None) -> list[Evidence]:
    """The evidence at the run length nearest ``run_updates`` (log scale; the longest when
    None) and, per setting, at the mu nearest ``mu`` (log scale)."""
    if not evidence:
        return []
    lengths = sorted({e.run_updates for e in evidence})
    t = lengths[-1] if run_updates is None else min(
        lengths, key=lambda L: (abs(math.log(L / run_updates)), -L))
    out: dict[str, Evidence] = {}
    for e in evidence:
        if e.run_updates != t:
            continue
        have = out.get(e.setting)
        if have is None or abs(math.log(e.mu / mu)) < abs(math.log(have.mu / mu)):
            out[e.setting] = e
    return [out[k] for k in sorted(out)]


def _candidates(kept: list[Evidence]) -> list[tuple[float, float]]:
    """Every (x, y) of the kept grids' cells, sorted."""
    return sorted({(float(x), float(y)) for e in kept for x, y in zip(e.x, e.y)})


def _regrets(kept: list[Evidence], x: float, y: float) -> np.ndarray:
    return np.array([e.regret()[e.nearest(x, y)] for e in kept])


def _choose(kept: list[Evidence], mu: float) -> tuple[tuple[float, float], np.ndarray, bool]:
    """((x, y), its regrets per kept setting, whether it dominates) by the module's rule."""
    bounds = np.array([e.bound(mu) for e in kept])
    scored = [(c, _regrets(kept, *c)) for c in _candidates(kept)]
    feasible = [(c, r) for c, r in scored if np.all(r <= bounds + 1e-12)]
    if feasible:
        c, r = min(feasible, key=lambda cr: (cr[1].mean(), cr[0]))
        return c, r, True
    c, r = min(scored, key=lambda cr: (np.max(cr[1] - bounds), cr[1].mean(), cr[0]))
    return c, r, False


def advise(mu: float, run_updates: int | None = None, *, evidence: list[Evidence] | None = None,
           exclude_families=(), epsilon: float = EPSILON,
           loss_evidence: list[LossGrid] | None = None,
           adaptive_evidence: list[AdaptivePair] | None = None) -> Advice:
    """The advice for cost ratio ``mu`` (> 0) and a run of ``run_updates`` trainer updates
    (integer >= 1, or None: the longest runs measured), from ``evidence`` (default: the
    committed ``EVIDENCE_PATH``) less ``exclude_families``; ``epsilon`` in [0, 1) the band's
    width in regret; the loss from ``loss_evidence`` (default: the committed
    ``loss_advice.LOSS_EVIDENCE_PATH``); the adaptive alternative from ``adaptive_evidence``
    (default: the committed ``adaptive_advice.ADAPTIVE_EVIDENCE_PATH``). With no evidence left
    the horizon is the rule x = 64, y = sqrt(mu), said so."""
    mu = checks.positive("mu", mu)
    if run_updates is not None:
        run_updates = checks.integer("run_updates", run_updates, 1)
    epsilon = checks.real("epsilon", epsilon, 0.0, 1.0, hi_open=True)
    pool = load_evidence() if evidence is None else evidence
    grids = load_loss_evidence() if loss_evidence is None else loss_evidence
    pairs = load_adaptive_evidence() if adaptive_evidence is None else adaptive_evidence
    kept = matched([e for e in pool if e.family not in set(exclude_families)], mu, run_updates)
    if not kept:
        return _rule_only(mu, run_updates, grids, pairs)
    (x, y), reg, dominates = _choose(kept, mu)
    loss, comparisons = choose_loss(x, y, grids)
    adaptive = choose_adaptive(loss, x <= 1.0 and y <= 1.0, pairs)
    band = []
    for c in _candidates(kept):
        r = _regrets(kept, *c)
        if r.mean() <= reg.mean() + epsilon:
            band.append(BandMember(c[0], c[1], float(r.mean()), float(r.min()), float(r.max())))
    rule = np.array([e.regret()[e.nearest(RULE_HORIZON, math.sqrt(mu))] for e in kept])
    ons = [e for e in kept if e.on_policy() is not None]
    gains = np.array([e.score[e.nearest(x, y)] - e.score[e.on_policy()] for e in ons])
    return Advice(
        loss=loss, horizon=x, replay_ratio=y, band=tuple(band), epsilon=epsilon,
        regret=float(reg.mean()), rule_regret=float(rule.mean()),
        on_policy_regret=float(np.mean([e.regret()[e.on_policy()] for e in ons]))
        if ons else None, dominates=dominates,
        gain=Spread.of(gains) if ons else None,
        evidence=tuple(e.setting for e in kept), run_updates=kept[0].run_updates,
        mu=float(np.median([e.mu for e in kept])),
        loss_comparisons=comparisons, adaptive=adaptive,
        provenance={"loss": describe(loss, comparisons),
                    "horizon": f"measured: {len(kept)} settings at T = "
                               f"{kept[0].run_updates} updates (section 13)",
                    "replay_ratio": "measured, with the horizon (one grid cell)",
                    "band": f"measured: mean regret within {epsilon:g} of the advice's",
                    **_adaptive_line(adaptive)})


def _adaptive_line(adaptive: AdaptiveAdvice | None) -> dict:
    return {} if adaptive is None else {"adaptive": adaptive.reason}


def _rule_only(mu: float, run_updates: int | None, grids: list[LossGrid],
               pairs: list[AdaptivePair]) -> Advice:
    y = max(1.0, math.sqrt(mu))
    loss, comparisons = choose_loss(RULE_HORIZON, y, grids)
    adaptive = choose_adaptive(loss, False, pairs)
    return Advice(loss=loss, horizon=RULE_HORIZON, replay_ratio=y, band=(),
                  epsilon=EPSILON, regret=math.nan, rule_regret=math.nan,
                  on_policy_regret=None, dominates=False, gain=None, evidence=(),
                  run_updates=run_updates or 0, mu=mu,
                  provenance={"horizon": "the rule x = 64, y = sqrt(mu): no evidence",
                              "replay_ratio": "the rule", "loss": describe(loss, comparisons),
                              **_adaptive_line(adaptive)},
                  loss_comparisons=comparisons, adaptive=adaptive)


@dataclass(frozen=True)
class Case:
    """One evidence record scored: the advice's (x, y), and its regret, the rule's and
    on-policy's (None without on-policy) there."""

    setting: str
    run_updates: int
    mu: float
    advice: tuple[float, float]
    regret: float
    rule_regret: float
    on_policy_regret: float | None

    @property
    def bound(self) -> float:
        return self.rule_regret if self.on_policy_regret is None else min(
            self.rule_regret, self.on_policy_regret)


def score_cases(evidence: list[Evidence] | None = None, *, leave_out: bool = False) -> list[Case]:
    """The advice scored on every evidence record at its own (mu, T): from all the evidence
    (``leave_out`` False, in sample) or from the other families' alone (True)."""
    pool = load_evidence() if evidence is None else evidence
    cases = []
    for e in pool:
        a = advise(e.mu, e.run_updates, evidence=pool,
                   exclude_families=(e.family,) if leave_out else ())
        cases.append(case_at(e, (a.horizon, a.replay_ratio)))
    return cases


def case_at(e: Evidence, cell: tuple[float, float]) -> Case:
    """The record ``e`` scored at ``cell`` (x, y): its regret there, the rule's and
    on-policy's."""
    reg = e.regret()
    on = e.on_policy()
    return Case(e.setting, e.run_updates, e.mu, cell, float(reg[e.scored_at(*cell)]),
                float(reg[e.nearest(RULE_HORIZON, math.sqrt(e.mu))]),
                None if on is None else float(reg[on]))


def goal_summary(cases: list[Case]) -> dict:
    """Means over scored cases and the counts issue 36's G3 reads (section 13): cases worse
    than the rule, cases where on-policy beats the rule and, of those, cases worse than
    on-policy; ``goal_met`` when both counts are 0 and the mean regret <= ``GOAL_MEAN``."""
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
