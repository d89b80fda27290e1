"""``python -m benchmarks.gpu --dry-run`` (issue 28, item 6): the GPU benchmark's code paths
at tiny shapes on CPU."""

import json

import pytest
import torch


def test_gpu_benchmark_dry_run(tmp_path):
    from benchmarks.gpu import main
    out = tmp_path / "gpu.json"
    out.write_text("an earlier result")
    main(["--dry-run", "--out", str(out), "--force"])
    r = json.loads(out.read_text())
    assert r["dry_run"] and r["device"] == "cpu"
    assert {(s["contender"], s["new_tokens"]) for s in r["samplers"]} == {
        (who, new) for who in ("ours", "ours_eager", "hf_generate") for new in (4, 16)}
    assert all(s["tokens_per_s"] > 0 for s in r["samplers"])
    # The static-shape step samples the eager step's tokens (bfloat16, tiny shapes).
    assert [s["tokens_equal_to_eager"] for s in r["samplers"]
            if s["contender"].startswith("ours")] == [1.0] * 4
    (u,) = r["updates"]
    assert u["update_seconds"] > 0 and 0 < u["bf16_peak_share"] < 1
    assert 0 < u["fresh_log_ratio_abs_mean"] <= u["fresh_log_ratio_abs_max"] < 0.1
    assert u["peak_gb_measured"] is None and u["peak_gb_predicted"] > 0
    assert r["cpu_tiny"]["steps"] == 3 and 0 <= r["cpu_tiny"]["best_eval_accuracy"] <= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_update_peak_matches_prediction_on_cuda():
    """On a GPU the measured peak of a bf16 update is within 25% of the prediction."""
    from benchmarks.gpu import DRY, build, update_row
    device = torch.device("cuda")
    model, tok, cfg = build({**DRY["tiny"], "hidden_size": 256, "intermediate_size": 1024},
                            device, "bfloat16", 160)
    row = update_row("small", model, tok, cfg, 64, 128, device)
    assert row["peak_gb_measured"] == pytest.approx(row["peak_gb_predicted"], rel=0.25)


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_an_existing_out_is_refused_in_one_line_before_any_work(kind, tmp_path, monkeypatch,
                                                                capsys):
    """Issue 38: ``--out DIR`` did all the work, then ended in an IsADirectoryError
    traceback; ``--out FILE`` replaced the file without a word. Both are refused at once
    (``--force`` replaces a file: the dry run's test)."""
    import benchmarks.gpu as gpu
    monkeypatch.setattr(gpu, "build", lambda *a, **k: pytest.fail("measured before refusing"))
    out = tmp_path / "gpu.json"
    out.mkdir() if kind == "folder" else out.write_text("kept")
    with pytest.raises(SystemExit) as stopped:
        gpu.main(["--dry-run", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and len(err.splitlines()) == 1
    assert ("is a folder" if kind == "folder" else "exists; give a new file, or --force") in err
    assert out.is_dir() if kind == "folder" else out.read_text() == "kept"
