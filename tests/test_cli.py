import json
import subprocess
import sys

import pytest

from replaytheory.cli import main


def run(args):
    return subprocess.run([sys.executable, "-m", "replaytheory", *args], capture_output=True,
                          text=True)


def test_optimal_json_end_to_end():
    p = run(["optimal", "--mu", "6.84", "--rho", "0.1", "--alpha", "0.1", "--gpus", "8",
             "--batch-size", "60", "--json"])
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    for key in ("buffer_size", "batch_size", "rollouts_per_step", "workers", "trainers",
                "compute_ratio", "predicted_saving"):
        assert key in d
    assert d["workers"] + d["trainers"] == 8 and d["batch_size"] == 60


def test_optimal_table(capsys):
    assert main(["optimal", "--mu", "6.84", "--rho", "0.1", "--alpha", "0.1", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "buffer_size N" in out and "predicted_saving" in out and "Keep a FIFO" in out


def test_gamma_table_flags_typo(capsys):
    assert main(["gamma"]) == 0
    out = capsys.readouterr().out
    assert "0.510" in out and "0.41" in out and "differs from formula" in out
    assert main(["gamma", "--mu", "5.28", "--gpus", "4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["mu = 5.28"]
    assert [(r["workers"], r["trainers"]) for r in rows] == [(3, 1), (2, 2), (1, 3)]


def test_design_and_noise_table(tmp_path, capsys):
    table = tmp_path / "noise.csv"
    table.write_text("staleness,sigma2\n0,1.0\n1,1.2\n2,1.3\n4,1.5\n8,1.7\n16,2.5\n")
    assert main(["design", "--mu", "6.84", "--rho", "0.1", "--noise-table", str(table),
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["method"] == "numeric" and d["noise"]["model"] == "tabulated"
    assert main(["optimal", "--costs", "13.68", "2", "--rho", "0.1", "--alpha", "0.2"]) == 0


@pytest.mark.parametrize("args, needle", [
    (["optimal", "--mu", "-1", "--rho", "0.1", "--alpha", "0.1"], "mu"),
    (["optimal", "--mu", "5", "--rho", "2", "--alpha", "0.1"], "rho"),
    (["optimal", "--mu", "5", "--rho", "0.1", "--alpha", "-1"], "alpha"),
    (["optimal", "--mu", "5", "--rho", "0.1", "--alpha", "nan"], "alpha"),
    (["optimal", "--mu", "5", "--rho", "0.1", "--alpha", "0.1", "--gpus", "4", "--trainers",
      "5"], "trainers"),
    (["optimal", "--mu", "5", "--rho", "0.1", "--alpha", "0.1", "--max-buffer-size", "10"],
     "max_buffer_size"),
    (["optimal", "--mu", "5", "--rho", "0.1", "--alpha", "0.1", "--batch-size", "1", "2", "3"],
     "batch-size"),
    (["optimal", "--mu", "5", "--rho", "0.1", "--noise-table", "/nonexistent.csv"],
     "noise-table"),
    (["optimal", "--mu", "abc", "--rho", "0.1", "--alpha", "0.1"], "mu"),
    (["optimal", "--rho", "0.1", "--alpha", "0.1"], "mu"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    p = run(args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) <= 2 and "Traceback" not in p.stderr  # argparse adds a usage line
    assert needle in lines[-1]
