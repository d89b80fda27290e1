"""What makes a stale rollout worth more than a fresh one (theory.md 11.16): align(g) of the
same panel chunks under the training loss, without its clip and with the importance ratio held
at 1 (``probe.align_variants``), the paired changes, the chunks' clip fraction and importance
ratios, and, where the runs kept ``align_pairs`` (``probe.align_moments``), the stale bias and
noise by gap under each loss; from ``results/horizon_align_ratio/runs`` by default.

``python -m figures.align_variants [--runs DIR] [--match GLOB] [--births B ...] [--name NAME]
[--out DIR]`` writes
``NAME.md`` (tables with 95% bootstrap intervals), ``NAME.json`` and ``NAME.png`` / ``.pdf``
(align against the gap per loss, one panel per birth step); NAME is ``align_variants`` unless
given.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from figures import align
from figures.style import PALETTE, figure_parser, plt, save, write_text
from replaytheory.fit.align_fit import align_change, fit_align, fit_align_moments
from replaytheory.fit.probes import ALIGN_PANEL, ALIGN_VARIANTS, ProbeSet

RUNS = Path(__file__).resolve().parents[1] / "results" / "horizon_align_ratio" / "runs"
LOSSES = (None, *ALIGN_VARIANTS)
LABELS = {None: "training loss (clipped)", "unclipped": "unclipped", "ratio_one": "ratio = 1"}
STATS = ("clip_fraction", "mean_ratio", "approx_kl")
MOMENTS = {"bias": "Stale bias ||E m - grad F||^2 / ||grad F||^2 (0 for fresh rollouts)",
           "orthogonal": "Its part off grad F: bias - (1 - align)^2",
           "noise": "Per-sequence noise over a fresh rollout's (1 for fresh rollouts)"}
N_BOOT = 1000


def fits(probes: ProbeSet, births=None) -> dict:
    """``fit_align`` under each loss and ``align_change`` of each variant, pooled over the
    panels born at ``births`` (None = all) and per birth, and the moments where measured (the
    same bootstrap seed throughout, so the draws are shared)."""
    if births is None:
        births = sorted(int(b) for b in set(probes.tables["align"]["birth_step"].tolist()))
    kw = {"births": births, "n_boot": N_BOOT}
    out = {"align": {LABELS[v]: fit_align(probes, variant=v, **kw) for v in LOSSES},
           "change": {v: {"pooled": align_change(probes, v, **kw),
                          **{b: align_change(probes, v, births=[b], n_boot=N_BOOT)
                             for b in births}} for v in ALIGN_VARIANTS}}
    if probes.n_rows("align_pairs"):
        out["moments"] = {LABELS[v]: fit_align_moments(probes, variant=v, **kw)
                          for v in LOSSES}
    return out


def chunk_stats(probes: ProbeSet, births=None) -> dict:
    """Mean over chunks and runs of each of ``STATS`` per (birth, gap), and pooled per gap,
    over the panels born at ``births`` (None = all)."""
    t = probes.tables["align_stats"]
    if births is None:
        births = sorted(set(t["birth_step"].astype(int).tolist()))
    out = {}
    for key in ("pooled", *births):
        rows = np.isin(t["birth_step"], births) if key == "pooled" else t["birth_step"] == key
        gaps = sorted(set(t["gap"][rows].astype(int).tolist()))
        out[key] = {g: {s: float(t[s][rows & (t["gap"] == g)].mean()) for s in STATS}
                    for g in gaps}
    return out


def _row(name: str, curve) -> str:
    return f"| {name} | " + " | ".join(align._cell(curve, i) for i in range(len(curve.gaps))) \
        + " |"


def _head(first: str, gaps: list) -> list[str]:
    cols = first.count("|") + 1
    return [f"| {first} | " + " | ".join(f"g = {int(g)}" for g in gaps) + " |",
            "|" + "---|" * (cols + len(gaps))]


def _align_lines(f: dict, gaps: list) -> list[str]:
    lines = ["## align(g), pooled over births", "", *_head("loss", gaps)]
    lines += [_row(name, fit.pooled) for name, fit in f["align"].items()]
    for v, changes in f["change"].items():
        lines += ["", f"## Paired change: {LABELS[v]} minus the training loss", "",
                  *_head("born at step", gaps)]
        lines += [_row(str(k), c) for k, c in changes.items() if k != "pooled"]
        lines.append(_row("pooled", changes["pooled"]))
    for name, fit in f["align"].items():
        lines += ["", f"## align(g) by birth: {name}", "", *_head("born at step", gaps)]
        lines += [_row(str(b), c) for b, c in sorted(fit.by_birth.items())]
    return lines


def _moment_lines(moments: dict, gaps: list) -> list[str]:
    lines = []
    for quantity, title in MOMENTS.items():
        lines += ["", f"## {title}", "", *_head("loss | born at step", gaps)]
        for name, m in moments.items():
            lines.append(_row(f"{name} | pooled", getattr(m, quantity)))
            lines += [_row(f"{name} | {b}", c[quantity]) for b, c in sorted(m.by_birth.items())]
    return lines


def _stats_lines(stats: dict) -> list[str]:
    lines = ["", "## The panel chunks' importance ratios (mean over chunks and runs)", "",
             "| born at step | gap | clip fraction | mean ratio | approx KL (nats/token) |",
             "|---|---|---|---|---|"]
    for key, by_gap in stats.items():
        lines += [f"| {key} | {g} | {s['clip_fraction']:.3f} | {s['mean_ratio']:.4f} | "
                  f"{s['approx_kl']:.2e} |" for g, s in by_gap.items()]
    return lines


def table(f: dict, stats: dict, n_runs: int, n_chunks: int) -> str:
    """The three losses' align, the paired changes, the moments (where measured) and the
    chunk statistics, as markdown."""
    first = next(iter(f["align"].values()))
    gaps = list(first.pooled.gaps)
    lines = ["# align(g) under three losses (theory.md 11.16-11.18)", "",
             f"{n_runs} runs, panels of {first.n_seq} sequences in {n_chunks} chunks, the same "
             f"chunks "
             f"at the same weights under each loss; 95% bootstrap intervals over panel and "
             f"reference chunks (paired for the changes).", "", *_align_lines(f, gaps)]
    if "moments" in f:
        lines += _moment_lines(f["moments"], gaps)
    return "\n".join(lines + _stats_lines(stats)) + "\n"


def draw(f: dict):
    """align against the gap (symlog) under each loss, one panel per birth step."""
    births = sorted(next(iter(f["align"].values())).by_birth)
    fig, axes = plt.subplots(1, len(births), figsize=(3.0 * len(births), 2.8), sharey=True)
    for ax, birth in zip(np.atleast_1d(axes), births):
        for (name, fit), colour, shift in zip(f["align"].items(), PALETTE, (-0.04, 0, 0.04)):
            c = fit.by_birth[birth]
            ax.errorbar(np.array(c.gaps) * (1 + shift), c.value,
                        yerr=[np.subtract(c.value, c.low), np.subtract(c.high, c.value)],
                        fmt="o-", color=colour, capsize=2, ms=3, label=name)
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set(title=f"born at {birth}", xlabel="gap g (updates)", xscale="symlog",
               xlim=(-0.3, 1.3 * max(fit.by_birth[birth].gaps)))
    np.atleast_1d(axes)[0].set_ylabel("align(g)")
    np.atleast_1d(axes)[0].legend(fontsize=6)
    return fig


def main(argv=None) -> list[Path]:
    p = figure_parser(__doc__)
    p.add_argument("--runs", default=str(RUNS), help="folder of the align-variant runs")
    p.add_argument("--match", default="*", help="glob of the run folders to read")
    p.add_argument("--births", type=int, nargs="+",
                   help="pool only the panels born at these steps (default: all)")
    p.add_argument("--name", default="align_variants", help="stem of the output files")
    a = p.parse_args(argv)
    probes = align.load(Path(a.runs), a.match)
    f, stats = fits(probes, a.births), chunk_stats(probes, a.births)
    t = probes.tables["align"]
    n_runs = len(set(t["run"].tolist()))
    n_chunks = int(t["chunk"][t["part"] == ALIGN_PANEL].max()) + 1
    record = {"align": {k: v.to_dict() for k, v in f["align"].items()},
              "change": {v: {str(k): c.to_dict() for k, c in ch.items()}
                         for v, ch in f["change"].items()},
              "chunk_stats": {str(k): {str(g): s for g, s in v.items()}
                              for k, v in stats.items()},
              **({"moments": {k: m.to_dict() for k, m in f["moments"].items()}}
                 if "moments" in f else {})}
    return [write_text(table(f, stats, n_runs, n_chunks), f"{a.name}.md", a.out),
            write_text(json.dumps(record, indent=1), f"{a.name}.json", a.out),
            *save(draw(f), a.name, a.out)]


if __name__ == "__main__":
    main()
