"""The corrected diagnosis of stale and reused samples from a run's probes (theory.md section
8.9): ``replaytheory.fit.diagnosis.diagnose`` on the probes of every run in a folder, written as
JSON, with a summary on the terminal.

``python -m llm_experiments.study.diagnose --probes results/diagnosis --out
results/diagnosis/diagnosis.json``

The probes come from runs with ``probe.reuse_gaps`` and ``probe.contribution`` on
(``experiments/cpu_diagnosis.yaml``); each ``*.npz`` in the folder is one run.
"""

from __future__ import annotations

import glob
import os
import zipfile

import numpy as np

from replaytheory.cli_input import (BadInput, Parser, existing_dir, file_label, integer,
                                    one_line, output_file)
from replaytheory.fit.diagnosis import Diagnosis, diagnose
from replaytheory.io import write_json
from replaytheory.fit.probes import ProbeSet


def load_run_probes(paths) -> ProbeSet:
    """The probes of several runs in one set, every row tagged with its run (a ``run``
    column: the index of its file in sorted order), all units kept."""
    if not paths:
        raise FileNotFoundError("no probe files (*.npz) given")
    merged = None
    for i, path in enumerate(sorted(paths)):
        p = _probe_file(path)
        tables = {name: {**t, "run": np.full(p.n_rows(name), float(i))}
                  for name, t in p.tables.items()}
        p = ProbeSet(tables, p.counts)
        merged = p if merged is None else merged.extend(p)
    return merged


def _probe_file(path: str) -> ProbeSet:
    """``ProbeSet.load(path)``; ``BadInput`` naming the file if it is no probe file."""
    try:
        return ProbeSet.load(path)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise BadInput(f"{file_label(path, '--probes')}: not a probe file written by a run "
                       f"({one_line(exc) or type(exc).__name__})") from None


def _line(name: str, est) -> str:
    return f"{name} {est.value:.3g} [{est.low:.3g}, {est.high:.3g}]"


def summary_lines(d: Diagnosis) -> list[str]:
    """The headline numbers with their 95% intervals, one line each."""
    r, b, lines = d.regression, d.bias, []
    if r is not None:
        lines.append(f"noise (sequences, {r.n_rows} rows, {r.n_probes} probes, "
                     f"Spearman(staleness, uses) {r.spearman:.2f}): {_line('per step', r.per_step)}"
                     f", {_line('per use', r.per_use)}, {_line('intercept', r.intercept)}")
    if d.self_corr is not None:
        for gap, est in zip(d.self_corr.gap, d.self_corr.corr):
            lines.append(f"self-correlation at gap {gap:g}: {_line('', est).strip()}")
    if b is not None:
        lines.append(f"buffer bias ({b.n_probes} probes, {int(b.n_rows.sum())} rows): "
                     f"{_line('norm ratio', b.all_norm_ratio)}, {_line('cosine', b.all_cosine)}")
    lines += [f"{name}: not estimated ({why})" for name, why in d.skipped.items()]
    return lines


def main(argv=None) -> int:
    """``python -m llm_experiments.study.diagnose --probes DIR --out diagnosis.json``."""
    p = Parser(prog="python -m llm_experiments.study.diagnose", description=__doc__.splitlines()[0])
    p.add_argument("--probes", type=existing_dir, required=True,
                   help="folder of probe files (*.npz), one per run")
    p.add_argument("--pattern", default="*.npz",
                   help="probe files of the folder to use (default *.npz; e.g. grpo_*.npz)")
    p.add_argument("--out", type=output_file, required=True, help="JSON file to write")
    p.add_argument("--n-boot", type=integer(20), default=400,
                   help="bootstrap replicates (>= 20, default 400)")
    p.add_argument("--seed", type=integer(0), default=0, help="bootstrap seed (>= 0)")
    a = p.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(a.probes, a.pattern)))
    if not paths:
        p.error(f"--probes {a.probes!r} holds no files matching {a.pattern!r}")
    try:
        d = diagnose(load_run_probes(paths), n_boot=a.n_boot, seed=a.seed)
    except ValueError as exc:
        return p.report(exc)
    write_json(a.out, {"sources": [os.path.basename(x) for x in paths], **d.to_dict()})
    for line in summary_lines(d):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
