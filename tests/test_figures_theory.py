from figures import make_all, theory


def test_theory_figures_are_written(tmp_path):
    paths = theory.main(tmp_path)
    names = {p.name for p in paths}
    for stem in ("theory_optimum_vs_mu", "theory_k_function", "theory_saving_heatmap"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names
    assert all(p.stat().st_size > 1000 for p in paths)


def test_make_all_runs(tmp_path, capsys):
    assert make_all.main(["--out", str(tmp_path)]) == 0
    assert "theory_k_function.png" in capsys.readouterr().out
