"""``predict``: calibrate the theory on any setting and write a prediction to be verified.

``python -m llm_experiments predict --config NAME_OR_YAML [--set k=v ...] --out DIR``

1. Calibration runs (the setting with a buffer of ``horizon`` steps at replay ratio 2 and
   gradient-noise probes; ``--seeds`` of them) as a resumable sweep in ``DIR/calibration``.
2. ``replaytheory.fit.calibrate`` on their probes: sigma(s), rho, kappa (theory.md section 4),
   the smoothness L and F0, and the measured mu (section 3), also per replay ratio of the
   runs.
3. Every model variant's continuous optimum (x*, y*) at the measured mu and at the accounting
   mus 2 and 6.84 (theory.md section 5), and a grid that brackets all of them: horizons on a
   x4 ladder and replay ratios on a x1.4 ladder from one rung below the smallest prediction to
   one above the largest, learning rates around the setting's own.
4. ``DIR/prediction.json`` in the registration format ``judge`` and ``verify`` read; commit
   it before running ``verify``, so that the history shows the prediction came first.

Default budget: two calibration runs of 40 steps on ``cpu_tiny`` probed every 4 steps, about
5-10 minutes on 2 cores (most of it probing).
"""

from __future__ import annotations

import glob
import json
import math
import os

from replaytheory.advice import advise
from replaytheory.checks import choice
from replaytheory.cli_input import (Parser, existing_file, integer, missing_field, output_dir,
                                    read_json, real)
from replaytheory.io import write_json
from replaytheory.model.noise import EXTRAPOLATIONS

from ..config import load_config, parse_override
from .judge import probe_paths
from ..rl.choices import RATIO_LOSSES
from .results import warm_start_of
from .sweep import run_sweep
from .validation import ACCOUNTING_MUS, VARIANTS, ProbeFit, predict

HORIZON_LADDER = (1, 4, 16, 64, 256)
RATIO_LADDER = (1.0, 1.4, 2.0, 2.8, 4.0, 5.6, 8.0, 11.2, 16.0)
LR_FACTORS = (0.5, 1.0, 2.0)
# The calibration probes: the buffer's rollouts with their use count, their noise at the
# weights of the probes 1 and 3 intervals earlier (the reuse table) and the share of their
# gradient the clip keeps (the contribution table): the constants of every model variant
# (theory.md sections 4, 8.9 and 10). Probing is most of a calibration run's cost.
PROBES = {"probe.fresh_groups": 32, "probe.buffer_groups": 32, "probe.crn_groups": 0,
          "probe.reuse_gaps": [1, 3], "run.progress": False, "eval.every": 1000}
PROBES_PER_RUN = 10  # the fits bootstrap over probe steps, and reuse needs probes close by
# x* = inf (the objective keeps falling with the horizon) is stored as this many steps: JSON
# has no inf, and judge maps it to the grid's longest horizon all the same.
UNBOUNDED_HORIZON = 1e6


def calibration_spec(config: str, overrides: dict, steps: int, horizon: float,
                     seeds: int) -> dict:
    """The sweep spec of the calibration runs (a buffer, so that staleness varies)."""
    loss = load_config(config, [f"{k}={v}" for k, v in overrides.items()]).trainer.loss
    contribution = {"probe.contribution": loss in RATIO_LOSSES}
    return {"config": config,
            "set": {**PROBES, **contribution, **overrides,
                    "probe.every": max(1, steps // PROBES_PER_RUN),
                    "run.steps": steps, "buffer.horizon": horizon,
                    "schedule.replay_ratio": 2.0, "schedule.mode": "sync"},
            "grid": {"run.seed": list(range(seeds))}}


def bracket(values, ladder) -> list:
    """The rungs of ``ladder`` from one below min(values) to one above max(values)."""
    lo, hi = min(values), max(values)
    below = [r for r in ladder if r <= lo]
    above = [r for r in ladder if r >= hi]
    start = ladder.index(below[-1]) - 1 if below else 0
    stop = ladder.index(above[0]) + 1 if above else len(ladder) - 1
    return list(ladder[max(start, 0):min(stop, len(ladder) - 1) + 1])


def variant_predictions(fit: ProbeFit, mus: dict, *, batch_size: int, steps: int,
                        extrapolate: str = "none") -> dict:
    """variant -> mu key -> [x*, y*] (or the error text when a variant has no optimum) at
    ``batch_size`` rollouts per update and ``steps`` updates of on-policy training (the
    budget at mu: steps (1 + mu)); ``extrapolate`` as in ``validation.predict``."""
    out = {}
    for variant in VARIANTS:
        out[variant] = {}
        for key, mu in mus.items():
            try:
                p = predict(fit, variant, mu, batch_size=batch_size,
                            budget=steps * (1 + mu), extrapolate=extrapolate)
            except ValueError as exc:
                out[variant][key] = str(exc)
                continue
            x = float(p.horizon) if math.isfinite(p.horizon) else UNBOUNDED_HORIZON
            out[variant][key] = [x, float(p.replay_ratio)]
    return out


def at_measured_edge(predictions: dict, measured: float) -> list:
    """Variants whose x* at some mu reaches ``measured`` (steps, > 0): the longest staleness
    the calibration could see, so there x* is a lower bound rather than an optimum."""
    return sorted({variant for variant, by_mu in predictions.items()
                   for v in by_mu.values() if isinstance(v, list) and v[0] >= measured})


def primary_variant(cal) -> str:
    """The variant ``calibrate`` says the probes support, as a name of ``VARIANTS``."""
    supported = cal.variant_choice.variant if cal.variant_choice else "standard"
    return "asymptotic" if supported == "standard" else supported


def make_prediction(config: str, overrides: dict, out: str, *, steps: int = 40,
                    horizon: float = 16.0, seeds: int = 2, workers: int = 2,
                    extrapolate: str = "none", progress: bool = True) -> dict:
    """Run the calibration (resumable) and write ``out/prediction.json``; returns it.

    ``extrapolate``: how the noise table reaches past the calibration's staleness (one of
    ``EXTRAPOLATIONS``; "none" caps every x* at ``horizon``, theory.md section 4.6)."""
    extrapolate = choice("extrapolate", extrapolate, EXTRAPOLATIONS)
    cfg = load_config(config, [f"{k}={v}" for k, v in overrides.items()])
    cal_dir = os.path.join(out, "calibration")
    counts = run_sweep(calibration_spec(config, overrides, steps, horizon, seeds), cal_dir,
                       workers=workers, progress=progress)
    if counts.failed:
        raise RuntimeError(f"{counts.failed} calibration run(s) failed: see "
                           f"{cal_dir}/logs")
    fit = ProbeFit.of(glob.glob(os.path.join(cal_dir, "runs", "*", "probes.npz")))
    cal = fit.cal
    mus = {f"{cal.mu:.4g}": float(cal.mu), **{f"{m:g}": m for m in ACCOUNTING_MUS}}
    preds = variant_predictions(fit, mus, batch_size=cfg.schedule.batch_size,
                                steps=cfg.run.steps, extrapolate=extrapolate)
    points = [v for by_mu in preds.values() for v in by_mu.values() if isinstance(v, list)]
    xs = [max(p[0], 1.0) for p in points] or [horizon]
    ys = [max(p[1], 1.0) for p in points] or [2.0]
    registration = {
        "name": os.path.basename(os.path.normpath(out)), "config": config,
        "set": overrides, "loss": cfg.trainer.loss, "steps": cfg.run.steps,
        "horizons": bracket(xs, HORIZON_LADDER),
        "replay_ratios": bracket(ys, RATIO_LADDER),
        "learning_rates": [cfg.trainer.lr * f for f in LR_FACTORS],
        "accounting_mus": list(ACCOUNTING_MUS),
        "measured_mu": float(cal.mu),
        "primary_measure": {"name": "auc", "budget_replay_ratio": None},
        "secondary_targets": [],
        "bootstrap": {"draws": 2000, "interval": 0.9, "rng_seed": 0},
        "gate": {"threshold": 0.9},
        # The variant the probes support (section 10.7); "standard" is the asymptotic model.
        "primary_variant": primary_variant(cal),
        "variant_choice": cal.variant_choice.to_dict() if cal.variant_choice else None,
        "predictions_judged": preds, "extrapolate": extrapolate,
        "calibration": {"alpha": cal.noise.alpha, "alpha_interval": list(cal.noise.alpha_interval),
                        "power_law_ok": cal.noise.power_law_ok, "rho": cal.rho(),
                        "rho_interval": list(cal.coupling.rho_interval),
                        "rho_eff": cal.coupling.rho_eff, "smoothness_L": fit.big_l, "f0": fit.f0,
                        "notes": list(cal.notes)}}
    registration["primary_measure"]["budget_replay_ratio"] = max(registration["replay_ratios"])
    registration["warm_start"] = calibration_warm_start(cal_dir)
    registration["advice"] = advice_at(mus, cfg.run.steps)
    write_json(os.path.join(out, "prediction.json"), registration)
    return registration


def advice_at(mus: dict, steps: int) -> dict:
    """The calculator's advice from measurement (``replaytheory.advice``, theory.md 13) for a
    run of ``steps`` updates at each mu of ``mus`` ({label: mu > 0}), registered beside the
    model's predictions so that the same grid judges both: loss, x, y, band, provenance and
    the framework names (``Advice.to_dict``)."""
    return {key: advise(mu, steps).to_dict() for key, mu in mus.items()}


def calibration_warm_start(cal_dir: str) -> dict:
    """The initial policy of the calibration runs in ``cal_dir`` (``runs_warm_start``)."""
    return runs_warm_start(sorted(glob.glob(os.path.join(cal_dir, "runs", "*"))), cal_dir)


def runs_warm_start(run_dirs: list, where: str = "") -> dict:
    """The initial policy of the runs in ``run_dirs`` (their summaries' ``warm_start_sha256``
    and ``warm_start_accuracy``), which ``judge`` requires of a grid's runs; ValueError if
    the runs disagree or none has a summary (``where`` names them in the message)."""
    seen = []
    for d in run_dirs:
        path = os.path.join(d, "summary.json")
        if os.path.exists(path):
            with open(path) as fh:
                seen.append(warm_start_of(json.load(fh)))
    if not seen or any(s != seen[0] for s in seen):
        raise ValueError(f"the calibration runs {where or run_dirs} name no single initial "
                         f"policy: {seen}")
    return seen[0]


def extrapolated_registration(path: str, extrapolate: str, *, primary: str | None = None,
                              note: str = "", calibration: str | None = None,
                              config: str | None = None) -> str:
    """A second registration on the grid of the committed ``path``: every variant predicted
    again from the same calibration probes, with the noise table extrapolated
    (``extrapolate``, theory.md section 4.6). Grid, measure, bootstrap and gate are copied, so
    ``verify`` judges it on the same runs. ``primary``: its primary variant (default: the
    original's). ``calibration``: the folder of the probes ``path`` was predicted from
    (default its ``calibration/`` sibling, as ``predict`` writes it); ``config``: the setting,
    for a registration that does not name its own (``cpu_sweep_v2``'s). Writes
    ``prediction_<extrapolate>.json`` next to ``path``; returns that path. Commit it before
    the grid's runs, as the original."""
    extrapolate = choice("extrapolate", extrapolate, EXTRAPOLATIONS)
    reg = read_json(path, "--from")
    try:
        return _extrapolated(path, reg, extrapolate=extrapolate, primary=primary, note=note,
                             calibration=calibration, config=config)
    except KeyError as exc:
        raise missing_field(exc, path, "--from", "a prediction.json written by predict") \
            from None


def _extrapolated(path: str, reg: dict, *, extrapolate: str, primary: str | None, note: str,
                  calibration: str | None, config: str | None) -> str:
    if primary is not None:
        choice("primary", primary, VARIANTS)
    config = reg.get("config") or config
    if not config:
        raise ValueError(f"{path} names no config: give config (--config)")
    calibration = calibration or os.path.join(os.path.dirname(path), "calibration")
    fit = ProbeFit.of(probe_paths(calibration, reg["loss"]))
    cfg = load_config(config, [f"{k}={v}" for k, v in reg.get("set", {}).items()])
    mus = {f"{fit.cal.mu:.4g}": float(fit.cal.mu),
           **{f"{m:g}": m for m in reg["accounting_mus"]}}
    out = os.path.join(os.path.dirname(path), f"prediction_{extrapolate}.json")
    second = {**reg, "name": f"{reg['name']}_{extrapolate}", "extrapolate": extrapolate,
              "supplements": os.path.basename(path),
              "primary_variant": primary or reg["primary_variant"], "note": note,
              "predictions_judged": variant_predictions(
                  fit, mus, batch_size=cfg.schedule.batch_size, steps=reg["steps"],
                  extrapolate=extrapolate)}
    if "planned_verification" in reg:  # the plan names this file and its primary, not the first's
        plan = reg["planned_verification"]
        second["planned_verification"] = {
            **plan, "primary_variant": second["primary_variant"],
            "command": plan["command"].replace(os.path.basename(path), os.path.basename(out))}
    write_json(out, second)
    return out


def _overrides(texts) -> dict:
    out = {}
    for text in texts:
        section, key, value = parse_override(text)
        out[f"{section}.{key}"] = value
    return out


def _parser() -> Parser:
    p = Parser.from_doc("llm_experiments predict", __doc__)
    p.add_argument("--config", default="cpu_tiny", help="shipped config name or YAML path; "
                   "with --from, used only for a registration that names no config of its own")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. task.digits=3 (repeatable)")
    p.add_argument("--out", type=output_dir, help="folder for calibration/ and "
                   "prediction.json")
    # the noise table needs staleness 1: min(horizon, steps) - 1 >= 1
    p.add_argument("--steps", type=integer(2), default=40,
                   help="steps of each calibration run (>= 2, default 40)")
    p.add_argument("--horizon", type=real(2.0), default=16.0,
                   help="calibration buffer horizon in steps (>= 2, default 16): noise is measured "
                        "only up to min(horizon, steps) - 1 steps of staleness, so a predicted "
                        "x* at that edge is a lower bound")
    p.add_argument("--seeds", type=integer(1), default=2,
                   help="calibration runs (>= 1, default 2)")
    p.add_argument("--workers", type=integer(1), default=2,
                   help="runs at a time (>= 1, default 2)")
    p.add_argument("--extrapolate", choices=EXTRAPOLATIONS, default="none",
                   help="past the measured staleness: 'none' caps x* there, 'hold_last' "
                        "holds the noise at its last measured value")
    p.add_argument("--from", dest="source", type=existing_file, metavar="PREDICTION_JSON",
                   help="instead of calibrating: predict again from this committed "
                        "registration's calibration with --extrapolate, on its grid; writes "
                        "prediction_<extrapolate>.json next to it")
    p.add_argument("--primary-variant", choices=VARIANTS,
                   help="with --from: the new registration's primary variant")
    p.add_argument("--note", default="", help="with --from: why this registration exists")
    p.add_argument("--calibration", metavar="DIR", help="with --from: the probes the "
                   "registration was predicted from (default: its calibration/ folder)")
    return p


def main(argv=None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if (a.out is None) == (a.source is None):
        p.error("give exactly one of --out (calibrate and predict) or --from (predict again)")
    try:
        if a.source:
            path = extrapolated_registration(a.source, a.extrapolate, primary=a.primary_variant,
                                             note=a.note, calibration=a.calibration,
                                             config=a.config)
            reg = read_json(path)
        else:
            path = os.path.join(a.out, "prediction.json")
            reg = make_prediction(a.config, _overrides(a.set), a.out, steps=a.steps,
                                  horizon=a.horizon, seeds=a.seeds, workers=a.workers,
                                  extrapolate=a.extrapolate)
    except (ValueError, RuntimeError, OSError) as exc:
        return p.report(exc)
    for variant, by_mu in reg["predictions_judged"].items():
        for key, v in by_mu.items():
            text = f"x* = {v[0]:.3g}, y* = {v[1]:.3g}" if isinstance(v, list) else v
            print(f"{variant:19s} mu = {key:>6s}: {text}")
    measured = min(a.horizon, a.steps)
    edge = at_measured_edge(reg["predictions_judged"], measured)
    if edge and not a.source and a.extrapolate == "none":
        # heldout_digits3 (theory.md section 10.9): x* capped at 16 lost to x = 64.
        print(f"note: {', '.join(edge)} put x* at the edge of the measured staleness "
              f"({measured:g} steps): a lower bound, not an optimum; --horizon and --steps "
              f"measure further")
    for key, adv in reg.get("advice", {}).items():
        print(f"{'advice (measured)':19s} mu = {key:>6s}: loss {adv['loss']}, "
              f"x = {adv['horizon']:g}, y = {adv['replay_ratio']:.3g}, band x in "
              f"{sorted({b['horizon'] for b in adv['band']})}")
    print(f"grid: x in {reg['horizons']}, y in {reg['replay_ratios']}; {path} (commit it "
          f"before verify)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
