"""Command line: ``replaytheory optimal | design | gamma | validate-sim``
(also ``python -m replaytheory``).

Bad input is reported as one line on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys

from .calculator import (DEFAULT_REUSE, HORIZON_EVIDENCE, HORIZON_SOURCES, MEASURED_HORIZON,
                         optimal_config)
from .cli_input import BadInput, Parser, integer, output_dir, parse_json, read_text, real
from .model.compute import PAPER_GAMMA_TABLES, PAPER_SPLITS, gamma_table
from .model.design import optimal_design
from .model.noise import EXTRAPOLATIONS, PowerLawNoise, TabulatedNoise

NOISE_TABLE_FORMAT = ('JSON {"staleness": [...], "sigma2": [...]} (optional "counts") or CSV '
                      'with columns staleness,sigma2')


def _noise_args(p, beyond_table: str, rho_default: float | None = None):
    """--rho and the noise model; ``beyond_table``: how far hold_last lets the horizon go;
    ``rho_default``: --rho's default (None: required)."""
    p.add_argument("--rho", type=real(0.0, 1.0), required=rho_default is None,
                   default=rho_default,
                   help="coupling coefficient in [0, 1]" + (
                       "" if rho_default is None else f" (default {rho_default:g})"))
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--alpha", type=real(0.0), help="power-law exponent of sigma(s) = "
                   "(s/tau)^alpha, >= 0")
    g.add_argument("--noise-table", metavar="FILE",
                   help=f"measured noise: {NOISE_TABLE_FORMAT}. Horizons stay within the "
                        f"measured staleness unless --extrapolate says otherwise")
    p.add_argument("--extrapolate", choices=EXTRAPOLATIONS, default="none",
                   help="beyond the noise table's largest staleness: none (default, horizons "
                        "stay inside the table) or hold_last (sigma^2 held at its last "
                        f"measured value, {beyond_table})")
    p.add_argument("--tau", type=real(0.0, lo_open=True), default=1.0,
                   help="power-law staleness scale (steps, > 0)")
    p.add_argument("--average", choices=("discrete", "continuous"),
                   help="sigma_bar^2 average (default: the model's own)")


def _mu_args(p):
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--mu", type=real(0.0, lo_open=True),
                   help="generation cost of a batch / cost of one update (> 0)")
    g.add_argument("--costs", type=real(0.0, lo_open=True), nargs=2, metavar=("GEN", "TRAIN"),
                   help="raw costs (> 0): generating one batch of rollouts, one trainer update")


def _parse_table(path: str, text: str) -> tuple[list, list, list | None]:
    """(staleness, sigma2, counts) from a noise table's text; ValueError says what is
    wrong."""
    if path.endswith(".json") or text.lstrip().startswith(("{", "[")):
        d = parse_json(text, path, "--noise-table")
        missing = [k for k in ("staleness", "sigma2") if k not in d]
        if missing:
            raise ValueError(f"the JSON object has no {' or '.join(map(repr, missing))} key")
        return d["staleness"], d["sigma2"], d.get("counts")
    rows = [line.split(",") for line in text.strip().splitlines() if line.strip()]
    if rows and rows[0][0].strip() == "staleness":
        rows = rows[1:]
    try:
        return [float(r[0]) for r in rows], [float(r[1]) for r in rows], None
    except (IndexError, ValueError):
        raise ValueError("a row is not two numbers staleness,sigma2") from None


def _load_table(path: str, extrapolate: str) -> TabulatedNoise:
    """The --noise-table file as a ``TabulatedNoise``; any fault is one ``BadInput`` line."""
    try:
        staleness, sigma2, counts = _parse_table(path, read_text(path, "--noise-table"))
        return TabulatedNoise(staleness, sigma2, counts, extrapolate)
    except BadInput as exc:  # already names the flag and the file
        raise BadInput(f"{exc}; expected {NOISE_TABLE_FORMAT}") from None
    except ValueError as exc:
        raise BadInput(f"--noise-table {path!r}: {exc}; expected {NOISE_TABLE_FORMAT}") \
            from None


def _noise(args):
    if args.noise_table:
        return _load_table(args.noise_table, args.extrapolate)
    if args.extrapolate != "none":
        raise ValueError("--extrapolate applies to a --noise-table only (the power law is "
                         "defined at every staleness)")
    return PowerLawNoise(alpha=args.alpha, tau=args.tau)


def _mu(args):
    if args.mu is not None:
        return args.mu
    gen, train = args.costs
    from .model.compute import mu_from_costs
    return mu_from_costs(gen, train)


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.4g}"
    return str(x)


def _table(rows) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {_fmt(val)}" for k, val in rows)


def _cmd_optimal(args) -> int:
    batch = args.batch_size[0] if len(args.batch_size) == 1 else tuple(args.batch_size)
    cfg = optimal_config(mu=_mu(args), rho=args.rho, noise=_noise(args), gpus=args.gpus,
                         trainers=args.trainers, batch_size=batch, budget=args.budget,
                         min_steps=args.min_steps, max_buffer_size=args.max_buffer_size,
                         max_horizon=args.max_horizon, average=args.average,
                         reuse=args.reuse, horizon_source=args.horizon_source,
                         run_updates=args.run_updates)
    if args.json:
        print(json.dumps(cfg.to_dict(), indent=2, default=str))
        return 0
    rows = [("model", cfg.variant), ("regime", cfg.regime), ("buffer_size N", cfg.buffer_size),
            ("batch_size B", cfg.batch_size), ("rollouts_per_step R", cfg.rollouts_per_step),
            ("workers W", cfg.workers), ("trainers T", cfg.trainers),
            ("horizon x = N/R (steps)", cfg.horizon), ("replay_ratio y = B/R", cfg.replay_ratio),
            ("compute_ratio gamma", cfg.compute_ratio), ("variance_ratio", cfg.variance_ratio),
            ("predicted_saving", cfg.predicted_saving),
            ("horizon source", f"{cfg.horizon_source} (validated: {cfg.horizon_validated})"),
            ("model's own horizon x", cfg.model_horizon),
            ("continuous optimum x*", cfg.design.horizon),
            ("continuous optimum y*", cfg.design.replay_ratio),
            ("horizon limit (steps)", cfg.horizon_limit)]
    if cfg.measured_horizon is not None:
        rows.append(("measured noise up to (steps)", cfg.measured_horizon))
    if cfg.steps is not None:
        rows.append(("steps in budget", cfg.steps))
    print("Recommended replay configuration")
    print(_table(rows))
    if cfg.advice is not None:
        r = args.rollouts_per_step or max(1, int(round(cfg.rollouts_per_step)))
        print("\nIn your framework's names (R = %d new rollouts per update)" % r)
        print(_table(list(cfg.advice.names(r).items())))
    print()
    print(cfg.explanation)
    for note in cfg.notes:
        print(f"note: {note}")
    return 0


def _cmd_design(args) -> int:
    noise = _noise(args)
    d = optimal_design(_mu(args), args.rho, noise, average=args.average)
    if args.json:
        print(json.dumps(d.to_dict(), indent=2))
        return 0
    print("Continuous optimum (theory.md section 5)")
    print(_table([("regime", d.regime), ("horizon x*", d.horizon), ("replay_ratio y*",
                  d.replay_ratio), ("J(x*, y*) / J(1, 1)", d.j_ratio),
                  ("predicted_saving", d.predicted_saving), ("method", d.method),
                  ("average", d.average)]))
    for note in d.notes:
        print(f"note: {note}")
    if isinstance(noise, TabulatedNoise) and noise.extrapolate == "hold_last":
        print(f"note: extrapolated: past staleness {noise.staleness[-1]:g} steps sigma^2 is "
              f"held at its last measured value ({noise.sigma2_values[-1]:.3g})")
    return 0


def _cmd_gamma(args) -> int:
    if args.mu is None and args.gpus is None:
        tables = {name: gamma_table(spec["mu"], PAPER_SPLITS, spec["printed"])
                  for name, spec in PAPER_GAMMA_TABLES.items()}
    else:
        if args.mu is None:
            raise ValueError("--gpus needs --mu")
        gpus = 8 if args.gpus is None else args.gpus
        splits = [(gpus - t, t) for t in range(1, gpus)]
        tables = {f"mu = {args.mu:g}": gamma_table(args.mu, splits)}
    if args.json:
        print(json.dumps({name: [r.__dict__ | {"matches_print": r.matches_print} for r in rows]
                          for name, rows in tables.items()}, indent=2))
        return 0
    for name, rows in tables.items():
        print(f"{name}: gamma = (1 + W/T) / (1 + mu)")
        print("   W  T   gamma  printed")
        for r in rows:
            flag = "" if r.matches_print in (None, True) else "  <- differs from formula"
            printed = "" if r.printed is None else f"{r.printed:.2f}"
            print(f"  {r.workers:2d} {r.trainers:2d}  {r.gamma:6.3f}  {printed:>7}{flag}")
        print()
    return 0


def _cmd_validate_sim(args) -> int:
    from dataclasses import replace

    from .sim.validate_sim import preset, run_validation

    settings = replace(preset(args.preset), seed=args.seed)
    results = run_validation(args.out, settings, log=lambda msg: print(msg, flush=True))
    print(f"wrote {len(results.records)} records to {args.out}/summary.json")
    print(f"figures: python -m figures.sim_validation {args.out} --out FIGURE_DIR")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = Parser(prog="replaytheory", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    o = sub.add_parser("optimal", help="recommend N, B, R and a worker/trainer split")
    _mu_args(o)
    # --rho defaults as optimal_config's rho does, so the command and the function agree.
    _noise_args(o, "horizons up to --max-horizon",
                inspect.signature(optimal_config).parameters["rho"].default)
    o.add_argument("--gpus", type=integer(2), help="GPUs to split into workers and trainers "
                   "(>= 2)")
    o.add_argument("--trainers", type=integer(1), help="fix the number of trainers T (>= 1)")
    o.add_argument("--batch-size", type=integer(1), nargs="+", default=[60], metavar="B",
                   help="batch size, or MIN MAX to search a range")
    o.add_argument("--budget", type=real(0.0, lo_open=True),
                   help="compute budget in trainer updates (> 0)")
    o.add_argument("--min-steps", type=integer(1),
                   help="fewest updates the budget must afford (>= 1)")
    o.add_argument("--max-buffer-size", type=integer(1),
                   help="largest buffer allowed (rollouts)")
    o.add_argument("--max-horizon", type=real(1.0, lo_open=True), default=1000.0,
                   help="largest staleness horizon N/R in steps (> 1, default 1000)")
    o.add_argument("--reuse", type=real(0.0, 1.0), default=DEFAULT_REUSE.c, metavar="C",
                   help="self-correlation c in [0, 1] of one rollout's uses (theory.md section "
                        f"10.2; default {DEFAULT_REUSE.c:g}, the median measured on our "
                        "settings; 0 gives section 5's model)")
    o.add_argument("--horizon-source", choices=HORIZON_SOURCES, default=HORIZON_EVIDENCE,
                   help="evidence (default): horizon, replay ratio and on-policy or not from "
                        "the grids measured nearest your run length and mu (theory.md 13); "
                        f"measured: x = {MEASURED_HORIZON:g} updates, y the model's (10.11); "
                        "run_length: x from the measured run-length curve (unvalidated, "
                        "11.12); model: the model's own, unvalidated horizon")
    o.add_argument("--run-updates", type=integer(1), metavar="T",
                   help="updates the run will make (>= 1): the run length the evidence is "
                        "matched at (and, with --horizon-source run_length, the curve read)")
    o.add_argument("--rollouts-per-step", type=integer(1), metavar="R",
                   help="with --horizon-source evidence, also print the advice in the names "
                        "frameworks use (loss_type, max_staleness, replay_buffer_size, ...) "
                        "for R new rollouts per update (>= 1; default the answer's R)")
    o.add_argument("--json", action="store_true", help="print JSON")
    o.set_defaults(func=_cmd_optimal)

    d = sub.add_parser("design", help="the continuous optimum (x*, y*) of section 5")
    _mu_args(d)
    _noise_args(d, "horizons unbounded")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=_cmd_design)

    g = sub.add_parser("gamma", help="compute ratio table; no arguments: the paper's tables")
    g.add_argument("--mu", type=real(0.0, lo_open=True), help="generation cost of a batch / "
                   "cost of one update (> 0)")
    g.add_argument("--gpus", type=integer(2), help="GPUs to split (>= 2, default 8; needs "
                   "--mu)")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=_cmd_gamma)

    s = sub.add_parser("validate-sim", help="simulate, calibrate and check the predicted "
                                            "optimum")
    s.add_argument("--out", type=output_dir, required=True, metavar="DIR",
                   help="output folder")
    s.add_argument("--preset", choices=("tiny", "small", "full"), default="small",
                   help="simulation size: small (default, minutes on 2 cores), full, tiny")
    s.add_argument("--seed", type=integer(0), default=0)
    s.set_defaults(func=_cmd_validate_sim)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "batch_size", None) is not None and len(args.batch_size) > 2:
        parser.error("argument --batch-size: takes one value or MIN MAX")
    try:
        return args.func(args)
    except ValueError as exc:
        return parser.report(exc)


if __name__ == "__main__":
    sys.exit(main())
