"""Sweep results as learning curves: compaction for git, loading, per-run and per-cell scores.

A sweep folder (``sweep.py``) holds every run's full ``metrics.jsonl``; ``compact_sweep``
keeps what the analysis and the figures read (eval points, a thinned training curve, the
summary) in one ``curves.jsonl`` small enough to commit. ``load_runs`` reads it back as
``Run`` objects. Compute is accounted afterwards for any mu, in trainer-update units
(theory.md section 3): ``compute = steps + mu * samples_generated / B``, exact for the
synchronous and on-policy schedules (their dynamics do not depend on mu).

A *cell* is a run's settings without the seed and the learning rate; the best learning rate is
chosen per cell (as the paper's Pareto frontiers do).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from replaytheory.stats.analysis import compute_to_target, tail_mean
from replaytheory.cli_input import (BadInput, Parser, existing_file, file_label, missing_field,
                                    output_file, read_json, read_jsonl, read_text)
from replaytheory.io import atomic_write, write_text

SEED_KEY, LR_KEY = "run.seed", "trainer.lr"
# Settings that change how fast a run computes, not what: never part of a cell.
SPEED_KEYS = ("run.fast_kernels", "run.direct_forward", "run.train_layout", "run.threads",
              "run.progress", "sampler.linear_kernel")
EVAL_KEYS = ("eval_accuracy", "pass@1", "pass@2", "pass@4", "pass@8", "pass@16")
TRAIN_KEYS = ("train_reward", "entropy", "staleness_mean", "replay_ratio_mean",
              "steps_since_last_use_mean", "clip_fraction", "approx_kl", "is_ess", "grad_norm")
# The stale-rollout diagnostics (theory.md section 12.2): kept where a run logs them, so that
# runs from before them compact to the same bytes.
STALENESS_KEYS = ("staleness_max", "ratio_max", "logr2", "logr2_kept", "acted_pos",
                  "acted_neg", "head_grad_norm")
# The adaptive horizon's (theory.md 12.4): kept only for runs that evict by drift.
ADAPTIVE_KEYS = ("dropped", "buffer_occupancy")
UNCERTAIN_KEYS = ("uncertain_share",)  # 12.7: only where the statistic reads some tokens
TRAIN_EVERY = 5  # keep every 5th step of the training curves
CURVES = "a compacted curves.jsonl (results.py)"  # for error messages


def cell_of(settings: dict) -> tuple:
    """A run's cell: its settings without seed, learning rate and speed settings, sorted."""
    return tuple(sorted((k, v) for k, v in settings.items()
                        if k not in (SEED_KEY, LR_KEY, *SPEED_KEYS)))


WARM_START_KEYS = ("warm_start_sha256", "warm_start_accuracy")


def warm_start_of(summary: dict) -> dict:
    """A run summary's initial-policy fields (``WARM_START_KEYS``; None where absent)."""
    return {k: summary.get(k) for k in WARM_START_KEYS}


def same_warm_start(a: dict, b: dict) -> bool:
    """Whether two runs' summaries name the same initial policy: by the warm start's digest
    where both record it, else (runs from before the digest was recorded) by the eval accuracy
    at step 0, which differed between the policies trained on different machines."""
    if a.get("warm_start_sha256") and b.get("warm_start_sha256"):
        return a["warm_start_sha256"] == b["warm_start_sha256"]
    return a.get("warm_start_accuracy") == b.get("warm_start_accuracy")


@dataclass
class Run:
    """One finished run: its settings, eval curve, thinned training curve and summary."""

    run_id: str
    settings: dict
    batch_size: int
    eval: dict[str, np.ndarray]
    train: dict[str, np.ndarray]
    summary: dict = field(default_factory=dict)

    @property
    def cell(self) -> tuple:
        """Settings without seed, learning rate and speed settings, as a sorted tuple."""
        return cell_of(self.settings)

    @property
    def seed(self) -> int:
        return int(self.settings.get(SEED_KEY, 0))

    @property
    def lr(self) -> float:
        return float(self.settings.get(LR_KEY, math.nan))

    def get(self, key, default=None):
        """A setting of this run (e.g. "buffer.horizon")."""
        return self.settings.get(key, default)

    def compute(self, mu: float, where: str = "eval") -> np.ndarray:
        """Compute spent up to each logged point, in trainer updates, for this mu."""
        d = self.eval if where == "eval" else self.train
        return d["step"] + mu * d["samples_generated"] / self.batch_size

    def compute_to_target(self, mu: float, target: float) -> float:
        """Compute (interpolated between evaluations) to first reach accuracy ``target``."""
        return compute_to_target(self.compute(mu), self.eval["eval_accuracy"], target,
                                 interpolate=True)

    def tail_accuracy(self, fraction: float = 0.25) -> float:
        """Mean eval accuracy over the last ``fraction`` of the run's steps."""
        return tail_mean(self.eval["step"], self.eval["eval_accuracy"], fraction)


def _columns(records: list[dict], keys, digits: int | None = None) -> dict[str, list]:
    """Columns of ``keys`` over ``records``; floats rounded to ``digits`` significant digits
    if given (training diagnostics need no more, and the file stays small enough for git)."""
    def fmt(x):
        return float(f"{x:.{digits}g}") if digits and isinstance(x, float) else x
    return {k: [fmt(r.get(k)) for r in records] for k in keys}


def compact_run(run_dir: str, run_id: str, settings: dict) -> dict:
    """One run folder as a compact record (eval points, every 5th step, the summary without
    its histograms: ``compact_histograms`` keeps those)."""
    # a line cut by a kill is skipped: the run was resumed and logged that step again
    records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"), skip_torn=True)
    summary = read_json(os.path.join(run_dir, "summary.json"))
    from ..config import read_yaml
    cfg = read_yaml(os.path.join(run_dir, "config.yaml"))
    # A record of step t evaluates theta_t before step t's rollouts are made but logs the
    # counters after them: the compute spent before the evaluation excludes those rollouts.
    evals = [{**r, "samples_generated": r["samples_generated"] - (r.get("new_rollouts") or 0)}
             for r in records if r.get("eval_accuracy") is not None]
    train = [r for r in records if r["step"] % TRAIN_EVERY == 0]
    base = ("step", "samples_generated", "samples_consumed")
    logged = tuple(k for k in STALENESS_KEYS if any(k in r for r in train))
    if any("dropped" in r for r in train):
        logged += ADAPTIVE_KEYS
    if any("uncertain_share" in r for r in train):
        logged += UNCERTAIN_KEYS
    return {"run_id": run_id, "settings": settings,
            "batch_size": cfg["schedule"]["batch_size"],
            "eval": _columns(evals, base + EVAL_KEYS),
            "train": _columns(train, base + TRAIN_KEYS + logged, digits=4),
            "summary": {k: val for k, val in summary.items() if k != "histograms"}}


def compact_sweep(sweep_dirs, out_path: str, keep=(), grid_only: bool = False) -> int:
    """Write ``curves.jsonl`` for every finished run of one sweep folder or several (e.g.
    more seeds of a grid run later); returns the count. An ``out_path`` ending in ``.gz`` is
    gzip-compressed (byte-for-byte reproducible); every reader here takes either.

    ``keep``: compacted curves files whose records are carried over first, in their order,
    unless the sweep folders hold the same run id (a sweep continued with ``--done-in`` on a
    machine without the earlier run folders). ``out_path`` may be one of them.
    ``grid_only``: carry over only the kept records whose run id belongs to the sweep folders'
    grids (a grid that reuses the identical runs of another sweep takes those, not the rest
    of that sweep).
    """
    kept: dict[str, str] = {}
    for path in keep:  # each record's line kept as it is: the output's bytes stay reproducible
        lines = [line.strip() for line in read_text(path, "--keep").splitlines() if line.strip()]
        for rec, line in zip(read_jsonl(path, "--keep"), lines):
            kept.setdefault(_field(rec, "run_id", path, "--keep"), line)
    lines, fresh, grid = [], set(), set()
    for sweep_dir in [sweep_dirs] if isinstance(sweep_dirs, str) else sweep_dirs:
        runs = sweep_runs(sweep_dir)
        grid |= {r["run_id"] for r in runs}
        for r in runs:
            run_dir = os.path.join(sweep_dir, "runs", r["run_id"])
            if os.path.exists(os.path.join(run_dir, "summary.json")):
                lines.append(json.dumps(compact_run(run_dir, r["run_id"], r["overrides"])))
                fresh.add(r["run_id"])
    lines = [line for rid, line in kept.items()
             if rid not in fresh and (rid in grid or not grid_only)] + lines
    write_text(out_path, "\n".join(lines) + "\n")
    return len(lines)


def _arrays(d: dict) -> dict[str, np.ndarray]:
    return {k: np.array([np.nan if x is None else x for x in col], dtype=float)
            for k, col in d.items()}


def load_runs(path: str, **where) -> list[Run]:
    """Runs of a ``curves.jsonl``, optionally only those whose settings match ``where``
    (keys with dots written with double underscores: ``trainer__loss="grpo"``)."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    want = {k.replace("__", "."): v for k, v in where.items()}
    out = []
    for rec in read_jsonl(path):
        try:
            if any(rec["settings"].get(k) != v for k, v in want.items()):
                continue
            out.append(Run(run_id=rec["run_id"], settings=rec["settings"],
                           batch_size=int(rec["batch_size"]), eval=_arrays(rec["eval"]),
                           train=_arrays(rec["train"]), summary=rec.get("summary", {})))
        except KeyError as exc:
            raise missing_field(exc, path, expected=CURVES) from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise BadInput(f"{file_label(path)}: run {rec.get('run_id')!r}: {exc}; expected "
                           f"{CURVES}") from None
    return out


def sweep_runs(sweep_dir: str) -> list[dict]:
    """The runs ({"run_id", "overrides"}) listed in a sweep folder's ``sweep.json``;
    ``BadInput`` naming the file if it is unreadable or lists none."""
    path = os.path.join(sweep_dir, "sweep.json")
    runs = _field(read_json(path, "--sweep"), "runs", path, "--sweep")
    if not (isinstance(runs, list) and all(isinstance(r, dict) and "run_id" in r
                                           and "overrides" in r for r in runs)):
        raise BadInput(f"{file_label(path, '--sweep')}: 'runs' is not a list of "
                       f"{{run_id, overrides}} (sweep.py writes it)")
    return runs


def _field(record: dict, name: str, path: str, flag: str = ""):
    try:
        return record[name]
    except KeyError as exc:
        raise missing_field(exc, path, flag) from None


def by_cell(runs: list[Run]) -> dict[tuple, list[Run]]:
    """Runs grouped by cell, in first-seen order."""
    out: dict[tuple, list[Run]] = {}
    for r in runs:
        out.setdefault(r.cell, []).append(r)
    return out


@dataclass(frozen=True)
class ScoreTable:
    """Scores of runs as an array ``values`` of shape (cells, learning rates, seeds), NaN for
    a missing run (the layout of ``split_half_spearman`` & co.), with the cells (first-seen
    order, ``by_cell``), learning rates and seeds (ascending) its axes stand for."""

    cells: list
    lrs: list
    seeds: list
    values: np.ndarray

    @classmethod
    def of(cls, runs: list[Run], score) -> ScoreTable:
        """``score(run)`` (a function Run -> float) of every run."""
        cells = list(by_cell(runs))
        lrs = sorted({r.lr for r in runs})
        seeds = sorted({r.seed for r in runs})
        values = np.full((len(cells), len(lrs), len(seeds)), np.nan)
        index = {c: i for i, c in enumerate(cells)}
        for r in runs:
            values[index[r.cell], lrs.index(r.lr), seeds.index(r.seed)] = score(r)
        return cls(cells=cells, lrs=lrs, seeds=seeds, values=values)


def _split_label(settings: dict) -> str:
    w, t = settings.get("schedule.workers"), settings.get("schedule.trainers")
    n = settings.get("buffer.capacity")
    mode = settings.get("schedule.mode", "sync")
    if mode == "on_policy":
        return "on-policy"
    if mode == "async":
        return f"(W,T)=({w},{t}), N={n}"
    return f"x={settings.get('buffer.horizon')}, y={settings.get('schedule.replay_ratio')}"


def compact_histograms(sweep_dir: str, out_path: str) -> int:
    """``histograms.jsonl``: per finished run, a label, its settings, the three histograms of
    sample use (theory.md section 2) and the average replay ratio. Returns the count."""
    runs = sweep_runs(sweep_dir)
    lines = []
    for r in runs:
        path = os.path.join(sweep_dir, "runs", r["run_id"], "summary.json")
        if not os.path.exists(path):
            continue
        s = read_json(path)
        consumed, generated = s.get("samples_consumed"), s.get("samples_generated")
        lines.append(json.dumps({
            "label": _split_label(r["overrides"]), "settings": r["overrides"],
            "histograms": s["histograms"],
            "mean_replay_ratio": consumed / generated if generated else None}))
    atomic_write(out_path, lambda fh: fh.write("\n".join(lines) + "\n"))
    return len(lines)


def main(argv=None) -> int:
    """``python -m llm_experiments.study.results --sweep DIR [DIR ...] --out curves.jsonl
    [--histograms F]``"""
    p = Parser(prog="python -m llm_experiments.study.results",
               description="compact a sweep folder for the analysis")
    p.add_argument("--sweep", required=True, nargs="+",
                   help="sweep folder(s) (sweep.py --out); several go into one file")
    p.add_argument("--out", type=output_file, required=True,
                   help="curves.jsonl to write (curves.jsonl.gz: gzip-compressed, for "
                        "grids whose table would pass a few MB)")
    p.add_argument("--histograms", type=output_file,
                   help="also write the runs' histograms to this JSONL")
    p.add_argument("--keep", type=existing_file, nargs="+", default=[], metavar="CURVES",
                   help="compacted curves whose runs are carried over unless the sweep "
                        "folders hold them (may name --out itself)")
    p.add_argument("--grid-only", action="store_true",
                   help="carry over only the --keep runs that belong to the sweeps' grids")
    a = p.parse_args(argv)
    for d in a.sweep:
        if not os.path.isfile(os.path.join(d, "sweep.json")):
            p.error(f"--sweep {d!r} is not a sweep folder (no sweep.json)")
    if a.histograms and len(a.sweep) > 1:
        p.error("--histograms takes one sweep folder")
    try:
        print(f"{compact_sweep(a.sweep, a.out, keep=a.keep, grid_only=a.grid_only)} runs -> "
              f"{a.out}")
        if a.histograms:
            print(f"{compact_histograms(a.sweep[0], a.histograms)} runs -> {a.histograms}")
    except ValueError as exc:
        return p.report(exc)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
