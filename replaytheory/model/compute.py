"""Compute model of the producer/consumer system (theory.md section 3).

Units: ``C`` is the trainer compute of one update (forward + backward + optimizer step on one
batch). ``mu`` is the compute to generate one batch worth of rollouts, in units of ``C``.
All costs below are in units of ``C`` unless stated otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import checks

# The paper's printed gamma tables (theory.md section 3): splits (W, T) and printed values.
PAPER_SPLITS: tuple[tuple[int, int], ...] = ((7, 1), (6, 2), (5, 3), (4, 4), (2, 6), (1, 7))
PAPER_GAMMA_TABLES: dict[str, dict] = {
    "Qwen2.5-7B": {"mu": 5.28, "printed": (1.29, 0.65, 0.43, 0.32, 0.22, 0.18)},
    "Qwen3-0.6B": {"mu": 6.84, "printed": (1.02, 0.41, 0.34, 0.26, 0.17, 0.15)},
}


def cost_per_update(mu: float, *, workers: int | None = None, trainers: int | None = None,
                    buffer: bool = False) -> float:
    """Compute per trainer update, in units of C (theory.md section 3).

    Without a buffer (``buffer=False``): ``1 + mu``, the ideal with no idle GPU (needs
    W/T = mu). With a buffer: ``1 + W/T``, production decoupled from consumption.

    Args:
        mu: generation cost of one batch over C, in (0, inf).
        workers, trainers: the GPU split W, T >= 1 (required with ``buffer=True``).
        buffer: whether a replay buffer decouples producers and consumers.
    """
    mu = checks.positive("mu", mu)
    if not buffer:
        return 1.0 + mu
    if workers is None or trainers is None:
        raise ValueError("workers and trainers are required with buffer=True (integers >= 1)")
    w = checks.integer("workers", workers, 1)
    t = checks.integer("trainers", trainers, 1)
    return 1.0 + w / t


def compute_ratio(workers: int, trainers: int, mu: float) -> float:
    """Compute ratio gamma = (1 + W/T) / (1 + mu) of buffer over no-buffer cost per update.

    theory.md section 3. ``gamma < 1`` means each update is cheaper with the buffer (each
    rollout is reused on average ``mu T / W`` times).

    Args:
        workers: inference workers W, integer >= 1.
        trainers: trainers T, integer >= 1.
        mu: generation cost of one batch over C, in (0, inf).

    >>> round(compute_ratio(6, 2, 6.84), 4)
    0.5102
    """
    return cost_per_update(mu, workers=workers, trainers=trainers, buffer=True) \
        / cost_per_update(mu)


def generation_share(mu: float) -> float:
    """Share of compute spent on generation without a buffer, mu / (1 + mu) (section 3)."""
    mu = checks.positive("mu", mu)
    return mu / (1.0 + mu)


def expected_replay_ratio(workers: int, trainers: int, mu: float) -> float:
    """Expected average replay ratio mu * T / W of the asynchronous system (section 3).

    This is the average number of gradient steps each rollout takes part in when W workers
    produce and T trainers consume at full speed.
    """
    w = checks.integer("workers", workers, 1)
    t = checks.integer("trainers", trainers, 1)
    mu = checks.positive("mu", mu)
    return mu * t / w


def estimate_mu(unique_rollouts: int, samples_consumed: int, workers: int = 1,
                trainers: int = 1) -> float:
    """Estimate mu from the counts of a run: mu ~= (K_train / T) / (K_inf / W) (section 3).

    In an asynchronous run where every GPU is busy, the average replay ratio is
    K_train / K_inf = mu T / W, so mu = (K_train / K_inf) * (W / T).

    Args:
        unique_rollouts: K_inf, unique rollouts generated, integer >= 1.
        samples_consumed: K_train = steps x batch size, repeats counted, integer >= 1.
        workers: W >= 1 (1 for a synchronous run measured on one device).
        trainers: T >= 1.
    """
    k_inf = checks.integer("unique_rollouts", unique_rollouts, 1)
    k_train = checks.integer("samples_consumed", samples_consumed, 1)
    w = checks.integer("workers", workers, 1)
    t = checks.integer("trainers", trainers, 1)
    return (k_train / t) / (k_inf / w)


def mu_from_costs(generation_cost: float, train_cost: float) -> float:
    """mu from raw costs: (cost to generate one batch of rollouts) / (cost of one update).

    Both in the same unit (seconds, GPU-hours, FLOPs), each in (0, inf).
    """
    gen = checks.positive("generation_cost", generation_cost)
    train = checks.positive("train_cost", train_cost)
    return gen / train


@dataclass(frozen=True)
class GammaRow:
    """One row of a gamma table: a split, the formula's value and, if any, the paper's."""

    workers: int
    trainers: int
    gamma: float
    printed: float | None = None

    @property
    def matches_print(self) -> bool | None:
        """Whether the printed value equals the formula rounded to 2 decimals (within 0.02)."""
        if self.printed is None:
            return None
        return abs(self.printed - self.gamma) <= 0.02 + 1e-12


def gamma_table(mu: float, splits=PAPER_SPLITS, printed=None) -> list[GammaRow]:
    """gamma(W, T, mu) for each split; compare with printed values when given (section 3).

    A printed value more than 0.02 from the formula is flagged by ``matches_print`` False:
    for Qwen3-0.6B the paper prints 0.41 at (6, 2) where the formula gives 0.51.
    """
    rows = []
    for i, (w, t) in enumerate(splits):
        p = None if printed is None else float(printed[i])
        rows.append(GammaRow(int(w), int(t), compute_ratio(w, t, mu), p))
    return rows


def paper_gamma_tables() -> dict[str, list[GammaRow]]:
    """The paper's two gamma tables recomputed from the formula beside the printed values."""
    return {name: gamma_table(spec["mu"], PAPER_SPLITS, spec["printed"])
            for name, spec in PAPER_GAMMA_TABLES.items()}
