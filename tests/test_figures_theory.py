"""The theory figures draw what their captions say, and ``figures.style.save`` writes them."""

from pathlib import Path

import numpy as np
import pytest

from figures import make_all, style, theory
from replaytheory import design_grid, k_function, power_law_optimum


@pytest.fixture
def drawn(drawn_by):
    """The figures the theory module draws, by name, kept open instead of saved."""
    return drawn_by(theory)


def test_optimum_vs_mu_plots_the_closed_form_and_splits_the_on_policy_regime(drawn):
    theory.optimum_vs_mu()
    ax_x, ax_y = drawn["theory_optimum_vs_mu"].axes
    assert len(ax_x.lines) == len(theory.CASES) and len(ax_y.lines) == 2 * len(theory.CASES)
    crossing = 0
    for i, (rho, alpha) in enumerate(theory.CASES):
        line = ax_x.lines[i]
        mus = line.get_xdata()
        x_star, y_star = power_law_optimum(mus, rho, alpha)
        np.testing.assert_allclose(line.get_ydata(), x_star)
        assert line.get_label() == f"rho={rho:g}, alpha={alpha:g}"
        # y*: solid where x* >= 1 step, dotted (on-policy) where x* < 1, never both
        solid, dotted = ax_y.lines[2 * i], ax_y.lines[2 * i + 1]
        assert dotted.get_linestyle() == ":" and solid.get_color() == line.get_color()
        on = x_star < 1
        crossing += 0 < on.sum() < on.size
        np.testing.assert_allclose(np.asarray(solid.get_ydata())[~on], y_star[~on])
        np.testing.assert_allclose(np.asarray(dotted.get_ydata())[on], y_star[on])
        assert np.all(np.isnan(np.asarray(solid.get_ydata())[on]))
        assert np.all(np.isnan(np.asarray(dotted.get_ydata())[~on]))
    assert crossing == 3  # all but (rho, alpha) = (0.1, 0.1) enter the on-policy regime


def test_k_curves_are_normalised_at_one_and_mark_their_minimum(drawn):
    theory.k_curves(mu=6.84, rho=0.1)
    (ax,) = drawn["theory_k_function"].axes
    curves = [ln for ln in ax.lines if ln.get_label().startswith("alpha=")]
    dots = [ln for ln in ax.lines if ln.get_marker() == "o"]
    assert [c.get_label() for c in curves] == [f"alpha={a:g}" for a in (0, 0.1, 0.2, 0.3, 0.5)]
    for c in curves:
        xs, ks = np.asarray(c.get_xdata()), np.asarray(c.get_ydata())
        alpha = float(c.get_label().split("=")[1])
        assert np.interp(0.0, np.log(xs), ks) == pytest.approx(1.0, rel=1e-3)
        np.testing.assert_allclose(ks * float(k_function(1.0, mu=6.84, rho=0.1, alpha=alpha)),
                                   k_function(xs, mu=6.84, rho=0.1, alpha=alpha))
    # 0 < x* < inf for alpha in {0.1, 0.2, 0.3}: a dot at the curve's minimum
    assert len(dots) == 3
    for dot, c in zip(dots, curves[1:4]):
        assert dot.get_color() == c.get_color()
        ks = np.asarray(c.get_ydata())
        (dx,), (dy,) = dot.get_xdata(), dot.get_ydata()
        assert dy <= ks.min() * (1 + 1e-12)
        assert dy == pytest.approx(ks.min(), rel=1e-4)  # the plotted grid is fine enough
        assert np.asarray(c.get_xdata())[ks.argmin()] == pytest.approx(dx, rel=0.05)
    # x* = inf (alpha = 0) and x* = 0 (alpha = 1/2): a label at the right and the left end
    ends = sorted(t.xy[0] for t in ax.texts if t.get_text() == "x*")
    xs = curves[0].get_xdata()
    assert ends == [xs[0], xs[-1]]


def test_saving_heatmap_shows_the_design_grid(drawn):
    theory.saving_heatmap(rhos=(0.1,))  # one panel: a design grid takes seconds
    (ax,) = [ax for ax in drawn["theory_saving_heatmap"].axes if ax.get_title()]
    assert ax.get_title() == "rho = 0.1"
    mesh = ax.collections[0]
    saving = design_grid(np.geomspace(0.25, 100, 60), np.linspace(0.0, 0.6, 61),
                         0.1)["predicted_saving"]
    # rows: alpha (y axis), columns: mu (x axis)
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(61, 60), saving.T)
    assert mesh.get_clim() == (0, 1)


def test_save_writes_png_and_pdf(tmp_path):
    fig, ax = style.plt.subplots()
    ax.plot([0, 1], [0, 1])
    paths = style.save(fig, "line", tmp_path)
    assert paths == [tmp_path / "line.png", tmp_path / "line.pdf"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths[1].read_bytes()[:5] == b"%PDF-"
    assert not style.plt.fignum_exists(fig.number)  # closed once saved


def test_make_all_builds_what_it_can_and_reports_what_it_skips(tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setattr(make_all, "RESULTS", tmp_path / "no_results")
    assert make_all.main(["--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    written = sorted(str(p) for p in (tmp_path / "out").iterdir())
    assert sorted(out.split()) == written
    # the theory figures, the advice's score (its evidence ships with replaytheory) and the
    # time breakdown (from the committed benchmark result, not from results/)
    assert {Path(p).name for p in written} == {
        f"{stem}.{ext}" for stem in ("theory_optimum_vs_mu", "theory_k_function",
                                     "theory_saving_heatmap", "time_breakdown")
        for ext in ("png", "pdf")} | {"advice.md", "advice.json", "time_breakdown.md"}
    assert "simulation: skipped" in err and "paired: skipped" in err
