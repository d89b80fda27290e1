import json
import subprocess
import sys

import pytest

from replaytheory.cli import build_parser, main


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


def test_optimal_defaults_rho_as_optimal_config_does(capsys):
    """Issue 38: ``optimal`` required --rho while ``optimal_config`` defaults it (0.1)."""
    from replaytheory.calculator import PowerLawNoise, optimal_config
    assert main(["optimal", "--mu", "6.84", "--alpha", "0.1", "--json"]) == 0
    want = optimal_config(mu=6.84, noise=PowerLawNoise(alpha=0.1)).to_dict()
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(want, default=str))


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


@pytest.mark.parametrize("name, content", [
    ("nosigma.json", '{"staleness": [1, 2]}'),
    ("list.json", "[1, 2, 3]"),
    ("broken.json", '{"staleness": [1, 2], '),
    ("deep.json", "[" * 100000),
    ("text.json", '{"staleness": "abc", "sigma2": [1]}'),
    ("unsorted.json", '{"staleness": [2, 1], "sigma2": [1, 1]}'),
    ("words.csv", "staleness,sigma2\nx,y\n"),
    ("onecolumn.csv", "1\n2\n"),
    ("empty.csv", ""),
    ("binary.csv", b"\xff\xfe\x00"),
    ("missing.csv", None),
])
def test_every_bad_noise_table_is_one_line_exit_2(tmp_path, capsys, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert main(["optimal", "--mu", "6.84", "--rho", "0.1", "--noise-table", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--noise-table" in err and name in err and "staleness,sigma2" in err


def test_noise_table_stays_in_range_unless_extrapolated(tmp_path, capsys):
    table = tmp_path / "t.csv"
    table.write_text("staleness,sigma2\n" + "".join(
        f"{s},{v}\n" for s, v in zip(range(1, 9), [1.0, 1.1, 1.2, 1.25, 1.3, 1.35, 1.4, 1.42])))
    base = ["optimal", "--mu", "6.84", "--rho", "0.1", "--noise-table", str(table), "--json",
            "--reuse", "0"]
    assert main(base) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["horizon"] <= 9.0 and d["horizon_limit"] == d["measured_horizon"] == 9.0
    assert main(base + ["--extrapolate", "hold_last"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["horizon"] > 9.0 and d["horizon_limit"] == 1000.0
    assert "holding sigma^2 at its last measured value" in d["explanation"]
    assert main(["design", "--mu", "6.84", "--rho", "0.1", "--noise-table", str(table),
                 "--extrapolate", "hold_last"]) == 0
    assert "note: extrapolated" in capsys.readouterr().out
    assert main(["design", "--mu", "6.84", "--rho", "0.1", "--alpha", "0.1",
                 "--extrapolate", "hold_last"]) == 2
    assert "--extrapolate applies to a --noise-table" in capsys.readouterr().err


def test_help_texts_cite_no_tracker_issues():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "optimal" in a.choices)
    texts = [a.help or "" for a in subparsers._choices_actions]
    texts += [a.help or "" for sub in subparsers.choices.values() for a in sub._actions]
    assert texts and not [t for t in texts if "issue" in t.lower()]
