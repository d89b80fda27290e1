"""The horizon under each stale-rollout loss (theory.md section 12,
docs/experiments/horizon_losses.md): setting 1 (``results/horizon_losses``, seeds 10-19 of
cpu_sweep_v3's setting, y = 2, lr 1e-4; P1-P5), setting 2 (``results/horizon_losses_lr2``,
horizon_lr2's setting, seeds 10-14; Q1-Q3), the adaptive horizon
(``results/horizon_adaptive``; A1-A3; B1-B3 on setting 2) and where it never ran
(``results/adaptive_transfer``, ``results/adaptive_long``; C1-C5,
``figures.losses.transfer``) and over uncertain tokens (``results/adaptive_uncertain*``; U1-U4,
``figures.losses.uncertain``), judged by ``figures.losses.verdicts`` against the registrations
in ``experiments/``, and the staleness diagnostics each loss logged.

``python -m figures.losses [--out DIR]`` writes ``losses.md`` (mean AUC per loss and x with
95% seed-bootstrap intervals, each loss minus grpo paired by seed, the registered claims as
far as the runs so far allow), ``losses.json``, ``losses.png`` / ``.pdf`` (AUC against x per
loss, one panel per setting) and ``losses_diagnostics.png`` / ``.pdf`` (per loss, the
diagnostics of section 12.2 against the mean staleness of the rollouts trained on, setting
1).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from figures.losses.verdicts import (ADAPTIVE, ADAPTIVE2, LOSSES, LR_ARM, SETTING1, SETTING2,
                                     adaptive_rows, claims_adaptive, claims_adaptive2, claims_lr,
                                     claims_setting1, claims_setting2, load, lr_rows, rows_of)
from figures.losses.transfer import judge_scaled, judge_transfer, scaled_table, transfer_table
from figures.losses.uncertain import judge_uncertain, uncertain_table
from figures.style import ON_POLICY_COLOR, PALETTE, figure_parser, plt, save, write_text
from figures.unclipped import RESULTS, auc

DIAGNOSTICS = (("acted_neg", "share of negatives acted on"),
               ("acted_pos", "share of positives acted on"),
               ("logr2", "mean (log r)^2"), ("is_ess", "importance-weight ESS"),
               ("grad_norm", "gradient norm"), ("head_grad_norm", "lm-head gradient norm"))
LATE = 100  # diagnostics are averaged over the updates from here on (the buffer is full)


def judge_grid(arms: dict, on_policy: dict, horizons, claims) -> dict:
    """One loss grid's rows per (loss, x), best x per loss, claims and on-policy's AUC."""
    rows = rows_of(arms, horizons)
    means = {k: {x: r["auc"][0] for x, r in by_x.items() if r} for k, by_x in rows.items()}
    onp = np.array([auc(r) for r in on_policy.values()])
    return {"rows": rows, "best": {k: max(m, key=m.get) for k, m in means.items() if m},
            "claims": claims(rows), "on_policy": float(onp.mean()) if onp.size else None,
            "seeds": sorted({s for by_x in arms.values() for by_s in by_x.values()
                             for s in by_s})}


def _cell(v) -> str:
    return "-" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def _claims(claims: dict) -> list[str]:
    if not claims:
        return ["* not judged yet: some cell has no runs"]
    out = []
    for k, ok in claims.items():
        if isinstance(ok, bool):
            out.append(f"* {k}: {'holds' if ok else 'fails'}")
        elif k == "best_fixed":
            out.append(f"* the best fixed cell: {ok['loss']} at x = {ok['x']} (AUC "
                       f"{ok['auc_on_adaptive_seeds']:.3f} on the adaptive arms' seeds); each "
                       "adaptive arm minus it, paired by seed: " + ", ".join(
                           f"{arm} {_cell(d)}" for arm, d in ok["adaptive_minus_best"].items()))
        elif k == "G2":
            out.append(f"* G2, each loss's best cell minus grpo's best: " + ", ".join(
                f"{loss} {_cell(d)}" for loss, d in ok.items()))
        else:
            out.append(f"* {k}: {ok}")
    return out


def _status(n: int, registered: int) -> str:
    """Whether the claims below, judged on ``n`` seeds, are the verdict or an interim
    reading."""
    return ("the verdict" if n >= registered else
            f"INTERIM, not the verdict: {n} of the {registered} registered seeds")


def table(v: dict, title: str, registered: str, evaluations: int, seeds: int) -> str:
    """One grid's verdict as markdown."""
    onp = v["on_policy"]
    lines = [f"## {title}", "",
             f"Seeds: {v['seeds']}. AUC: mean eval accuracy over {evaluations} evaluations; "
             "95% seed-bootstrap intervals; differences paired by seed. On-policy (grpo): "
             f"{'-' if onp is None else round(onp, 3)}.",
             "", "| loss | x | seeds | AUC | minus grpo |", "|---|---|---|---|---|"]
    for loss, by_x in v["rows"].items():
        for x, r in by_x.items():
            if r:
                diff = "-" if loss == "grpo" else _cell(r["minus"])
                lines.append(f"| {loss} | {x} | {r['seeds']} | {_cell(r['auc'])} | {diff} |")
    lines += ["", "Best x per loss (mean AUC): " +
              ", ".join(f"{k} {x}" for k, x in v["best"].items()), "",
              f"Registered claims ({registered}; {_status(len(v['seeds']), seeds)}):", ""]
    return "\n".join(lines + _claims(v["claims"])) + "\n"


def adaptive_table(rows: dict, claims: dict, seeds: int, title: str) -> str:
    """The adaptive horizon against x = 64 of the same loss, as markdown."""
    lines = [f"## {title}", "",
             "| loss | drop (log r)^2 > | seeds | AUC | minus x = 64 | staleness (adaptive, "
             "x = 64) | held at the end |", "|---|---|---|---|---|---|---|"]
    for loss, by_tau in rows.items():
        for tau, r in sorted(by_tau.items()):
            if r:
                st = r["staleness"]
                lines.append(f"| {loss} | {tau:g} | {r['seeds']} | {_cell(r['auc'])} | "
                             f"{_cell(r['minus'])} | {st[0]:.1f}, {st[1]:.1f} | "
                             f"{r['held_at_end']:.0f} |")
    have = max((r["seeds"] for by_tau in rows.values() for r in by_tau.values() if r), default=0)
    return "\n".join(lines + ["", f"Registered claims ({_status(have, seeds)}):", ""] +
                     _claims(claims)) + "\n"


def _panel(ax, v: dict, title: str) -> None:
    for i, loss in enumerate(LOSSES):
        pts = [(x, r["auc"]) for x, r in v["rows"][loss].items() if r]
        if pts:
            xs = np.array([p[0] for p in pts], float) * (1 + 0.03 * (i - 2.5))
            m = np.array([p[1] for p in pts])
            ax.errorbar(xs, m[:, 0], yerr=[m[:, 0] - m[:, 1], m[:, 2] - m[:, 0]], fmt="o-",
                        color=PALETTE[1 + i % (len(PALETTE) - 1)], capsize=2, label=loss,
                        ms=3)
    if v["on_policy"] is not None:
        ax.axhline(v["on_policy"], color=ON_POLICY_COLOR, ls="--", lw=1, label="on-policy")
    ax.set(xscale="log", xlabel="buffer x (updates)", ylabel="AUC (mean eval accuracy)",
           title=title)


def draw(one: dict, two: dict):
    """Mean AUC against x (log) per loss with intervals, on-policy as a line: one panel per
    setting."""
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    _panel(axes[0], one, "setting 1 (lr 1e-4, 300 updates)")
    _panel(axes[1], two, "setting 2 (lr 2e-4, 100 updates)")
    axes[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def diagnostics(arms: dict) -> dict:
    """{loss: {key: [(mean staleness, mean diagnostic)] over runs}}, from update LATE on."""
    out: dict = {}
    for loss, by_x in arms.items():
        for by_seed in by_x.values():
            for r in by_seed.values():
                steps = np.asarray(r.train["step"])
                late = steps >= LATE
                stale = np.array(r.train["staleness_mean"], float)[late]
                for key, _ in DIAGNOSTICS:
                    vals = np.array([np.nan if x is None else x
                                     for x in r.train.get(key, [None] * len(steps))],
                                    float)[late]
                    if np.isfinite(vals).any():
                        out.setdefault(loss, {}).setdefault(key, []).append(
                            (float(np.nanmean(stale)), float(np.nanmean(vals))))
    return out


def draw_diagnostics(d: dict):
    """One panel per diagnostic, mean over late updates per run against its mean staleness."""
    fig, axes = plt.subplots(2, 3, figsize=(8.4, 5.0))
    for ax, (key, label) in zip(axes.flat, DIAGNOSTICS):
        for i, loss in enumerate(LOSSES):
            pts = np.array(d.get(loss, {}).get(key, []))
            if pts.size:
                ax.plot(pts[:, 0], pts[:, 1], "o", ms=2.5, alpha=0.7, label=loss,
                        color=PALETTE[1 + i % (len(PALETTE) - 1)])
        ax.set(xscale="log", xlabel="mean staleness (updates)", title=label)
    if axes.flat[0].get_legend_handles_labels()[0]:
        axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def lr_table(rows: dict, claims: dict, seeds: int) -> str:
    """Each loss at its second learning rate against its lr 1e-4 cell, as markdown."""
    lines = ["## One more learning rate (L1-L4, experiments/horizon_losses_lr.yaml)", "",
             "5e-5 for m2po, cispo, neg_cap; 2e-4 for grpo, neg_clip, neg_veto.", "",
             "| loss | x | seeds | AUC | minus its lr 1e-4 | minus grpo lr 1e-4 at x = 64 |",
             "|---|---|---|---|---|---|"]
    for loss, by_x in rows.items():
        for x, r in by_x.items():
            if r and x != "grpo_64":
                vs = _cell(by_x["grpo_64"]["minus"]) if x == 64.0 and by_x["grpo_64"] else "-"
                lines.append(f"| {loss} | {x:g} | {r['seeds']} | {_cell(r['auc'])} | "
                             f"{_cell(r['minus'])} | {vs} |")
    have = max((r["seeds"] for by in rows.values() for r in by.values() if r), default=0)
    return "\n".join(lines + ["", f"Registered claims ({_status(have, seeds)}):", ""] +
                     _claims(claims)) + "\n"


def _record(v: dict) -> dict:
    return {**v, "rows": {k: {str(x): r for x, r in by_x.items()} for k, by_x in v["rows"].items()}}


def main(argv=None) -> list[Path]:
    p = figure_parser(__doc__)
    p.add_argument("--results", default=str(RESULTS), help="the results folder")
    a = p.parse_args(argv)
    folder = Path(a.results)
    first = folder / SETTING1[0] / "curves.jsonl.gz"
    if not first.exists():  # make_all reports the family as skipped
        raise FileNotFoundError(str(first))
    arms, on_policy = load(folder, SETTING1[0])
    one = judge_grid(arms, on_policy, SETTING1[1], lambda rows: claims_setting1(arms, rows))
    two = judge_grid(*load(folder, SETTING2[0]), SETTING2[1], claims_setting2)
    adaptive, _ = load(folder, ADAPTIVE, key="buffer.drop_logr2")
    ad_rows = adaptive_rows(adaptive, arms)
    ad_claims = claims_adaptive(adaptive, arms, one["rows"])
    arms2, _ = load(folder, SETTING2[0])
    adaptive2, _ = load(folder, ADAPTIVE2, key="buffer.drop_logr2")
    ad2_rows = adaptive_rows(adaptive2, arms2)
    ad2_claims = claims_adaptive2(adaptive2, arms2, two["rows"])
    second, _ = load(folder, LR_ARM)
    l_rows, l_claims = lr_rows(second, arms), claims_lr(second, arms)
    transfer, scaled = judge_transfer(folder), judge_scaled(folder)
    uncertain = judge_uncertain(folder)
    text = ("# The horizon under each stale-rollout loss (theory.md section 12)\n\n" +
            table(one, "Setting 1: cpu_sweep_v3's, lr 1e-4, 300 updates",
                  "P1-P5, experiments/horizon_losses.yaml", 13, 10) + "\n" +
            table(two, "Setting 2: horizon_lr2's, lr 2e-4, 100 updates",
                  "Q1-Q3, experiments/horizon_losses_lr2.yaml", 11, 5) + "\n" +
            adaptive_table(ad_rows, ad_claims, 5, "The adaptive horizon on setting 1 (A1-A3, "
                           "experiments/horizon_adaptive.yaml)") + "\n" +
            adaptive_table(ad2_rows, ad2_claims, 5, "The adaptive horizon on setting 2 (B1-B3, "
                           "experiments/horizon_adaptive_lr2.yaml)") + "\n" +
            lr_table(l_rows, l_claims, 5) + "\n" + transfer_table(transfer) + "\n" +
            scaled_table(scaled) + "\n" + uncertain_table(uncertain))
    record = {"setting1": _record(one), "setting2": _record(two),
              "adaptive": {"rows": {k: {str(t): r for t, r in by.items()}
                                    for k, by in ad_rows.items()}, "claims": ad_claims},
              "adaptive2": {"rows": {k: {str(t): r for t, r in by.items()}
                                     for k, by in ad2_rows.items()}, "claims": ad2_claims},
              "second_lr": {"rows": {k: {str(x): r for x, r in by.items()}
                                     for k, by in l_rows.items()}, "claims": l_claims},
              "transfer": transfer, "scaled": scaled, "uncertain": uncertain}
    return [write_text(text, "losses.md", a.out),
            write_text(json.dumps(record, indent=1), "losses.json", a.out),
            *save(draw(one, two), "losses", a.out),
            *save(draw_diagnostics(diagnostics(arms)), "losses_diagnostics", a.out)]


if __name__ == "__main__":
    main()
