"""Command line: ``python -m llm_experiments run --config cpu_tiny --out runs/NAME
[--set section.key=value ...] [--resume]`` and ``python -m llm_experiments sweep --spec
SPEC.yaml --out sweeps/NAME [--workers K] [--engine ray [--address A]]`` (see ``sweep.py``).

Writes ``runs/NAME/{config.yaml, metrics.jsonl, summary.json, probes.npz, checkpoint/}``.
Bad input (unknown key, bad value, existing output folder without --resume, --resume of a
folder without an earlier run, missing model or dataset) ends with a one-line error naming the
key or option and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from dataclasses import dataclass

from replaytheory.cli_input import Parser, output_dir

# The harness's own modules need the ``llm`` extra (yaml, torch, transformers); they are
# imported when a command runs, so that ``--help`` works in the calculator-only install.
NEEDS_EXTRA = 'the llm_experiments commands need the llm extra: pip install -e ".[llm]"'


@dataclass(frozen=True)
class Forwarded:
    """A command with its own parser: the module whose ``main`` runs it, and its help line."""

    module: str  # relative to this package
    help: str


# Commands with their own parser (``python -m llm_experiments NAME --help`` shows it).
FORWARDED = {
    "sweep": Forwarded(".study.sweep", "run a resumable grid of runs"),
    "predict": Forwarded(".study.predict",
                         "calibrate on a setting and write prediction.json"),
    "verify": Forwarded(".study.verify",
                        "run a prediction's grid and judge it: validation.json"),
    "judge": Forwarded(".study.judge", "seed-bootstrap verdicts of a registered sweep's curves"),
    "trl": Forwarded(".integrations.trl_run",
                     "train a config through TRL with the replay trainer"),
    "demo": Forwarded(".study.demo", "the main job: calibrate, predict, compare"),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m llm_experiments``."""
    parser = Parser(prog="python -m llm_experiments",
                    description="LLM RL training with a replay buffer")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    run = sub.add_parser("run", help="train one configuration")
    run.add_argument("--config", default=None,
                     help="shipped config name (cpu_tiny, qwen3_0p6b_math) or YAML path; "
                          "default cpu_tiny, or the saved one with --resume")
    run.add_argument("--out", type=output_dir, required=True,
                     help="output folder (must not exist yet)")
    run.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out (which must hold an earlier run's "
                          "config.yaml) from its last checkpoint")
    run.add_argument("--address", default=None,
                     help="Ray cluster address for schedule.engine=ray (default $RAY_ADDRESS, "
                          "else a local cluster)")
    for name, command in FORWARDED.items():
        forwarded = sub.add_parser(name, help=f"{command.help} (see {command.module[1:]})",
                                   add_help=False)
        forwarded.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv=None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 bad input)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv and argv[0] in FORWARDED:  # argparse would swallow their options
        try:
            module = importlib.import_module(FORWARDED[argv[0]].module, __package__)
        except ModuleNotFoundError as exc:
            return parser.report(f"{exc.name} is not installed; {NEEDS_EXTRA}")
        return module.main(argv[1:])
    args = parser.parse_args(argv)
    try:
        from .config import load_config, read_config
        from .engines.experiment import run_experiment
    except ModuleNotFoundError as exc:
        return parser.report(f"{exc.name} is not installed; {NEEDS_EXTRA}")
    try:
        saved = os.path.join(args.out, "config.yaml")
        if args.resume and args.config is None and not args.overrides \
                and os.path.exists(saved):
            cfg = read_config(saved)
        else:
            cfg = load_config(args.config or "cpu_tiny", args.overrides)
        summary = run_experiment(cfg, args.out, resume=args.resume, address=args.address)
    except ValueError as exc:
        return parser.report(exc)
    keys = ("warm_start_accuracy", "best_eval_accuracy", "final_eval_accuracy",
            "compute_to_98pct_best", "mu_measured", "mu_accounting", "samples_generated",
            "samples_consumed")
    print(json.dumps({k: summary.get(k) for k in keys}, indent=1))
    return 0
