"""``optimal_config``: turn costs and a noise model into a concrete replay configuration.

The continuous optimum (x*, y*) of section 5 (``design.optimal_design``) is turned into integers
and, given a number of GPUs, into a split of W inference workers and T trainers
(theory.md sections 3 and 5):

* synchronous (``gpus=None``): integer rollouts per step R, buffer size N and batch B, with
  x = N/R and y = B/R;
* asynchronous (``gpus=G``): the split sets the replay ratio, y = mu T / W (section 3), R is
  the average number of new rollouts per trainer step (B/y), N is a multiple of T (one shard
  of N/T rollouts per trainer), B is divisible by T.

Every candidate, on-policy training (N = B, each rollout used once) included, is scored by the
exact objective J(x, y) and the smallest wins. The predicted compute saving against on-policy
training at equal bound is 1 - J/J(1, 1) = 1 - gamma * V/V_on (gamma the compute ratio,
V/V_on the variance ratio per update).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import _validate as v
from .compute import mu_from_costs
from .design import ON_POLICY, REPLAY, Design, objective, optimal_design, optimal_horizon
from .noise import NoiseModel, PowerLawNoise


@dataclass(frozen=True)
class Config:
    """A concrete replay configuration and its predicted effect.

    Attributes:
        buffer_size: N, rollouts kept (FIFO). batch_size: B, rollouts per update.
        rollouts_per_step: R, new rollouts per update (an average in the asynchronous case).
        workers, trainers: W and T (None for a synchronous design without a GPU count).
        horizon: x = N/R, staleness horizon in steps. replay_ratio: y = B/R, average uses.
        compute_ratio: gamma, cost per update over an on-policy update, (1 + W/T)/(1 + mu) or
            (1 + mu/y)/(1 + mu) synchronously; 1 for on-policy training.
        variance_ratio: gradient variance per update over on-policy's (model prediction).
        predicted_saving: 1 - J/J(1, 1): predicted share of compute saved against on-policy
            training to reach the same convergence bound (negative: more compute).
        regime: "on-policy" or "replay". steps: updates the budget affords (if given).
        explanation: a short human summary. notes: caveats. design: the continuous optimum.
    """

    buffer_size: int
    batch_size: int
    rollouts_per_step: float
    workers: int | None
    trainers: int | None
    horizon: float
    replay_ratio: float
    compute_ratio: float
    variance_ratio: float
    predicted_saving: float
    regime: str
    mu: float
    rho: float
    steps: float | None
    explanation: str
    design: Design
    notes: tuple[str, ...] = field(default=())

    @property
    def on_policy(self) -> bool:
        return self.regime == ON_POLICY

    def to_dict(self) -> dict:
        d = {k: val for k, val in self.__dict__.items() if k not in ("design", "notes")}
        d["notes"] = list(self.notes)
        d["design"] = self.design.to_dict()
        return d


def _batch_candidates(batch_size) -> list[int]:
    if isinstance(batch_size, (tuple, list)):
        if len(batch_size) != 2:
            raise ValueError(f"batch_size must be an integer >= 1 or a (min, max) pair, "
                             f"got {batch_size!r}")
        lo = v.integer("batch_size[0]", batch_size[0], 1)
        hi = v.integer("batch_size[1]", batch_size[1], lo)
        return list(range(lo, hi + 1))
    return [v.integer("batch_size", batch_size, 1)]


def _near_ints(value: float, lo: int, hi: float, step: int = 1) -> set[int]:
    """Multiples of ``step`` within [lo, hi] nearest to ``value`` (two on each side)."""
    if not math.isfinite(value):
        value = hi
    base = int(math.floor(min(max(value, lo), hi) / step)) * step
    out = {base + k * step for k in range(-2, 4)}
    return {c for c in out if lo <= c <= hi}


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def optimal_config(mu: float | None = None, rho: float = 0.1, noise: NoiseModel | None = None,
                   *, alpha: float | None = None, tau: float = 1.0,
                   generation_cost: float | None = None, train_cost: float | None = None,
                   gpus: int | None = None, trainers: int | None = None, batch_size=60,
                   divisible_by_trainers: bool = True, budget: float | None = None,
                   min_steps: int | None = None, max_buffer_size: int | None = None,
                   max_horizon: float = 1000.0, average: str | None = None) -> Config:
    """The replay configuration the theory recommends for your costs and noise (section 5).

    Args:
        mu: generation cost of one batch over one trainer update, in (0, inf); or give
            ``generation_cost`` and ``train_cost`` (same unit, each > 0) instead.
        rho: coupling coefficient of buffer samples, in [0, 1].
        noise: a staleness-noise model; or give ``alpha`` >= 0 (and ``tau`` > 0) for the power
            law sigma(s) = (s/tau)^alpha.
        gpus: GPUs to split into workers and trainers (integer >= 2), or None for the
            synchronous design (integer R new rollouts per step).
        trainers: fix T (1 <= T < gpus) instead of searching every split.
        batch_size: B (integer >= 1) or an inclusive (min, max) range to search.
        divisible_by_trainers: require B and N to be multiples of T (sharded buffer).
        budget: total compute in trainer-update units (> 0), with ``min_steps`` the fewest
            updates it must afford (integer >= 1); configurations below are excluded.
        max_buffer_size: largest N allowed (integer >= the smallest batch), e.g. memory.
        max_horizon: largest x = N/R considered, in steps (> 1); caps unbounded optima.
        average: sigma_bar^2 average ("discrete"/"continuous"), the model's default if None.

    Returns:
        A frozen ``Config``. On-policy (N = B, each rollout used once) is a first-class answer.
    Raises:
        ValueError: an argument outside its range (the message names it), or no
            configuration satisfies the constraints.
    """
    if mu is None:
        if generation_cost is None or train_cost is None:
            raise ValueError("give mu, or both generation_cost and train_cost")
        mu = mu_from_costs(generation_cost, train_cost)
    elif generation_cost is not None or train_cost is not None:
        raise ValueError("give either mu or (generation_cost, train_cost), not both")
    mu = v.positive("mu", mu)
    rho = v.unit_interval("rho", rho)
    if noise is None:
        if alpha is None:
            raise ValueError("give a noise model (noise=...) or the power-law alpha (>= 0)")
        noise = PowerLawNoise(alpha=alpha, tau=tau)
    elif alpha is not None:
        raise ValueError("give either noise or alpha, not both")
    batches = _batch_candidates(batch_size)
    max_horizon = v.real("max_horizon", max_horizon, 1.0, math.inf, lo_open=True)
    if max_buffer_size is not None:
        max_buffer_size = v.integer("max_buffer_size", max_buffer_size, 1)
        if max_buffer_size < min(batches):
            raise ValueError(f"max_buffer_size must be >= batch_size ({min(batches)}): a batch "
                             f"is drawn from the buffer; got {max_buffer_size}")
    n_cap = max_buffer_size if max_buffer_size is not None else math.inf
    if gpus is not None:
        gpus = v.integer("gpus", gpus, 2)
        if trainers is not None:
            trainers = v.integer("trainers", trainers, 1, gpus - 1)
    elif trainers is not None:
        raise ValueError("trainers needs gpus (the GPU count to split)")
    if min_steps is not None:
        min_steps = v.integer("min_steps", min_steps, 1)
        if budget is None:
            raise ValueError("min_steps needs budget (total compute in trainer updates)")
    if budget is not None:
        budget = v.positive("budget", budget)

    design = optimal_design(mu, rho, noise, average=average)
    avg = design.average
    notes = list(design.notes)
    j_on = design.on_policy_objective

    def score(x, y):
        return float(objective(x, y, mu=mu, rho=rho, noise=noise, average=avg))

    def steps_for(cost_per_update):
        return None if budget is None else budget / cost_per_update

    horizon_cache: dict[float, float] = {}

    def horizon_at(y):
        """Best x for this replay ratio (the split or R fixes y), capped by max_horizon."""
        if y not in horizon_cache:
            horizon_cache[y] = min(optimal_horizon(y, mu=mu, rho=rho, noise=noise,
                                                   average=avg, x_max=max_horizon), max_horizon)
        return horizon_cache[y]

    # Each candidate: (J, N, B, R, W, T, cost per update).
    candidates = []
    if gpus is None:
        for b in batches:
            r_target = b / design.replay_ratio if design.replay_ratio > 0 else b
            for r in _near_ints(r_target, 1, 10 * b) | {b}:
                n_lo = max(b, r)
                n_hi = min(n_cap, max_horizon * r)
                if n_lo > n_cap:
                    continue
                for n in _near_ints(horizon_at(b / r) * r, n_lo, max(n_hi, n_lo)) | {n_lo}:
                    candidates.append((score(n / r, b / r), n, b, float(r), None, None,
                                       1 + mu * r / b))
    else:
        splits = [trainers] if trainers is not None else range(1, gpus)
        for t in splits:
            w = gpus - t
            y = mu * t / w
            step = t if divisible_by_trainers else 1
            for b in batches:
                if b % step:
                    continue
                r = b / y
                n_lo = _round_up(b, step)
                if n_lo > n_cap:
                    continue
                n_hi = max(min(n_cap, max_horizon * r), n_lo)
                for n in _near_ints(horizon_at(y) * r, n_lo, n_hi, step) | {n_lo}:
                    candidates.append((score(n / r, y), n, b, r, w, t, 1 + w / t))
    if not candidates:
        raise ValueError("no configuration satisfies the constraints: check that batch_size "
                         "has a value divisible by the number of trainers and that "
                         "max_buffer_size >= batch_size")
    if min_steps is not None:
        candidates = [c for c in candidates if steps_for(c[6]) >= min_steps]
        if not candidates:
            raise ValueError(f"no replay configuration affords min_steps = {min_steps} "
                             f"updates with budget = {budget:g}")

    best = min(candidates, key=lambda c: c[0])
    if best[0] >= j_on or design.regime == ON_POLICY:
        # On-policy: N = B = R, every rollout used once, no buffer; ideal split W/T ~ mu.
        b = batches[0]
        w = t = None
        if gpus is not None:
            t_opts = [trainers] if trainers is not None else range(1, gpus)
            t = min((tt for tt in t_opts
                     if not divisible_by_trainers or any(bb % tt == 0 for bb in batches)),
                    key=lambda tt: abs((gpus - tt) / tt - mu), default=None)
            if t is None:
                raise ValueError("no split has a batch_size divisible by its trainer count")
            w = gpus - t
            if divisible_by_trainers:
                b = next(bb for bb in batches if bb % t == 0)
        cfg = dict(n=b, b=b, r=float(b), w=w, t=t, x=1.0, y=1.0, gamma=1.0, var_ratio=1.0,
                   saving=0.0, regime=ON_POLICY, steps=steps_for(1 + mu))
        if design.regime == REPLAY:
            notes.append("no integer configuration under the constraints beats on-policy "
                         "training, although the continuous optimum is a replay design")
    else:
        j, n, b, r, w, t, cost = best
        x, y = n / r, b / r
        gamma = cost / (1 + mu)
        cfg = dict(n=n, b=b, r=r, w=w, t=t, x=x, y=y, gamma=gamma,
                   var_ratio=(j / j_on) / gamma, saving=1 - j / j_on, regime=REPLAY,
                   steps=steps_for(cost))
        if math.isinf(design.horizon) or design.horizon > max_horizon:
            notes.append(f"horizon capped at max_horizon = {max_horizon:g} steps")
        if max_buffer_size is not None and n == max_buffer_size:
            notes.append("buffer size capped at max_buffer_size")
        if cfg["steps"] is not None and x > cfg["steps"] / 10:
            notes.append("the horizon is not small against the number of updates: the "
                         "asymptotic design is only indicative")
    return Config(buffer_size=int(cfg["n"]), batch_size=int(cfg["b"]),
                  rollouts_per_step=float(cfg["r"]), workers=cfg["w"], trainers=cfg["t"],
                  horizon=float(cfg["x"]), replay_ratio=float(cfg["y"]),
                  compute_ratio=float(cfg["gamma"]), variance_ratio=float(cfg["var_ratio"]),
                  predicted_saving=float(cfg["saving"]), regime=cfg["regime"], mu=mu, rho=rho,
                  steps=cfg["steps"], explanation=_explain(cfg, mu, rho, noise, gpus),
                  design=design, notes=tuple(notes))


def _describe_noise(noise) -> str:
    d = noise.to_dict()
    if d["model"] == "power_law":
        return f"staleness noise sigma(s) = (s/{d['tau']:g})^{d['alpha']:g}"
    if d["model"] == "constant":
        return "staleness noise constant in staleness"
    return f"a measured noise table ({len(d['staleness'])} staleness values)"


def _explain(cfg, mu, rho, noise, gpus) -> str:
    head = (f"Generating a batch costs mu = {mu:.3g} trainer updates; {_describe_noise(noise)},"
            f" coupling rho = {rho:g}.")
    split = ""
    if cfg["w"] is not None:
        split = (f" Split the {gpus} GPUs into {cfg['w']} worker{'s' * (cfg['w'] > 1)} and "
                 f"{cfg['t']} trainer{'s' * (cfg['t'] > 1)}.")
    if cfg["regime"] == ON_POLICY:
        return (f"{head} Stay on-policy: no buffer (N = B = {cfg['b']}), each rollout used "
                f"once.{split} The model predicts no compute saving from replay here.")
    saving = cfg["saving"]
    verdict = (f"predicted compute to reach the same loss bound: {100 * saving:.0f}% less "
               f"than on-policy" if saving >= 0 else
               f"predicted {100 * -saving:.0f}% more compute than on-policy")
    return (f"{head} Keep a FIFO buffer of the last {cfg['n']} rollouts "
            f"({cfg['x']:.3g} steps of generation) and train on batches of {cfg['b']} "
            f"with {cfg['r']:.3g} new rollouts per step, so each rollout is used about "
            f"{cfg['y']:.3g} times.{split} An update costs {cfg['gamma']:.2f} of an on-policy "
            f"update and is {cfg['var_ratio']:.2f}x as noisy; {verdict}.")


def design_grid(mus, alphas, rho: float, *, average: str | None = None) -> dict:
    """Optimal designs over a (mu, alpha) grid of power-law models (section 5).

    Args: mus, alphas: 1-d arrays (mu > 0, alpha >= 0); rho in [0, 1].
    Returns: dict of 2-d arrays (len(mus) x len(alphas)): "horizon", "replay_ratio",
    "predicted_saving", and "on_policy" (bool).
    """
    mus = v.finite_array("mus", mus)
    alphas = v.finite_array("alphas", alphas, nonnegative_values=True)
    out = {k: np.empty((mus.size, alphas.size)) for k in
           ("horizon", "replay_ratio", "predicted_saving")}
    out["on_policy"] = np.empty((mus.size, alphas.size), dtype=bool)
    for i, mu in enumerate(mus):
        for j, a in enumerate(alphas):
            d = optimal_design(float(mu), rho, PowerLawNoise(float(a)), average=average)
            out["horizon"][i, j] = d.horizon
            out["replay_ratio"][i, j] = d.replay_ratio
            out["predicted_saving"][i, j] = d.predicted_saving
            out["on_policy"][i, j] = d.regime == ON_POLICY
    return out
