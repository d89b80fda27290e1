"""``window_predict``: register the finite-run horizon model (theory.md section 11.12) for a
window of a registered grid (its first T updates), from panel probes only, before that window
is scored.

``python -m llm_experiments.study.window_predict --base results/NAME/prediction.json
--steps T --panels RUN_DIR [RUN_DIR ...] --name NAME [--worth kept|align]
[--align-runs RUN_DIR ...] --out DIR``

1. The panels are grouped by birth step into phases (``phase_groups``: consecutive births
   merged until a phase holds ``MIN_PANELS`` panels) and each phase fitted on its own
   (``fit_panels``); all panels together give the pooled fit and the terms the probes support
   (``horizon_predict.supported_terms``).
2. The model's optimum over the window's T updates (``replaytheory.model.window``) at the
   panel runs' measured mu and the accounting mus, with the phases ("horizon", primary) and
   with the pooled fit as one phase ("horizon_one_phase": fill-up and AUC weighting alone);
   section 5's optimum with the pooled noise table ("asymptotic"). A stale rollout's worth is
   the clip's kept share, or with ``--worth align`` its alignment with grad F (11.4, 11.13);
   ``--align-runs`` takes align(g) from large align panels instead (11.15,
   ``probing.align``): each phase the curve of the align birth nearest its own, the pooled
   fit the pooled curve.
3. ``DIR/prediction.json``: the base registration's grid, bootstrap and gate with ``steps``
   = T, in the format ``judge`` reads; judge it on the base grid's curves.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import numpy as np

from replaytheory.checks import choice
from replaytheory.cli_input import Parser, existing_file, output_dir
from replaytheory.fit.align_fit import AlignFit, fit_align
from replaytheory.fit.panel_fit import MIN_PANELS, PanelFit, fit_panels
from replaytheory.fit.probes import ProbeSet
from replaytheory.io import write_json
from replaytheory.model import horizon as hz
from replaytheory.model import window as wn

from .horizon_predict import MU_KEY_DIGITS, panel_dirs, panel_mu, supported_terms
from .predict import runs_warm_start
from .validation import ACCOUNTING_MUS, load_probes

# the base registration's fields a window keeps (its grid and how it is judged)
KEPT = ("config", "set", "loss", "horizons", "replay_ratios", "learning_rates",
        "accounting_mus", "primary_measure", "secondary_targets", "bootstrap", "gate",
        "extrapolate", "warm_start")


def _births(probes: ProbeSet) -> dict:
    """table name -> each row's (run, birth step) for the panel, diversity and bias rows."""
    def pairs(t, births):
        # a single run's probes carry no run column (``load_probes`` adds it when merging)
        return np.stack([t.get("run", np.zeros(len(births))), births], 1)

    b = probes.tables["bias"]
    return {"panel": pairs(probes.tables["panel"], probes.tables["panel"]["birth_step"]),
            "diversity": pairs(probes.tables["diversity"],
                               probes.tables["diversity"]["birth_step"]),
            "bias": pairs(b, b["probe_step"] - b["staleness"])}


def phase_groups(probes: ProbeSet) -> list[tuple]:
    """The phases: consecutive birth steps merged until each group holds ``MIN_PANELS``
    panels (run, birth) (a short last group joins the one before); as tuples of births."""
    panels = sorted({(float(b), float(r)) for r, b in _births(probes)["panel"]})
    births = sorted({b for b, _ in panels})
    count = {b: sum(1 for bb, _ in panels if bb == b) for b in births}
    groups, cur, held = [], [], 0
    for b in births:
        cur.append(b)
        held += count[b]
        if held >= MIN_PANELS:
            groups.append(tuple(cur))
            cur, held = [], 0
    if cur:
        if not groups:
            raise ValueError(f"the panels hold {held} panel(s); a phase needs {MIN_PANELS}")
        groups[-1] = (*groups[-1], *cur)
    return groups


def born_in(probes: ProbeSet, births: tuple) -> ProbeSet:
    """The rows of panels born at one of ``births`` (other tables dropped)."""
    rows = _births(probes)
    keep = {name: np.isin(rows[name][:, 1], births) for name in rows}
    return ProbeSet({name: {c: col[keep[name]] for c, col in probes.tables[name].items()}
                     for name in keep}, probes.counts)


@dataclass(frozen=True)
class PhaseFit:
    """One phase: its mean birth step (over its panels) and its ``PanelFit``."""

    birth: float
    fit: PanelFit

    def to_dict(self) -> dict:
        return {"birth": self.birth, "fit": self.fit.to_dict()}


def phase_fits(probes: ProbeSet, n_boot: int = 400) -> list[PhaseFit]:
    """A ``PanelFit`` per phase (``phase_groups``), at the mean birth of its panels."""
    out = []
    panel_births = _births(probes)["panel"]
    for group in phase_groups(probes):
        clusters = {(r, b) for r, b in panel_births if b in group}
        out.append(PhaseFit(birth=float(np.mean([b for _, b in clusters])),
                            fit=fit_panels(born_in(probes, group), n_boot=n_boot)))
    return out


def with_align(fit: PanelFit, birth: float | None, align: AlignFit | None) -> PanelFit:
    """``fit`` with its align curve from the large align panels (theory.md 11.15): the curve
    of the align birth nearest ``birth`` (None: the pooled curve); ``fit`` itself without
    ``align``."""
    if align is None:
        return fit
    if birth is None:
        return replace(fit, align=align.pooled)
    nearest = min(align.by_birth, key=lambda b: abs(b - birth))
    return replace(fit, align=align.by_birth[nearest])


def register(base: dict, steps: int, run_dirs: list[str], *, name: str, note: str = "",
             worth: str = "kept", align_dirs: list[str] = ()) -> dict:
    """The window registration (module docstring) of the ``base`` registration's grid scored
    over its first ``steps`` updates (1 <= steps <= the base's), from the panel runs
    ``run_dirs``; ``worth`` (``horizon.WORTHS``): a stale rollout's worth read from the clip's
    kept share or from its alignment with grad F (theory.md 11.4, 11.13); ``align_dirs``: run
    folders of large align panels whose align(g) replaces the panels' (11.15, ``with_align``;
    needs worth "align")."""
    choice("--worth", worth, hz.WORTHS)
    if align_dirs and worth != "align":
        raise ValueError(f"--align-runs needs --worth align, got --worth {worth}")
    align = fit_align(load_probes([os.path.join(d, "probes.npz") for d in align_dirs]),
                      n_boot=400) if align_dirs else None
    if not 1 <= steps <= int(base["steps"]):
        raise ValueError(f"--steps must be in [1, {base['steps']}] (the base grid's run "
                         f"length), got {steps}")
    probes = load_probes([os.path.join(d, "probes.npz") for d in run_dirs])
    pooled = with_align(fit_panels(probes, n_boot=400), None, align)
    supported = supported_terms(pooled)
    phases = [replace(p, fit=with_align(p.fit, p.birth, align)) for p in phase_fits(probes)]
    longest = int(max(base["horizons"]))
    model = {"supported": {t: {"used": bool(ok), "reason": why}
                           for t, (ok, why) in supported.items()},
             "panel_fit": pooled.to_dict(),
             "window": {"steps": steps, "worth": worth,
                        **({"align_runs": sorted(os.path.basename(d) for d in align_dirs)}
                           if align_dirs else {}),
                        "phases": [p.to_dict() for p in phases]}}
    phased, one = wn.registered_window(model, longest)
    tables = {"horizon": wn.step_tables(phased, steps),
              "horizon_one_phase": wn.step_tables(one, steps)}
    mu = panel_mu(run_dirs)
    mus = {MU_KEY_DIGITS.format(mu): mu, **{f"{m:g}": m for m in ACCOUNTING_MUS}}
    y_max = float(base["primary_measure"]["budget_replay_ratio"])
    by_mu = {key: {v: wn.optimal_design(tab, mu=m, y_max=y_max, max_horizon=longest).to_dict()
                   for v, tab in tables.items()} for key, m in mus.items()}
    judged = {v: {k: [float(d[v]["horizon"]), float(d[v]["replay_ratio"])]
                  for k, d in by_mu.items()} for v in tables}
    section5 = hz.section5_terms(one.terms[0])
    judged["asymptotic"] = {k: [float(d.horizon), float(d.replay_ratio)] for k, d in
                            ((k, hz.optimal_design(section5, mu=m, max_horizon=longest))
                             for k, m in mus.items())}
    runs_warm_start(run_dirs)  # the panels must share one initial policy
    return {"name": name, **{k: base[k] for k in KEPT if k in base}, "steps": steps,
            "measured_mu": mu, "primary_variant": "horizon", "predictions_judged": judged,
            "horizon_model": {**model, "by_mu": by_mu,
                              "panel_runs": sorted(os.path.basename(d) for d in run_dirs)},
            "window_of": base["name"], "note": note}


def main(argv=None) -> int:
    p = Parser(prog="python -m llm_experiments.study.window_predict",
               description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=existing_file, required=True,
                   help="the grid's registration (prediction.json)")
    p.add_argument("--steps", type=int, required=True, help="the window: first T updates")
    p.add_argument("--panels", nargs="+", required=True, metavar="RUN_DIR",
                   help="run folders with panel probes (globs allowed)")
    p.add_argument("--name", required=True)
    p.add_argument("--worth", default="kept", choices=hz.WORTHS,
                   help="a stale rollout's worth: the clip's kept share (default) or its "
                        "alignment with grad F (theory.md 11.4, 11.13)")
    p.add_argument("--align-runs", nargs="+", default=[], metavar="RUN_DIR",
                   help="run folders of large align panels (probe.align_groups; globs "
                        "allowed): their align(g) by birth replaces the panels' (theory.md "
                        "11.15; needs --worth align)")
    p.add_argument("--note", default="")
    p.add_argument("--out", type=output_dir, required=True, help="folder for prediction.json")
    a = p.parse_args(argv)
    try:
        dirs = panel_dirs(a.panels)
        with open(a.base) as fh:
            base = json.load(fh)
        reg = register(base, a.steps, dirs, name=a.name, note=a.note, worth=a.worth,
                       align_dirs=panel_dirs(a.align_runs, "--align-runs") if a.align_runs
                       else ())
    except (ValueError, OSError, KeyError) as exc:
        return p.report(exc)
    path = os.path.join(a.out, "prediction.json")
    write_json(path, reg)
    for key, by in reg["horizon_model"]["by_mu"].items():
        print(f"mu = {key:>6s}: " + "; ".join(
            f"{v} x* = {d['horizon']}, y* = {d['replay_ratio']:.3g}, J_T = {d['objective']:.3f}"
            for v, d in by.items()))
    print(f"{path}: commit it before the window is scored")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
