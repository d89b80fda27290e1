"""The horizon under each stale-rollout loss (theory.md section 12,
docs/experiments/horizon_losses.md): ``results/horizon_losses`` (seeds 10-19 of
cpu_sweep_v3's setting, y = 2, lr 1e-4), judged against the predictions P1-P5 registered in
``experiments/horizon_losses.yaml``, and the staleness diagnostics each loss logged.

``python -m figures.losses [--out DIR]`` writes ``losses.md`` (mean AUC per loss and x with
95% seed-bootstrap intervals, each loss minus grpo paired by seed, the registered claims as
far as the seeds run so far allow), ``losses.json``, ``losses.png`` / ``.pdf`` (AUC against
x per loss) and ``losses_diagnostics.png`` / ``.pdf`` (per loss, the diagnostics of section
12.2 against the mean staleness of the rollouts trained on).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from figures.style import ON_POLICY_COLOR, PALETTE, plt, save, write_text
from figures.unclipped import DRAWS, RESULTS, auc, mean_interval
from llm_experiments.study.results import load_runs

LOSSES = ("grpo", "neg_clip", "m2po", "cispo", "neg_veto", "neg_cap")
HORIZONS = (4, 16, 64, 256, 1024)
DIAGNOSTICS = (("acted_neg", "share of negatives acted on"),
               ("acted_pos", "share of positives acted on"),
               ("logr2", "mean (log r)^2"), ("is_ess", "importance-weight ESS"),
               ("grad_norm", "gradient norm"), ("head_grad_norm", "lm-head gradient norm"))
LATE = 100  # diagnostics are averaged over the updates from here on (the buffer is full)


def load(folder: Path = RESULTS) -> tuple[dict, dict]:
    """({loss: {x: {seed: run}}}, {seed: on-policy run}) of ``horizon_losses``."""
    arms: dict = {}
    on_policy: dict = {}
    for r in load_runs(str(folder / "horizon_losses" / "curves.jsonl.gz")):
        if r.get("schedule.mode") == "on_policy":
            on_policy[r.seed] = r
        else:
            arms.setdefault(r.get("trainer.loss"), {}).setdefault(
                int(r.get("buffer.horizon")), {})[r.seed] = r
    return arms, on_policy


def paired(a: dict, b: dict, rng) -> dict | None:
    """Mean AUC of ``a`` and of ``a`` minus ``b`` over their shared seeds, with intervals."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    draws = rng.integers(0, len(seeds), (DRAWS, len(seeds)))
    x, y = (np.array([auc(arm[s]) for s in seeds]) for arm in (a, b))
    return {"seeds": len(seeds), "auc": mean_interval(x, draws),
            "minus_grpo": mean_interval(x - y, draws)}


def judge(arms: dict, on_policy: dict) -> dict:
    """Rows per (loss, x) and the registered claims P1-P3 (P4-P5 need mu-accounted scores)."""
    rng = np.random.default_rng(0)
    rows = {loss: {x: paired(arms.get(loss, {}).get(x, {}), arms.get("grpo", {}).get(x, {}),
                             rng) for x in HORIZONS} for loss in LOSSES}
    means = {loss: {x: r["auc"][0] for x, r in by_x.items() if r} for loss, by_x in rows.items()}
    best = {loss: max(m, key=m.get) for loss, m in means.items() if m}
    claims = {}
    if all(64 in m and 256 in m for m in means.values()):
        flat = ("m2po", "cispo", "neg_cap")
        claims["P1"] = bool(all(best[k] == 64 for k in ("grpo", "neg_clip", "neg_veto")) and
                            all(best[k] in (64, 256) for k in flat))
        g1 = {k: bool(m[256] >= m[64] - 0.01) for k, m in means.items()}
        claims["P2"] = bool(not g1["grpo"] and all(g1[k] for k in flat) and
                            not g1["neg_clip"] and not g1["neg_veto"])
        diff = {k: {x: rows[k][x]["minus_grpo"] for x in (64, 256)} for k in LOSSES
                if k != "grpo"}
        claims["P3"] = bool(all(diff[k][x][0] >= -0.02 for k in ("neg_clip", "neg_veto")
                                for x in (64, 256)) and
                            all(diff[k][64][0] < -0.03 and diff[k][64][2] < 0
                                for k in ("neg_cap", "cispo", "m2po")))
        claims["G1"] = g1
    onp = np.array([auc(r) for r in on_policy.values()])
    return {"rows": rows, "best": best, "claims": claims,
            "on_policy": float(onp.mean()) if onp.size else None,
            "seeds": sorted({s for by_x in arms.values() for by_s in by_x.values()
                             for s in by_s})}


def _cell(v) -> str:
    return "-" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def table(v: dict) -> str:
    """The verdict as markdown."""
    lines = ["# The horizon under each stale-rollout loss (theory.md section 12)", "",
             f"Seeds so far: {v['seeds']} (registered: 10-19). AUC: mean eval accuracy over "
             "13 evaluations; 95% seed-bootstrap intervals; differences paired by seed. "
             f"On-policy (grpo): {v['on_policy'] if v['on_policy'] is None else round(v['on_policy'], 3)}.",
             "", "| loss | x | seeds | AUC | minus grpo |", "|---|---|---|---|---|"]
    for loss, by_x in v["rows"].items():
        for x, r in by_x.items():
            if r:
                diff = "-" if loss == "grpo" else _cell(r["minus_grpo"])
                lines.append(f"| {loss} | {x} | {r['seeds']} | {_cell(r['auc'])} | {diff} |")
    lines += ["", "Best x per loss (mean AUC): " +
              ", ".join(f"{k} {x}" for k, x in v["best"].items()), "",
              "Registered claims (experiments/horizon_losses.yaml):", ""]
    if not v["claims"]:
        lines.append("* not judged yet: some loss lacks x = 64 or 256")
    for k, ok in v["claims"].items():
        lines.append(f"* {k}: {ok if isinstance(ok, dict) else ('holds' if ok else 'fails')}")
    return "\n".join(lines) + "\n"


def draw(v: dict):
    """Mean AUC against x (log) per loss, with intervals; on-policy as a line."""
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
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
    ax.set(xscale="log", xlabel="buffer x (updates)", ylabel="AUC (mean eval accuracy)")
    ax.legend(fontsize=6, ncol=2)
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
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def main(argv=None) -> list[Path]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS), help="the results folder")
    p.add_argument("--out", help="output folder (default figures/out)")
    a = p.parse_args(argv)
    arms, on_policy = load(Path(a.results))
    v = judge(arms, on_policy)
    record = {"rows": {k: {str(x): r for x, r in by_x.items()} for k, by_x in v["rows"].items()},
              "best": v["best"], "claims": v["claims"], "on_policy": v["on_policy"],
              "seeds": v["seeds"]}
    return [write_text(table(v), "losses.md", a.out),
            write_text(json.dumps(record, indent=1), "losses.json", a.out),
            *save(draw(v), "losses", a.out),
            *save(draw_diagnostics(diagnostics(arms)), "losses_diagnostics", a.out)]


if __name__ == "__main__":
    main()
