"""The noisy quadratic of the synchronous simulator: assumptions A1-A3 hold by construction.

F(theta) = ||theta||^2 / 2 in R^d (A1 with L = 1). At step t the per-sample gradient of the
rollout in buffer slot i, inserted at step t_i (staleness s = t - t_i), is

    G(theta_t, z_i) = theta_t + kappa (theta_{t_i} - theta_t) + sigma(s) u_{t,i},

with u_{t,i} fresh at every step (E||u||^2 = 1), the same vector when slot i is drawn twice in
one batch, and correlated across slots as corr(u_i, u_j) = rho |t_i - t_j| / N for i != j:

* A2 holds with equality: ||E[eps | past]|| = kappa ||theta_t - theta_{t_i}||.
* A3: sigma^2(s) = ((s + offset) / tau)^(2 alpha), non-decreasing; the half-step default
  offset makes the buffer's average of sigma^2 the midpoint rule for section 5's continuous
  average (1/H) int_0^H (u/tau)^(2 alpha) du, so the design's closed form is the right
  comparison; the coupling bound holds with equality.

The coupling matrix I + rho |a - b| / N is positive semi-definite only while rho times the
horizon stays small (about rho H < 5): A3's gap form cannot hold with equality over a long
horizon. Cells outside that range are refused (``check_cell``).

Only the minibatch mean of the noise moves theta. Given the drawn slots it is Gaussian with
total power Q_t = (1/B^2) [sum_i m_i^2 sigma_i^2 + sum_{a != b} M_a M_b sigma_a sigma_b
rho |a - b| / N] (m_i draws of slot i, M_a draws of staleness a), so non-probe steps draw it
directly. ``expected_loss`` integrates that Gaussian out exactly (a Rao-Blackwellised loss:
mean and lag covariance of theta given the draws), which keeps the sampling of the buffer
(duplicates, staleness mix, coupling) and removes the chi-square noise of ||theta||^2.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .. import checks


@dataclass(frozen=True)
class QuadraticProblem:
    """Parameters of the noisy quadratic (module docstring; theory.md sections 4-5).

    Args:
        dim: d, integer >= 1. alpha: growth exponent >= 0. tau: staleness scale > 0 (steps).
        rho: coupling coefficient in [0, 1]. kappa: bias constant in [0, 1].
        f0: F(theta_0) > 0. staleness_offset: s0 >= 0 in sigma^2(s) = ((s + s0)/tau)^(2 alpha).
        reference_samples: fresh samples behind the probes' reference gradient (0 = the exact
            gradient; else their mean, with its error estimated from their spread).
    """

    dim: int = 16
    alpha: float = 0.2
    tau: float = 1.0
    rho: float = 0.1
    kappa: float = 0.5
    f0: float = 10.0
    staleness_offset: float = 0.5
    reference_samples: int = 0

    name = "quadratic"
    smoothness = 1.0

    def __post_init__(self):
        checks.integer("dim", self.dim, 1)
        checks.nonnegative("alpha", self.alpha)
        checks.positive("tau", self.tau)
        checks.unit_interval("rho", self.rho)
        checks.unit_interval("kappa", self.kappa)
        checks.positive("f0", self.f0)
        checks.nonnegative("staleness_offset", self.staleness_offset)
        checks.integer("reference_samples", self.reference_samples, 0)

    def to_dict(self) -> dict:
        return {"problem": self.name, **asdict(self)}

    def sigma2(self, s) -> np.ndarray:
        """sigma^2(s) at staleness s >= 0 (steps)."""
        s = np.asarray(s, dtype=float)
        return np.power((s + self.staleness_offset) / self.tau, 2 * self.alpha)

    def check_cell(self, buffer_size: int, batch_size: int, rollouts_per_step: int) -> None:
        """Raise ``ValueError`` if the coupling is not a valid covariance at this (N, R)."""
        sizes = _block_sizes(buffer_size, rollouts_per_step)
        lam = np.linalg.eigvalsh(_block_cov(sizes, self.rho, buffer_size))[0]
        if lam < -1e-9:
            raise ValueError(
                f"rho must be small enough for the gap-form coupling to be a covariance at "
                f"horizon N/R = {buffer_size / rollouts_per_step:g} (needs roughly rho H < 5); "
                f"got rho = {self.rho:g} (smallest eigenvalue {lam:.3g})")

    def start(self, caps, lrs, batch_size, rollouts_per_step, rng) -> "_QuadState":
        return _QuadState(self, np.asarray(caps), np.asarray(lrs, float), batch_size,
                          rollouts_per_step, rng)


def _block_sizes(n: int, r: int, filled: int | None = None) -> np.ndarray:
    """Rollouts per staleness value in a FIFO of capacity N fed R per step (oldest partial)."""
    m = n if filled is None else filled
    full, rest = divmod(m, r)
    return np.array([r] * full + ([rest] if rest else []), dtype=float)


def _block_cov(sizes: np.ndarray, rho: float, n: int) -> np.ndarray:
    """I + D^(1/2) F D^(1/2): the slot covariance restricted to staleness-block means."""
    h = sizes.size
    a = np.arange(h)
    f = rho * np.abs(a[:, None] - a[None, :]) / n
    root = np.sqrt(sizes)
    return np.eye(h) + root[:, None] * f * root[None, :]


class _QuadState:
    """S runs of the quadratic advanced together (one (B, R), per-run N and lr)."""

    def __init__(self, prob: QuadraticProblem, caps, lrs, b, r, rng):
        self.p, self.caps, self.lr, self.b, self.r, self.rng = prob, caps, lrs, b, r, rng
        s = caps.size
        self.h = int(math.ceil(caps.max() / r))
        d = prob.dim
        self.theta0 = np.full(d, math.sqrt(2 * prob.f0 / d))
        self.theta = np.tile(self.theta0, (s, 1))
        self.hist = np.zeros((s, self.h, d))
        self.hist[:, 0] = self.theta
        self.sig2 = prob.sigma2(np.arange(self.h))
        self.sig = np.sqrt(self.sig2)
        self.gap = np.abs(np.subtract.outer(np.arange(self.h), np.arange(self.h))).astype(float)
        # Rao-Blackwell state: mean multiplier a_t (theta mean = a_t theta_0) per lag, and the
        # lag covariance of the zero-mean part (total over coordinates).
        self.lags = self.h if prob.kappa > 0 else 1
        self.a = np.zeros((s, self.h))
        self.a[:, 0] = 1.0
        self.cov = np.zeros((s, self.lags, self.lags))
        self.override: dict[int, np.ndarray] = {}

    # -- the driver's hooks ---------------------------------------------------------------

    def track(self, run: int) -> None:
        """Probes need past weights; this problem keeps them for every run anyway."""

    def insert(self, t, slots):
        """Nothing to generate: a rollout is its slot and insertion step."""

    def update(self, t, drawn, stal):
        s, b, h, p = self.caps.size, self.b, self.h, self.p
        rows = np.arange(s)
        m = np.bincount((rows[:, None] * h + stal).ravel(), minlength=s * h).reshape(s, h)
        power = self._duplicate_power(drawn, stal) + p.rho * np.einsum(
            "sa,ab,sb->s", m * self.sig, self.gap, m * self.sig) / self.caps
        q = power / b**2
        noise = np.sqrt(q / p.dim)[:, None] * self.rng.standard_normal((s, p.dim))
        for run, vec in self.override.items():
            noise[run] = vec
        self.override = {}
        w = m / b
        idx = (t - np.arange(h)) % h
        lr = self.lr[:, None]
        with np.errstate(over="ignore", invalid="ignore"):
            if p.kappa > 0:
                mix = np.einsum("sl,sld->sd", w, self.hist[:, idx])
                grad = (1 - p.kappa) * self.theta + p.kappa * mix
                a_mix = np.einsum("sl,sl->s", w, self.a[:, idx])
            else:
                grad = self.theta
                a_mix = self.a[:, t % h]
            self.theta = self.theta - lr * (grad + noise)
            a_now = self.a[:, t % h]
            self.a[:, (t + 1) % h] = a_now - self.lr * ((1 - p.kappa) * a_now + p.kappa * a_mix)
            self._advance_cov(w, q)
        self.hist[:, (t + 1) % h] = self.theta

    def loss(self, t) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return 0.5 * np.einsum("sd,sd->s", self.theta, self.theta)

    def expected_loss(self, t) -> np.ndarray:
        """E[F(theta_t) | the draws so far]: a_t^2 F(theta_0) + tr Cov / 2."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self.a[:, t % self.h] ** 2 * self.p.f0 + 0.5 * self.cov[:, 0, 0]

    def probe(self, t, run, ins_step, drawn):
        """Per-slot noise vectors of run ``run`` at step t (drawn jointly), for the probes."""
        p, cap = self.p, int(self.caps[run])
        filled = int(min((t + 1) * self.r, cap))
        stal = t - ins_step[:filled]
        sizes = np.bincount(stal, minlength=int(stal.max()) + 1).astype(float)
        d = p.dim
        cov = _block_cov(sizes, p.rho, cap)
        lam, vec = np.linalg.eigh(cov)
        root = vec * np.sqrt(np.clip(lam, 0, None))
        xi = self.rng.standard_normal((filled, d)) / math.sqrt(d)
        block_mean = np.zeros((sizes.size, d))
        np.add.at(block_mean, stal, xi)
        block_mean /= sizes[:, None]
        zeta = root @ (self.rng.standard_normal((sizes.size, d)) / math.sqrt(d))
        u = xi - block_mean[stal] + zeta[stal] / np.sqrt(sizes[stal])[:, None]
        sigma_u = np.sqrt(p.sigma2(stal))[:, None] * u
        self.override[run] = sigma_u[drawn].mean(axis=0)
        theta = self.theta[run]
        past = self.hist[run, (t - stal) % self.h]
        eps = sigma_u + p.kappa * (past - theta)
        drift = np.linalg.norm(past - theta, axis=1)
        if p.reference_samples > 0:
            fresh = math.sqrt(p.sigma2(0.0)) * self.rng.standard_normal(
                (p.reference_samples, d)) / math.sqrt(d)
            e_ref = fresh.mean(axis=0)
            ref_err = float(fresh.var(axis=0, ddof=1).sum()) / p.reference_samples
        else:
            e_ref, ref_err = np.zeros(d), 0.0
        return {"noise": eps - e_ref, "staleness": stal, "drift": drift,
                "g_ref": theta + e_ref, "ref_sq_error": ref_err}

    # -- internals ------------------------------------------------------------------------

    def _duplicate_power(self, drawn, stal):
        """sum_i m_i^2 sigma_i^2 over the distinct slots drawn (m_i = draws of slot i)."""
        order = np.argsort(drawn, axis=1, kind="stable")
        srt = np.take_along_axis(drawn, order, axis=1)
        s, b = srt.shape
        new = np.ones((s, b), dtype=bool)
        new[:, 1:] = srt[:, 1:] != srt[:, :-1]
        gid = np.cumsum(new, axis=1) - 1 + (np.arange(s) * b)[:, None]
        mult = np.bincount(gid.ravel(), minlength=s * b)[gid]
        return np.sum(mult * self.sig2[np.take_along_axis(stal, order, axis=1)], axis=1)

    def _advance_cov(self, w, q):
        lr, kappa = self.lr, self.p.kappa
        if self.lags == 1:
            c0 = 1 - lr
            self.cov[:, 0, 0] = c0**2 * self.cov[:, 0, 0] + lr**2 * q
            return
        c = -(lr * kappa)[:, None] * w
        c[:, 0] += 1 - lr * (1 - kappa)
        cc = np.einsum("sij,sj->si", self.cov, c)
        new = np.empty_like(self.cov)
        new[:, 0, 0] = np.einsum("si,si->s", c, cc) + lr**2 * q
        new[:, 0, 1:] = cc[:, :-1]
        new[:, 1:, 0] = cc[:, :-1]
        new[:, 1:, 1:] = self.cov[:, :-1, :-1]
        self.cov = new


__all__ = ["QuadraticProblem"]
