"""Calibrate the theory from probe measurements (theory.md sections 4-5, 8 and 10.7):
``calibrate`` runs every fit on a ``ProbeSet`` (``bound_fit``: sigma(s), rho, kappa and the
check of V's decomposition; ``reuse_fit``: c(g), f(u, s) and the supported variant), adds mu,
and bundles them in a ``Calibration`` that predicts through the calculator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import checks
from ..calculator import optimal_config as _optimal_config
from ..model.compute import estimate_mu
from ..model.design import finite_lr_design as _finite_lr_design
from ..model.design import optimal_design
from ..model.noise import EXTRAPOLATIONS, TabulatedNoise
from ..model.reuse import STANDARD
from ..model.reuse import VARIANTS as REUSE_VARIANTS
from ..model.reuse import optimal_design as reuse_optimal_design
from .bootstrap import _cluster_ids
from .bound_fit import (BiasFit, CouplingFit, DecompositionCheck, NoiseFit, check_decomposition,
                        fit_bias, fit_coupling, fit_noise_model)
from .probes import ProbeSet
from .reuse_fit import (ContributionFit, ReuseFit, VariantChoice, choose_variant, fit_contribution,
                        fit_reuse)


@dataclass(frozen=True)
class Calibration:
    """Fitted constants and the predictions they imply (theory.md sections 3-5).

    ``coupling="theory"`` uses the fitted rho of A3 (rho_gap if its form fits, else rho_eff);
    ``"effective"`` always uses rho_eff (the coupling the buffer realises; a named extension:
    A3's gap form is a bound, and the buffer's mean gap is about a third of the largest).
    ``noise="auto"`` uses the power law if it fits, else the table.
    ``variant`` (``design``, ``optimal_config``): "standard" is section 5's model; one of
    ``reuse.VARIANTS`` adds the fitted self-correlation and/or contribution terms (section
    10); "supported" is the one ``variant_choice`` names.
    """

    noise: NoiseFit
    coupling: CouplingFit
    bias: BiasFit | None
    decomposition: DecompositionCheck | None
    mu: float | None
    mu_source: str
    notes: tuple[str, ...] = ()
    reuse: ReuseFit | None = None
    contribution: ContributionFit | None = None
    variant_choice: VariantChoice | None = None

    def rho(self, coupling: str = "theory") -> float:
        """The coupling coefficient for designs ("theory" or "effective")."""
        checks.choice("coupling", coupling, ("theory", "effective"))
        return self.coupling.rho if coupling == "theory" else float(
            np.clip(self.coupling.rho_eff, 0, 1))

    def noise_model(self, noise: str = "auto", extrapolate: str = "none"):
        """The sigma model for designs: ``noise`` "auto", "power_law" or "tabulated".

        ``extrapolate`` (one of ``noise.EXTRAPOLATIONS``) applies to a table: "none" keeps
        horizon searches inside the measured staleness, "hold_last" holds sigma^2 at its last
        measured value beyond it (theory.md section 4.6); a power law extrapolates itself."""
        checks.choice("noise", noise, ("auto", "power_law", "tabulated"))
        checks.choice("extrapolate", extrapolate, EXTRAPOLATIONS)
        if noise == "power_law" and self.noise.power_law is None:
            raise ValueError(f"noise='power_law' needs a fitted alpha >= 0, got "
                             f"{self.noise.alpha:.3g}")
        model = {"auto": self.noise.model, "tabulated": self.noise.tabulated,
                 "power_law": self.noise.power_law}[noise]
        if isinstance(model, TabulatedNoise):
            return replace(model, extrapolate=extrapolate)
        return model

    def _mu(self, mu):
        if mu is not None:
            return checks.positive("mu", mu)
        if self.mu is None:
            raise ValueError("mu is unknown: pass mu (> 0) or calibrate with counts")
        return self.mu

    def reuse_terms(self, variant: str) -> tuple:
        """(reuse model, contribution model) of a variant (section 10): "standard", "supported"
        or one of ``reuse.VARIANTS``; raises if the variant needs a fit that is missing."""
        checks.choice("variant", variant, (STANDARD, "supported", *REUSE_VARIANTS))
        if variant == "supported":
            variant = STANDARD if self.variant_choice is None else self.variant_choice.variant
        want_c = variant in ("self_correlated", "reuse_clipping")
        want_f = variant in ("clipping", "reuse_clipping")
        if want_c and self.reuse is None:
            raise ValueError(f"variant={variant!r} needs c(g): calibrate with a reuse table")
        if want_f and self.contribution is None:
            raise ValueError(f"variant={variant!r} needs f(u, s): calibrate with a "
                             f"contribution table")
        return (self.reuse.model if want_c else None,
                self.contribution.model if want_f else None)

    def design(self, mu: float | None = None, *, coupling: str = "theory",
               noise: str = "auto", variant: str = "supported", extrapolate: str = "none",
               **kwargs):
        """The optimum with the fitted constants: ``design.optimal_design`` (section 5) for
        variant "standard", ``reuse.optimal_design`` (section 10) otherwise; ``variant``
        defaults to the one the probes support (section 10.11); ``noise`` and
        ``extrapolate`` as in ``noise_model``."""
        reuse_model, contribution = self.reuse_terms(variant)
        sigma = self.noise_model(noise, extrapolate)
        if reuse_model is None and contribution is None:
            return optimal_design(self._mu(mu), self.rho(coupling), sigma, **kwargs)
        return reuse_optimal_design(self._mu(mu), self.rho(coupling), sigma,
                                    reuse=reuse_model, contribution=contribution, **kwargs)

    def optimal_config(self, mu: float | None = None, *, coupling: str = "theory",
                       noise: str = "auto", variant: str = "supported",
                       extrapolate: str = "none", **kwargs):
        """Integers and a GPU split for the optimum (``calculator.optimal_config``) with the
        fitted constants and the variant's fitted terms: by default those the probes support
        (section 10.11), named in the recommendation's ``variant`` and ``explanation``;
        ``noise`` and ``extrapolate`` as in ``noise_model``. The horizon is the model's
        (``horizon_source="model"`` unless given), marked unvalidated (section 10.11)."""
        reuse_model, contribution = self.reuse_terms(variant)
        kwargs.setdefault("horizon_source", "model")
        return _optimal_config(mu=self._mu(mu), rho=self.rho(coupling),
                               noise=self.noise_model(noise, extrapolate), reuse=reuse_model,
                               contribution=contribution, **kwargs)

    def finite_lr_design(self, mu: float | None = None, *, batch_size: int,
                         smoothness: float, f0: float, budget: float,
                         coupling: str = "theory", noise: str = "auto",
                         extrapolate: str = "none", **kwargs):
        """``design.finite_lr_design`` with the fitted constants and kappa (section 4);
        ``noise`` and ``extrapolate`` as in ``noise_model``."""
        if self.bias is None:
            raise ValueError("finite_lr_design needs kappa: calibrate with a bias table")
        return _finite_lr_design(self._mu(mu), self.rho(coupling),
                                 self.noise_model(noise, extrapolate),
                                 batch_size=batch_size, smoothness=smoothness,
                                 kappa=self.bias.kappa, f0=f0, budget=budget, **kwargs)

    def to_dict(self) -> dict:
        return {"noise": self.noise.to_dict(), "coupling": self.coupling.to_dict(),
                "bias": None if self.bias is None else self.bias.to_dict(),
                "decomposition": None if self.decomposition is None
                else self.decomposition.to_dict(),
                "mu": self.mu, "mu_source": self.mu_source, "notes": list(self.notes),
                # Section 10's fits only when measured, so older calibrations read the same.
                **({} if self.reuse is None and self.contribution is None else {
                    "reuse": None if self.reuse is None else self.reuse.to_dict(),
                    "contribution": None if self.contribution is None
                    else self.contribution.to_dict(),
                    "variant_choice": self.variant_choice.to_dict()})}


def _mu_from_counts(counts: dict) -> tuple[float | None, str]:
    if counts.get("mu_measured") is not None:
        return float(counts["mu_measured"]), "counts.mu_measured"
    keys = ("unique_rollouts", "samples_consumed", "workers", "trainers")
    if all(k in counts for k in keys) and (counts["workers"] > 1 or counts["trainers"] > 1):
        return estimate_mu(int(counts["unique_rollouts"]), int(counts["samples_consumed"]),
                           int(counts["workers"]), int(counts["trainers"])), "estimate_mu(counts)"
    if counts.get("mu_accounting") is not None:
        return float(counts["mu_accounting"]), "counts.mu_accounting"
    return None, "unknown"


# Fewest probe steps an optional table (bias, reuse, contribution) needs for its bootstrap,
# the fits' default ``min_probes``.
MIN_OPTIONAL_PROBE_STEPS = 3


def _optional_fit(fit, probes: ProbeSet, name: str, notes: list, **kwargs):
    """``fit(probes)`` of an optional table, or None: without rows, or (with a note) from
    fewer probe steps than its bootstrap needs, which a short or clock-driven run can give
    (e.g. buffer rows evicted before a later probe), so the rest of the calibration stands."""
    if not probes.n_rows(name):
        return None
    steps = int(_cluster_ids(probes.tables[name]).max()) + 1
    if steps < MIN_OPTIONAL_PROBE_STEPS:
        notes.append(f"{name}: rows from {steps} probe step(s), at least "
                     f"{MIN_OPTIONAL_PROBE_STEPS} needed for a bootstrap; not fitted")
        return None
    return fit(probes, **kwargs)


def calibrate(probes: ProbeSet, counts: dict | None = None, *, mu: float | None = None,
              staleness_offset: float = 0.5, n_boot: int = 200, seed: int = 0) -> Calibration:
    """Fit sigma, rho, kappa (and take mu) from a run's probes (theory.md sections 3-5, 8).

    Args:
        probes: ``ProbeSet`` with ``noise`` and ``coupling`` tables (``bias``, ``minibatch``,
            ``reuse`` and ``contribution`` optional; the last two feed section 10's variants
            and ``variant_choice``). An optional table from fewer than
            ``MIN_OPTIONAL_PROBE_STEPS`` probe steps is left out, and ``notes`` says so.
        counts: run counts (default ``probes.counts``): mu is taken from ``mu_measured``,
            else ``estimate_mu`` of an asynchronous run (W or T > 1), else ``mu_accounting``.
        mu: overrides the counts (> 0).
        staleness_offset, n_boot, seed: as in ``fit_noise_model``.
    Raises:
        ValueError: from the fits (too few, degenerate or NaN probes).
    """
    if not isinstance(probes, ProbeSet):
        raise ValueError(f"probes must be a ProbeSet, got {type(probes).__name__}")
    counts = dict(probes.counts if counts is None else counts)
    if mu is not None:
        mu_val, source = checks.positive("mu", mu), "argument"
    else:
        mu_val, source = _mu_from_counts(counts)
    noise = fit_noise_model(probes, staleness_offset=staleness_offset, n_boot=n_boot,
                            seed=seed)
    coupling = fit_coupling(probes, n_boot=n_boot, seed=seed)
    notes = []
    bias, reuse, contribution = (
        _optional_fit(fit, probes, name, notes, n_boot=n_boot, seed=seed)
        for name, fit in (("bias", fit_bias), ("reuse", fit_reuse),
                          ("contribution", fit_contribution)))
    decomposition = check_decomposition(probes, coupling.rho, n_boot=n_boot, seed=seed) \
        if probes.n_rows("minibatch") >= 2 else None
    if not noise.power_law_ok:
        notes.append(f"noise: the power law does not describe the data ({noise.reason}); "
                     f"using the tabulated model")
    if not coupling.gap_form_ok:
        notes.append(f"coupling: corr = rho gap / N does not describe the data "
                     f"({coupling.reason}); using the effective rho = {coupling.rho_eff:.3g}")
    if bias is not None and not bias.drift_form_ok:
        notes.append(f"bias: ||bias|| = kappa drift does not describe the data "
                     f"({bias.reason}); using the envelope kappa = {bias.kappa_envelope:.3g}")
    return Calibration(noise=noise, coupling=coupling, bias=bias, decomposition=decomposition,
                       mu=mu_val, mu_source=source, notes=tuple(notes), reuse=reuse,
                       contribution=contribution,
                       variant_choice=choose_variant(reuse, contribution))


__all__ = ["Calibration", "calibrate"]
