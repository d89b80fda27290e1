"""``horizon_predict``: register the horizon model's prediction for a setting, from its
long-range panel probes only (theory.md section 11), before any run of its grid.

``python -m llm_experiments.study.horizon_predict --name NAME --panels RUN_DIR [RUN_DIR ...]
[--config cpu_tiny] [--set k=v ...] --horizons 2,4,...,128 --replay-ratios 1,2,4
--learning-rates 5e-5,1e-4,2e-4 [--standard PREDICTION_JSON] --out DIR``

1. ``replaytheory.fit.panel_fit.fit_panels`` on the panel runs' probes (their ``probes.npz``).
2. The terms the probes support (``supported_terms``; each needs its bootstrap interval clear
   of the value that switches it off), the model's optimum (x*, y*) at the panel runs'
   measured mu and at the accounting mus, and x* with each supported term switched off (which
   mechanism sets the horizon).
3. ``DIR/prediction.json`` in the registration format ``judge`` reads (``judged_variants``):
   primary "horizon" (the model's best buffer), "horizon_vs_on_policy" and "asymptotic"
   (section 5's optimum with the same noise table); with ``--standard``, the other variants of
   a committed ``predict`` registration of the same setting are judged beside them. Commit it
   before the grid's first run.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os

import numpy as np

from replaytheory.model import horizon as hz
from replaytheory.cli_input import Parser, existing_file, output_dir
from replaytheory.io import write_json
from replaytheory.fit.panel_fit import PanelFit, fit_panels

from ..config import load_config
from .predict import _overrides, runs_warm_start
from .validation import ACCOUNTING_MUS, load_probes

MU_KEY_DIGITS = "{:.4g}"


def supported_terms(fit: PanelFit) -> dict:
    """term -> (supported, reason), each from the panels alone: diversity when r at gap 0 is
    above 0; fading when c at the longest gap lies below c at gap 1 (intervals apart); worth
    when the kept share at the longest gap lies below 1. The noise table is always used."""
    last = len(fit.corr.gaps) - 1
    one = fit.corr.gaps.index(1.0) if 1.0 in fit.corr.gaps else min(1, last)
    out = {}
    r = fit.within
    out["diversity"] = (r.low[0] > 0, f"r(0) = {r.value[0]:.3g} [{r.low[0]:.3g}, "
                                      f"{r.high[0]:.3g}]")
    c = fit.corr
    out["fading"] = (c.high[last] < c.low[one],
                     f"c({c.gaps[one]:g}) = {c.value[one]:.3g} [{c.low[one]:.3g}, "
                     f"{c.high[one]:.3g}], c({c.gaps[last]:g}) = {c.value[last]:.3g} "
                     f"[{c.low[last]:.3g}, {c.high[last]:.3g}]")
    k = fit.kept
    out["worth"] = (k.high[last] < 1, f"kept({k.gaps[last]:g}) = {k.value[last]:.3g} "
                                      f"[{k.low[last]:.3g}, {k.high[last]:.3g}]")
    return out


def predictions(terms: hz.HorizonTerms, mus: dict, max_horizon: int) -> dict:
    """mu key -> {"design": HorizonDesign dict, "ablations": {term: x* without it},
    "section5": section 5's optimum with the same noise table}."""
    out = {}
    for key, mu in mus.items():
        design = hz.optimal_design(terms, mu=mu, max_horizon=max_horizon)
        ablations = {t: hz.optimal_design(hz.ablate(terms, t), mu=mu,
                                          max_horizon=max_horizon).horizon
                     for t in hz.ABLATIONS}
        plain = hz.optimal_design(hz.section5_terms(terms), mu=mu, max_horizon=max_horizon)
        out[key] = {"design": design.to_dict(), "ablations": ablations,
                    "section5": plain.to_dict()}
    return out


def judged_variants(preds: dict) -> dict:
    """The readouts the judge scores (theory.md section 11.7): "horizon", the model's best
    buffer (x*, y*) (primary); "horizon_vs_on_policy", on-policy (x < 1) where the model
    prefers it to that buffer; "asymptotic", section 5's optimum with the panels' noise."""
    def xy(d):
        return [float(d["horizon"]), float(d["replay_ratio"])]
    return {"horizon": {k: xy(p["design"]) for k, p in preds.items()},
            "horizon_vs_on_policy": {k: [0.0, 1.0] if p["design"]["on_policy_best"]
                                     else xy(p["design"]) for k, p in preds.items()},
            "asymptotic": {k: xy(p["section5"]) for k, p in preds.items()}}


def panel_dirs(patterns: list[str], option: str = "--panels") -> list[str]:
    """The run folders the ``option`` patterns (globs) match, sorted; ValueError naming
    ``option`` if none."""
    dirs = sorted({d for pat in patterns for d in glob.glob(pat)})
    if not dirs:
        raise ValueError(f"{option} matches no run folder: {patterns}")
    return dirs


def panel_mu(run_dirs: list[str]) -> float:
    """Median measured mu of the panel runs (their summaries' ``mu_measured``)."""
    mus = []
    for d in run_dirs:
        with open(os.path.join(d, "summary.json")) as fh:
            mus.append(float(json.load(fh)["mu_measured"]))
    return float(np.median(mus))


def register(name: str, config: str, overrides: dict, run_dirs: list[str], *, horizons,
             replay_ratios, learning_rates, standard: str | None = None,
             note: str = "") -> dict:
    """The registration (module docstring); ``run_dirs``: the panel runs of this setting."""
    probes = load_probes([os.path.join(d, "probes.npz") for d in run_dirs])
    fit = fit_panels(probes, n_boot=400)
    cfg = load_config(config, [f"{k}={v}" for k, v in overrides.items()])
    supported = supported_terms(fit)
    longest = int(max(horizons))
    used = {t: ok for t, (ok, _) in supported.items()}
    terms = hz.model_terms(fit, used, length=max(longest, int(max(fit.corr.gaps)) + 1))
    mu = panel_mu(run_dirs)
    mus = {MU_KEY_DIGITS.format(mu): mu, **{f"{m:g}": m for m in ACCOUNTING_MUS}}
    preds = predictions(terms, mus, longest)
    judged = judged_variants(preds)
    if standard:
        with open(standard) as fh:
            judged.update({k: v for k, v in json.load(fh)["predictions_judged"].items()
                           if k not in judged})
    return {
        "name": name, "config": config, "set": overrides, "loss": cfg.trainer.loss,
        "steps": cfg.run.steps, "horizons": list(horizons),
        "replay_ratios": list(replay_ratios), "learning_rates": list(learning_rates),
        "accounting_mus": list(ACCOUNTING_MUS), "measured_mu": mu,
        "primary_measure": {"name": "auc", "budget_replay_ratio": max(replay_ratios)},
        "secondary_targets": [], "bootstrap": {"draws": 2000, "interval": 0.9, "rng_seed": 0},
        "gate": {"threshold": 0.9}, "primary_variant": "horizon",
        "predictions_judged": judged, "extrapolate": "hold_last",
        "horizon_model": {"supported": {t: {"used": bool(ok), "reason": why}
                                        for t, (ok, why) in supported.items()},
                          "by_mu": preds, "panel_fit": fit.to_dict(),
                          "panel_runs": sorted(os.path.basename(d) for d in run_dirs),
                          "standard_registration": standard},
        "warm_start": runs_warm_start(run_dirs),
        "note": note}


def _positive_list(text: str) -> list[float]:
    """A comma-separated list of finite numbers > 0 (horizons, replay ratios, rates)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0, got {text!r}")
    return values


def main(argv=None) -> int:
    p = Parser(prog="python -m llm_experiments.study.horizon_predict",
               description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True)
    p.add_argument("--config", default="cpu_tiny")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--panels", nargs="+", required=True, metavar="RUN_DIR",
                   help="run folders with panel probes (globs allowed)")
    p.add_argument("--horizons", type=_positive_list, required=True,
                   help="the grid's horizons x (updates), comma-separated, > 0")
    p.add_argument("--replay-ratios", type=_positive_list, required=True,
                   help="the grid's replay ratios y, comma-separated, > 0")
    p.add_argument("--learning-rates", type=_positive_list, required=True,
                   help="the grid's learning rates, comma-separated, > 0")
    p.add_argument("--standard", type=existing_file, metavar="PREDICTION_JSON")
    p.add_argument("--note", default="")
    p.add_argument("--out", type=output_dir, required=True, help="folder for prediction.json")
    a = p.parse_args(argv)
    try:
        reg = register(a.name, a.config, _overrides(a.set), panel_dirs(a.panels), horizons=a.horizons,
                       replay_ratios=a.replay_ratios, learning_rates=a.learning_rates,
                       standard=a.standard, note=a.note)
    except (ValueError, OSError, KeyError) as exc:
        return p.report(exc)
    path = os.path.join(a.out, "prediction.json")
    write_json(path, reg)
    for key, pred in reg["horizon_model"]["by_mu"].items():
        d = pred["design"]
        print(f"mu = {key:>6s}: x* = {d['horizon']}, y* = {d['replay_ratio']:.3g}, saving "
              f"{d['saving']:.2f}; without each term: {pred['ablations']}")
    print(f"{path}: commit it before the grid's first run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
