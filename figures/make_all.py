"""Rebuild every figure from the code and the saved results: ``python -m figures.make_all``.

Theory figures come from ``replaytheory`` directly; the simulation figures from the committed
``results/sim_validation/`` (written by ``replaytheory validate-sim --preset full``); the
paired figures from the committed ``results/cpu_sweep/``; the diagnosis figure from
``results/diagnosis/diagnosis.json``; the verdict figures from every judged
``validation*.json`` under ``results/`` (``judge`` / ``verify``) but the windows', with every setting's
predictions against the held-out goal (theory.md 10.9) in ``verdicts_goal.md``; the windows
(``results/windows``, theory.md 11.12) in ``windows.md``; the growing horizon against fixed
ones (``results/horizon_growth``, theory.md 11.14) in ``growth.md``; align(g) by phase
(``results/horizon_align_large``, theory.md 11.15) in ``align.md``; the same under three
losses (``results/horizon_align_ratio``, theory.md 11.16) in ``align_variants.md``, and with
the stale bias and noise on two more seeds (``results/horizon_align_moments``) in
``align_moments.md``; the same at training buffers of 4 and 64 steps, births 100 and 200
(``results/horizon_align_buffer``, theory.md 11.18) in ``align_buffer_x4.md`` and
``align_buffer_x64.md``; the horizon without the clip against cpu_sweep_v3's clipped cells
(``results/horizon_unclipped``, theory.md 11.19) in ``unclipped.md``; the horizon under each
stale-rollout loss with its staleness diagnostics (``results/horizon_losses``, theory.md
section 12) in ``losses.md`` and ``losses_diagnostics.png``; the calculator's advice scored
on every committed setting and window (theory.md section 13) in ``advice.md``. A family
whose saved results are missing is reported and skipped so the others still build.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _theory(out):
    from figures import theory
    return theory.main(out)


def _sim(out):
    from figures import sim_validation
    return sim_validation.draw_all(str(RESULTS / "sim_validation"), out)  # raises if absent


def _paired(out):
    from figures import paired
    return paired.main(out, RESULTS / "cpu_sweep")


def _diagnosis(out):
    from figures import diagnosis
    return diagnosis.draw(RESULTS / "diagnosis" / "diagnosis.json", out)  # raises if absent


def _verdicts(out):
    from figures import verdicts
    paths, named = [], {}
    for path in sorted(RESULTS.glob("**/validation*.json")):
        if path.parent.parent.name == "windows":  # drawn together by ``_windows``
            continue
        if "devcheck" in path.parts:  # a study's development checks, not a judged setting
            continue
        try:
            records = verdicts.load_records(path)
        except ValueError:  # the paired validation's own format, drawn by ``paired``
            continue
        # results/heldout_digits3/validation.json -> verdicts_heldout_digits3;
        # results/heldout_wide/validation_hold_last.json -> verdicts_heldout_wide_hold_last
        name = "_".join(path.parent.relative_to(RESULTS).parts) + \
            path.stem[len("validation"):]
        named[name] = records
        paths += verdicts.main_one(path, out, name)
    if not paths:
        raise FileNotFoundError(f"no judged validation.json under {RESULTS}")
    # An interim judgement (results/<setting>/interim/) is superseded once the setting's
    # own is committed; the goal table shows the latest of each.
    latest = {k: r for k, r in named.items() if k.replace("_interim", "") == k
              or k.replace("_interim", "") not in named}
    return [*paths, verdicts.main_goal(latest, out)]


def _windows(out):
    from figures import windows
    return windows.main(["--windows", str(RESULTS / "windows")]
                        + ([] if out is None else ["--out", str(out)]))  # raises if absent


def _growth(out):
    from figures import growth
    return growth.main(["--results", str(RESULTS)]
                       + ([] if out is None else ["--out", str(out)]))  # raises if absent


def _align(out):
    from figures import align
    return align.main(["--runs", str(RESULTS / "horizon_align_large" / "runs")]
                      + ([] if out is None else ["--out", str(out)]))  # raises if absent


def _align_variants(out):
    from figures import align_variants
    return align_variants.main(["--runs", str(RESULTS / "horizon_align_ratio" / "runs")]
                               + ([] if out is None else ["--out", str(out)]))


def _align_moments(out):
    from figures import align_variants
    return align_variants.main(["--runs", str(RESULTS / "horizon_align_moments" / "runs"),
                                "--name", "align_moments"]
                               + ([] if out is None else ["--out", str(out)]))


def _align_buffer(out):
    from figures import align_variants
    paths = []
    for x in (4, 64):
        paths += align_variants.main(
            ["--runs", str(RESULTS / "horizon_align_buffer" / "runs"), "--match",
             f"horizon={x}_*", "--births", "100", "200", "--name", f"align_buffer_x{x}"]
            + ([] if out is None else ["--out", str(out)]))
    return paths


def _unclipped(out):
    from figures import unclipped
    return unclipped.main(["--results", str(RESULTS)]
                          + ([] if out is None else ["--out", str(out)]))  # raises if absent


def _advice(out):
    from figures import advice
    return advice.main([] if out is None else ["--out", str(out)])


def _losses(out):
    from figures import losses
    return losses.main(["--results", str(RESULTS)]
                       + ([] if out is None else ["--out", str(out)]))  # raises if absent


def _time_breakdown(out):
    from figures import time_breakdown
    return time_breakdown.main([] if out is None else ["--out", str(out)])  # raises if absent


def _seconds(grid):
    def build(out):
        from figures.cpu_long import seconds
        return seconds.main(["--grid", grid, "--results", str(RESULTS / grid)]
                            + ([] if out is None else ["--out", str(out)]))  # raises if absent
    return build


FAMILIES = {"theory": _theory, "simulation": _sim, "paired": _paired, "diagnosis": _diagnosis,
            "verdicts": _verdicts, "windows": _windows, "growth": _growth, "align": _align,
            "align_variants": _align_variants, "align_moments": _align_moments,
            "align_buffer": _align_buffer, "unclipped": _unclipped, "losses": _losses,
            "advice": _advice, "time_breakdown": _time_breakdown,
            "seconds_long": _seconds("seconds_long"), "seconds_late": _seconds("seconds_late"),
            "seconds_equal": _seconds("seconds_equal")}


def main(argv=None) -> int:
    from figures.style import figure_parser
    p = figure_parser(__doc__)
    p.add_argument("--only", choices=sorted(FAMILIES), action="append",
                   help="build only these families (repeatable)")
    args = p.parse_args(argv)
    for name in args.only or FAMILIES:
        try:
            paths = FAMILIES[name](args.out)
        except FileNotFoundError as exc:
            print(f"{name}: skipped, saved results not found ({exc})", file=sys.stderr)
            continue
        for path in paths:
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
