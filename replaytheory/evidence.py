"""The measured horizon evidence the calculator's advice reads (``advice``), from the
committed verdicts: ``python -m replaytheory.evidence [--results DIR] [--out F]``.

One record per judged (setting, run length, mu): every grid cell's AUC point estimate (mean
eval accuracy over the evaluations of the window, at the cell's best learning rate, as
``judge`` scores it), the setting's warm-start accuracy (median step-0 eval accuracy of its
runs), the run length T in trainer updates and the family the setting belongs to (a grid and
its windows are one family: leave-one-family-out scoring drops them together).

Sources: every ``results/windows/*/validation.json`` (the registered grids scored over their
first T updates, T = 30-300; the whole-run verdicts of those grids are their largest window)
and the whole-run verdicts of the settings without windows (``heldout_digits3``,
``heldout_init``, ``heldout_wide``, ``seconds_groups``). Only the AUC measure at mu =
measured, 2 and 6.84. Written atomically, sorted, so a rerun on the same results gives the
same bytes.

The loss evidence (``loss_advice.LOSS_EVIDENCE_PATH``, read by ``loss_advice.choose_loss``)
comes from the compacted runs of the registered loss grids (``LOSS_GRIDS``, theory.md 12.3):
one record per grid with, per sync (loss, x) cell, each seed's AUC (mean eval accuracy over
the run's evaluations). Written by the same command.

The adaptive evidence (``adaptive_advice.ADAPTIVE_EVIDENCE_PATH``, read by
``adaptive_advice.choose_adaptive``) pairs, per setting and arm (tau, token bound), the
adaptive buffer's runs (``buffer.drop_logr2`` > 0) with the runs of x = 64 that share every
other setting but the seed (``ADAPTIVE_GRIDS``: the adaptive grid and the grids holding its
fixed arms). A grid of several settings names each by the settings that tell them apart.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from .adaptive_advice import ADAPTIVE_EVIDENCE_PATH, FIXED_HORIZON
from .advice import EVIDENCE_PATH
from .loss_advice import LOSS_EVIDENCE_PATH
from .io import open_text, write_text

RESULTS = Path(__file__).resolve().parents[1] / "results"
WHOLE_RUNS = ("heldout_digits3", "heldout_init", "heldout_wide", "seconds_groups")
MU_SOURCES = ("measured", "2", "6.84")
LOSS_GRIDS = ("horizon_losses", "horizon_losses_lr2")  # theory.md 12.3
# (adaptive grid, the grids holding its x = 64 arms): theory.md 12.4, 12.6, 12.7, 13.2
ADAPTIVE_GRIDS = (("horizon_adaptive", ("horizon_losses",)),
                  ("horizon_adaptive_lr2", ("horizon_losses_lr2",)),
                  ("adaptive_transfer", ("adaptive_transfer",)),
                  ("adaptive_long", ("adaptive_long",)),
                  ("adaptive_uncertain", ("horizon_losses", "horizon_losses_lr2",
                                          "adaptive_transfer")),
                  ("adaptive_uncertain_long", ("adaptive_long",)))
NAME_SKIP = ("model.intermediate_size", "model.warm_start_path", "model.warm_start_sha256",
             "eval.every")  # follow from the setting's other keys
PAIRED_BY = ("buffer.horizon", "buffer.drop_logr2", "buffer.drop_tokens_below_p",
             "run.seed")  # what the two arms may differ in


def _warm_start(results: Path, curves: str, cache: dict) -> float:
    """Median step-0 eval accuracy of the runs in ``curves`` (a path under the repository)."""
    if curves not in cache:
        with open_text(str(results.parent / curves)) as fh:
            first = [json.loads(line)["eval"]["eval_accuracy"][0] for line in fh if line.strip()]
        cache[curves] = float(np.median(first))
    return cache[curves]


def _records(results: Path, folder: Path, cache: dict) -> list[dict]:
    """The evidence records of one verdict folder."""
    window = re.search(r"^(.*)_T(\d+)$", folder.name)
    family = window.group(1) if window else folder.name
    out = []
    for v in json.loads((folder / "validation.json").read_text()):
        if v.get("measure") != "auc" or v.get("mu_source") not in MU_SOURCES:
            continue
        steps = int(window.group(2)) if window else json.loads(
            (results.parent / v["registration"]["path"]).read_text())["steps"]
        out.append({"setting": str(folder.relative_to(results)), "family": family,
                    "run_updates": steps, "mu": round(float(v["mu"]), 4),
                    "mu_source": v["mu_source"],
                    "warm_start": _warm_start(results, v["curves"][0]["path"], cache),
                    "cells": [{"label": c["label"], "x": c["horizon"], "y": c["replay_ratio"],
                               "score": c["score"]} for c in v["cells"]]})
    return out


def collect(results: Path = RESULTS) -> list[dict]:
    """Every evidence record under ``results`` (see the module docstring), sorted."""
    folders = sorted((results / "windows").glob("*/validation.json"))
    folders += [results / name / "validation.json" for name in WHOLE_RUNS]
    cache: dict = {}
    records = [r for f in folders if f.exists() for r in _records(results, f.parent, cache)]
    return sorted(records, key=lambda r: (r["family"], r["run_updates"], r["mu"]))


def _loss_grid(name: str, curves: Path) -> dict:
    """One loss grid's record from its compacted runs (module docstring)."""
    cells: dict = {}
    meta = set()
    with open_text(str(curves)) as fh:
        for line in filter(str.strip, fh):
            run = json.loads(line)
            s = run["settings"]
            if s.get("schedule.mode") != "sync":
                continue
            key = (s["trainer.loss"], float(s["buffer.horizon"]))
            cells.setdefault(key, {})[int(s["run.seed"])] = float(
                np.mean(run["eval"]["eval_accuracy"]))
            meta.add((run["eval"]["step"][-1], float(s["trainer.lr"]),
                      float(s["schedule.replay_ratio"])))
    if len(meta) != 1:
        raise ValueError(f"loss grid {name}: its runs differ in (T, lr, y): {sorted(meta)}")
    (steps, lr, y), = meta
    return {"setting": name, "run_updates": int(steps), "lr": lr, "replay_ratio": y,
            "cells": [{"loss": loss, "x": x, "seeds": sorted(by_seed),
                       "auc": [round(by_seed[k], 6) for k in sorted(by_seed)]}
                      for (loss, x), by_seed in sorted(cells.items())]}


def collect_losses(results: Path = RESULTS) -> list[dict]:
    """The loss evidence: one record per committed loss grid (module docstring), sorted."""
    return [_loss_grid(name, results / name / "curves.jsonl.gz") for name in LOSS_GRIDS
            if (results / name / "curves.jsonl.gz").exists()]


def _runs(curves: Path):
    """(settings, AUC, run length) of each synchronous run in ``curves``."""
    with open_text(str(curves)) as fh:
        for line in filter(str.strip, fh):
            run = json.loads(line)
            if run["settings"].get("schedule.mode") == "sync":
                yield (run["settings"], float(np.mean(run["eval"]["eval_accuracy"])),
                       int(run["eval"]["step"][-1]))


def paired_signature(settings: dict) -> tuple:
    """A run's settings but those the adaptive arm and its x = 64 arm may differ in, sorted."""
    return tuple(sorted((k, v) for k, v in settings.items() if k not in PAIRED_BY))


def setting_names(grid: str, signatures) -> dict:
    """{signature: name}: the grid's name, and where the grid holds several settings, the
    settings that tell them apart and that each one sets (the loss is recorded apart; keys
    that only follow from another, ``NAME_SKIP``, are left out unless names would clash)."""
    signatures = sorted(signatures)
    differ = sorted({k for sig in signatures for k, v in sig if k != "trainer.loss"
                     and any(dict(o).get(k) != v for o in signatures)})

    def names(skip) -> dict:
        return {sig: grid + (": " + ", ".join(f"{k}={v}" for k, v in sig
                                              if k in differ and k not in skip)
                             if differ else "") for sig in signatures}
    short = names(NAME_SKIP)
    return short if len(set(short.values())) == len(short) else names(())


def adaptive_pairs(grid: str, adaptive: Path, fixed) -> list[dict]:
    """The records of one adaptive grid (``grid``, its compacted curves ``adaptive``)
    against its x = 64 arm (in the curves ``fixed``: one path or several), per setting and
    arm (tau, token bound; module docstring)."""
    arms: dict = {}
    for settings, score, steps in _runs(adaptive):
        tau = float(settings.get("buffer.drop_logr2", 0.0))
        if tau > 0:
            below_p = float(settings.get("buffer.drop_tokens_below_p", 1.0))
            arms.setdefault((paired_signature(settings), tau, below_p), {})[
                int(settings["run.seed"])] = (score, steps)
    base: dict = {}
    for path in [fixed] if isinstance(fixed, (str, Path)) else fixed:
        for settings, score, steps in _runs(path):
            if (float(settings.get("buffer.drop_logr2", 0.0)) == 0
                    and float(settings["buffer.horizon"]) == FIXED_HORIZON):
                base.setdefault(paired_signature(settings), {})[int(settings["run.seed"])] = score
    names = setting_names(grid, {sig for sig, _, _ in arms})
    out = []
    for (sig, tau, below_p), by_seed in sorted(arms.items()):
        s = dict(sig)
        fixed_arm = base.get(sig, {})
        out.append({"setting": names[sig], "grid": grid,
                    "run_updates": max(v[1] for v in by_seed.values()),
                    "lr": float(s["trainer.lr"]),
                    "replay_ratio": float(s["schedule.replay_ratio"]),
                    "loss": s.get("trainer.loss", "grpo"), "tau": tau, "below_p": below_p,
                    "seeds_adaptive": sorted(by_seed),
                    "auc_adaptive": [round(by_seed[k][0], 6) for k in sorted(by_seed)],
                    "seeds_fixed": sorted(fixed_arm),
                    "auc_fixed": [round(fixed_arm[k], 6) for k in sorted(fixed_arm)]})
    return out


def collect_adaptive(results: Path = RESULTS) -> list[dict]:
    """The adaptive evidence: the adaptive arm against x = 64 per setting (module
    docstring), sorted."""
    out = []
    for grid, fixed in ADAPTIVE_GRIDS:
        a = results / grid / "curves.jsonl.gz"
        f = [results / name / "curves.jsonl.gz" for name in fixed]
        if a.exists() and all(p.exists() for p in f):
            out += adaptive_pairs(grid, a, f)
    return sorted(out, key=lambda r: (r["setting"], r["loss"], r["tau"], r["below_p"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS), help="the results folder")
    p.add_argument("--out", default=str(EVIDENCE_PATH), help="the evidence file to write")
    p.add_argument("--loss-out", default=str(LOSS_EVIDENCE_PATH),
                   help="the loss evidence file to write")
    p.add_argument("--adaptive-out", default=str(ADAPTIVE_EVIDENCE_PATH),
                   help="the adaptive evidence file to write")
    a = p.parse_args(argv)
    records = collect(Path(a.results))
    write_text(a.out, json.dumps(records, indent=0, sort_keys=True) + "\n")
    print(f"{len(records)} evidence records -> {a.out}")
    grids = collect_losses(Path(a.results))
    write_text(a.loss_out, json.dumps(grids, indent=0, sort_keys=True) + "\n")
    print(f"{len(grids)} loss grids -> {a.loss_out}")
    pairs = collect_adaptive(Path(a.results))
    write_text(a.adaptive_out, json.dumps(pairs, indent=0, sort_keys=True) + "\n")
    print(f"{len(pairs)} adaptive settings -> {a.adaptive_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
