"""Every command of the README, given a bad input, answers with one line on stderr that names
the flag (or the file) and exits with status 2, never a traceback: a table of bad inputs per
command, run in-process through each command's ``main`` (a few through a real process).

Each bad input is caught before any training, sweep or calibration starts, so the table runs
in seconds.
"""

import gzip
import json
import os
import subprocess
import sys

import pytest

from llm_experiments import cli as llm_cli
from llm_experiments.study import diagnose, horizon_predict, provenance, results
from replaytheory import cli as theory_cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGISTRATION = os.path.join(REPO, "results", "cpu_sweep_v3", "preregistration.json")
CURVES = os.path.join(REPO, "tests", "fixtures", "tiny_sweep", "curves.jsonl")
THEORY = ["--mu", "5", "--rho", "0.1"]
JUDGE = ["judge", "--registration", REGISTRATION, "--out", "{d}/v.json", "--curves"]
HORIZON = ["--name", "h", "--horizons", "1,2", "--replay-ratios", "1", "--learning-rates", "1e-4"]

# (command, argv with {d} for the folder of bad files, text the error line must hold)
CASES = {
    "judge": [
        (["judge", "--curves", CURVES, "--out", "{d}/v.json", "--registration", "{d}/bad.json"],
         "--registration"),
        (["judge", "--curves", CURVES, "--out", "{d}/v.json", "--registration", "{d}/empty"],
         "--registration"),
        (["judge", "--curves", CURVES, "--out", "{d}/v.json", "--registration", "{d}/list.json"],
         "--registration"),
        (["judge", "--curves", CURVES, "--out", "{d}/v.json", "--registration",
          "{d}/partial.json"], "--registration"),
        (["judge", "--curves", CURVES, "--out", "{d}/v.json", "--registration",
          "{d}/missing.json"], "--registration"),
        (["judge", "--curves", CURVES, "--out", "{d}/v.json", "--registration", "{d}/binary"],
         "--registration"),
        (JUDGE + ["{d}/missing.jsonl"], "--curves"),
        (JUDGE + ["{d}/bad.json"], "bad.json"),
        (JUDGE + ["{d}/list.json"], "list.json"),
        (JUDGE + ["{d}/false.jsonl.gz"], "false.jsonl.gz"),
        (JUDGE + ["{d}/record.jsonl"], "record.jsonl"),
        (JUDGE + ["{d}/empty"], "empty"),
        (["judge", "--registration", REGISTRATION, "--curves", CURVES, "--out", "{d}"], "--out"),
        (["judge", "--registration", REGISTRATION, "--curves", CURVES], "--out"),
    ],
    "predict": [
        (["predict", "--from", "{d}/bad.json"], "--from"),
        (["predict", "--from", "{d}/list.json"], "--from"),
        (["predict", "--from", "{d}/partial.json"], "--from"),
        (["predict", "--from", "{d}/missing.json"], "--from"),
        (["predict", "--out", "{d}/p", "--steps", "0"], "--steps"),
        (["predict", "--out", "{d}/p", "--horizon", "nan"], "--horizon"),
        (["predict", "--out", "{d}/p", "--seeds", "0"], "--seeds"),
        (["predict", "--out", "{d}/p", "--workers", "0"], "--workers"),
        (["predict", "--out", "{d}/p", "--config", "{d}/bad.yaml"], "bad.yaml"),
        (["predict", "--out", "{d}/p", "--set", "nokey"], "--set"),
        (["predict"], "--out"),
    ],
    "verify": [
        (["verify", "--out", "{d}/v", "--prediction", "{d}/bad.json"], "--prediction"),
        (["verify", "--out", "{d}/v", "--prediction", "{d}/list.json"], "--prediction"),
        (["verify", "--out", "{d}/v", "--prediction", "{d}/missing.json"], "--prediction"),
        (["verify", "--out", "{d}/v", "--prediction", REGISTRATION], "--prediction"),  # no config
        (["verify", "--out", "{d}/v", "--prediction", REGISTRATION, "--seeds", "1"], "--seeds"),
        (["verify", "--out", "{d}/v", "--prediction", REGISTRATION, "--workers", "0"],
         "--workers"),
        (["verify", "--out", "{d}/v", "--prediction", REGISTRATION, "--done-in", "{d}/no"],
         "--done-in"),
        (["verify", "--out", "{d}/bad.json", "--prediction", REGISTRATION], "--out"),
    ],
    "sweep": [
        (["sweep", "--out", "{d}/s", "--spec", "{d}/missing.yaml"], "--spec"),
        (["sweep", "--out", "{d}/s", "--spec", "{d}/bad.yaml"], "--spec"),
        (["sweep", "--out", "{d}/s", "--spec", "{d}/list.yaml"], "--spec"),
        (["sweep", "--out", "{d}/s", "--spec", "{d}/typo.yaml"], "trainer.lr"),
        (["sweep", "--out", "{d}/s", "--spec", "{d}/spec.yaml", "--workers", "0"], "--workers"),
        (["sweep", "--out", "{d}/s", "--spec", "{d}/spec.yaml", "--done-in", "{d}/no"],
         "--done-in"),
        (["sweep", "--out", "{d}/s", "--spec", "{d}/spec.yaml", "--done-in", "{d}/bad.json"],
         "--done-in"),
        (["sweep", "--out", "{d}/bad.json", "--spec", "{d}/spec.yaml"], "--out"),
    ],
    "run": [
        (["run", "--out", "{d}/r", "--config", "{d}/bad.yaml"], "bad.yaml"),
        (["run", "--out", "{d}/r", "--config", "{d}/list.yaml"], "list.yaml"),
        (["run", "--out", "{d}/r", "--config", "{d}/binary"], "binary"),
        (["run", "--out", "{d}/r", "--config", "no_such_config"], "no_such_config"),
        (["run", "--out", "{d}/r", "--set", "trainer.lr=abc"], "trainer.lr"),
        (["run", "--out", "{d}/r", "--set", "nokey"], "--set"),
        (["run", "--out", "{d}/r", "--set", "run.steps=-1"], "run.steps"),
        (["run", "--out", "{d}/bad.json"], "--out"),
        (["run", "--out", "{d}/bad.json/r"], "--out"),
        (["run", "--out", "{d}/nothing", "--resume"], "--resume"),
        (["run", "--out", "{d}/torn_run", "--resume"], "config.yaml"),
        (["run"], "--out"),
    ],
    "demo": [
        (["demo", "--out", "{d}/demo", "--mu", "-1"], "--mu"),
        (["demo", "--out", "{d}/demo", "--mu", "x"], "--mu"),
        (["demo", "--out", "{d}/demo", "--steps", "1"], "--steps"),
        (["demo", "--out", "{d}/demo", "--workers", "0"], "--workers"),
        (["demo", "--out", "{d}/bad.json"], "--out"),
    ],
    "trl": [
        (["trl", "--out", "{d}/t", "--config", "{d}/bad.yaml"], "bad.yaml"),
        (["trl", "--out", "{d}/t", "--set", "trainer.lr=abc"], "trainer.lr"),
        (["trl", "--out", "{d}/bad.json"], "--out"),
        (["trl"], "--out"),
    ],
    "diagnose": [
        (["--out", "{d}/d.json", "--probes", "{d}/nothing"], "--probes"),
        (["--out", "{d}/d.json", "--probes", "{d}/empty_dir"], "--probes"),
        (["--out", "{d}/d.json", "--probes", "{d}/false_probes"], "--probes"),
        (["--out", "{d}/d.json", "--probes", "{d}/empty_dir", "--n-boot", "0"], "--n-boot"),
        (["--out", "{d}", "--probes", "{d}/empty_dir"], "--out"),
    ],
    "results": [
        (["--out", "{d}/c.jsonl", "--sweep", "{d}/empty_dir"], "--sweep"),
        (["--out", "{d}/c.jsonl", "--sweep", "{d}/torn_sweep"], "--sweep"),
        (["--out", "{d}/c.jsonl", "--sweep", "{d}/runless_sweep"], "--sweep"),
        (["--out", "{d}/c.jsonl", "--sweep", "{d}/logless_sweep"], "metrics.jsonl"),
        (["--out", "{d}/c.jsonl", "--sweep", "{d}/good_sweep", "--keep", "{d}/no"], "--keep"),
        (["--out", "{d}/c.jsonl", "--sweep", "{d}/good_sweep", "--keep", "{d}/bad.json"],
         "--keep"),
        (["--out", "{d}/", "--sweep", "{d}/good_sweep"], "--out"),
    ],
    "provenance": [
        (["--root", "{d}/repo", "no_such_results"], "no_such_results"),
        (["--root", "{d}/nothing"], "--root"),
        (["--root", "{d}/empty_dir"], "--root"),
        (["--root", "{d}/repo", "torn_results"], "validation.json"),
    ],
    "replaytheory": [
        (["design", *THEORY, "--alpha", "0.1", "--max-horizon", "10"], "--max-horizon"),
        (["design", *THEORY, "--alpha", "0.1", "--extrapolate", "hold_last"], "--extrapolate"),
        (["design", *THEORY, "--noise-table", "{d}/bad.json"], "--noise-table"),
        (["design", "--mu", "0", "--rho", "0.1", "--alpha", "0.1"], "--mu"),
        (["design", "--costs", "-1", "2", "--rho", "0.1", "--alpha", "0.1"], "--costs"),
        (["design", *THEORY, "--alpha", "0.1", "--tau", "0"], "--tau"),
        (["optimal", *THEORY, "--alpha", "0.1", "--gpus", "1"], "--gpus"),
        (["optimal", *THEORY, "--alpha", "0.1", "--batch-size", "0"], "--batch-size"),
        (["optimal", *THEORY, "--alpha", "0.1", "--batch-size", "1", "2", "3"], "--batch-size"),
        (["optimal", *THEORY, "--alpha", "0.1", "--budget", "-5"], "--budget"),
        (["optimal", *THEORY, "--alpha", "0.1", "--max-horizon", "1"], "--max-horizon"),
        (["optimal", *THEORY, "--alpha", "0.1", "--reuse", "2"], "--reuse"),
        (["optimal", *THEORY, "--alpha", "0.1", "--run-updates", "0"], "--run-updates"),
        (["optimal", *THEORY, "--noise-table", "{d}/binary"], "--noise-table"),
        (["gamma", "--mu", "nan"], "--mu"),
        (["gamma", "--mu", "5", "--gpus", "1"], "--gpus"),
        (["validate-sim", "--out", "{d}/bad.json"], "--out"),
        (["validate-sim", "--out", "{d}/vs", "--seed", "-1"], "--seed"),
        (["no_such_command"], "no_such_command"),
    ],
    "horizon_predict": [
        (HORIZON + ["--panels", "{d}/no_runs_*", "--out", "{d}/h"], "--panels"),
        (HORIZON + ["--panels", "{d}", "--out", "{d}/bad.json"], "--out"),
        (["--name", "h", "--horizons", "1,x", "--replay-ratios", "1", "--learning-rates",
          "1e-4", "--panels", "{d}", "--out", "{d}/h"], "--horizons"),
        (["--name", "h", "--horizons", "1,2", "--replay-ratios", "0", "--learning-rates",
          "1e-4", "--panels", "{d}", "--out", "{d}/h"], "--replay-ratios"),
        (HORIZON + ["--panels", "{d}", "--out", "{d}/h", "--standard", "{d}/missing.json"],
         "--standard"),
        (HORIZON + ["--panels", "{d}", "--out", "{d}/h"], "probes.npz"),
    ],
}
MAINS = {"diagnose": diagnose.main, "results": results.main, "provenance": provenance.main,
         "replaytheory": theory_cli.main, "horizon_predict": horizon_predict.main}


def _write_bad_files(d) -> None:
    (d / "bad.json").write_text("not json{")
    (d / "empty").write_text("")
    (d / "list.json").write_text("[1, 2]\n")
    (d / "partial.json").write_text('{"name": "x"}')
    (d / "binary").write_bytes(b"\xff\xfe\x00bad")
    (d / "false.jsonl.gz").write_text('{"run_id": "a"}\n')  # named .gz, not gzip
    (d / "record.jsonl").write_text('{"run_id": "a", "settings": {}}\n')  # fields missing
    (d / "bad.yaml").write_text("a: [1, 2\n")
    (d / "list.yaml").write_text("- a\n- b\n")
    (d / "spec.yaml").write_text("config: cpu_tiny\ngrid: {run.seed: [0]}\n")
    (d / "typo.yaml").write_text("config: cpu_tiny\ngrid: {trainer.lr: [1.0e-4, abc]}\n")
    (d / "empty_dir").mkdir()
    (d / "false_probes").mkdir()
    (d / "false_probes" / "run0.npz").write_text("not a zip")
    (d / "torn_run").mkdir()
    (d / "torn_run" / "config.yaml").write_text("run: {steps: [\n")


def _write_bad_sweeps(d) -> None:
    runs = {"runs": [{"run_id": "a", "overrides": {}}]}
    for name, sweep in [("torn_sweep", "{bad"), ("runless_sweep", '{"other": 1}'),
                        ("logless_sweep", json.dumps(runs)), ("good_sweep", '{"runs": []}')]:
        (d / name).mkdir()
        (d / name / "sweep.json").write_text(sweep)
    (d / "logless_sweep" / "runs" / "a").mkdir(parents=True)
    (d / "logless_sweep" / "runs" / "a" / "summary.json").write_text("{}")


def _write_repo(d) -> None:
    repo = d / "repo"
    (repo / "torn_results").mkdir(parents=True)
    (repo / "torn_results" / "validation.json").write_text('{"not": "a list"')
    subprocess.run(["git", "init", "-q", str(repo)], check=True)


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """A folder of bad inputs: files that are not JSON or YAML, of the wrong shape, not gzip,
    not UTF-8; broken sweep folders, a run with a torn config, a git repository."""
    d = tmp_path_factory.mktemp("bad")
    _write_bad_files(d)
    _write_bad_sweeps(d)
    _write_repo(d)
    return d


def _outcome(main, argv, capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command, argv, names",
                         [(c, a, n) for c, cases in CASES.items() for a, n in cases],
                         ids=[f"{c}-{i}" for c, cases in CASES.items()
                              for i in range(len(cases))])
def test_a_bad_input_is_one_line_naming_it_and_exit_2(command, argv, names, bad, capsys,
                                                      monkeypatch):
    monkeypatch.chdir(bad)
    main = MAINS.get(command, llm_cli.main)
    before = sorted(os.listdir(bad))
    code, err = _outcome(main, [a.format(d=bad) for a in argv], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and names in lines[0] and ": error: " in lines[0], err
    assert sorted(os.listdir(bad)) == before  # nothing made on the way to the error


def test_every_command_of_the_readme_is_in_the_table():
    assert set(CASES) == {"run", *llm_cli.FORWARDED, *MAINS}
    subcommands = {a[0] for a, _ in CASES["replaytheory"]}
    assert {"optimal", "design", "gamma", "validate-sim"} <= subcommands


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit):
        theory_cli.main(argv)
    return capsys.readouterr().out


def test_the_design_help_offers_no_flag_design_rejects(capsys):
    assert "--max-horizon" in _help(["optimal", "--help"], capsys)
    design = " ".join(_help(["design", "--help"], capsys).split())
    assert "--max-horizon" not in design and "horizons unbounded" in design


@pytest.mark.parametrize("argv, names", [
    (["-m", "llm_experiments", "judge", "--curves", CURVES, "--out", "{d}/v.json",
      "--registration", "{d}/bad.json"], "--registration"),
    (["-m", "llm_experiments", "run", "--out", "{d}/r", "--config", "{d}/bad.yaml"],
     "bad.yaml"),
    (["-m", "llm_experiments.study.results", "--sweep", "{d}/torn_sweep", "--out", "{d}/c.jsonl"],
     "--sweep"),
    (["-m", "replaytheory", "design", *THEORY, "--alpha", "0.1", "--max-horizon", "10"],
     "--max-horizon"),
])
def test_a_bad_input_in_a_real_process(argv, names, bad):
    done = subprocess.run([sys.executable, *[a.format(d=bad) for a in argv]],
                          capture_output=True, text=True, cwd=REPO)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and names in lines[0], done.stderr


def test_a_compacted_gz_that_is_not_gzip_names_the_file(bad, tmp_path):
    from replaytheory.cli_input import BadInput, read_jsonl
    good = tmp_path / "good.jsonl.gz"
    good.write_bytes(gzip.compress(b'{"run_id": "a"}\n'))
    assert read_jsonl(str(good)) == [{"run_id": "a"}]
    with pytest.raises(BadInput, match="false.jsonl.gz.*cannot read it"):
        read_jsonl(str(bad / "false.jsonl.gz"), "--curves")


@pytest.mark.parametrize("command", ["sweep", "predict", "verify", "judge", "demo"])
def test_a_commands_help_shows_its_first_paragraph_whole_and_once(command, capsys):
    """Issue 38: demo's and judge's descriptions were their docstrings' first lines, cut
    mid-sentence; predict and verify printed theirs twice (description and epilog)."""
    import importlib
    doc = importlib.import_module(f"llm_experiments.{llm_cli.FORWARDED[command].module[1:]}")
    first = " ".join(doc.__doc__.strip().split("\n\n")[0].split())
    with pytest.raises(SystemExit):
        llm_cli.main([command, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert shown.count(first) == 1, first


BLOCK_LLM_EXTRA = """
import importlib.abc, runpy, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("yaml", "torch", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
sys.argv = ["llm_experiments", *sys.argv[1:]]
runpy.run_module("llm_experiments", run_name="__main__")
"""


@pytest.mark.parametrize("argv, status, said", [
    (["--help"], 0, "train one configuration"),
    (["run", "--out", "{d}/r"], 2, 'yaml is not installed; the llm_experiments commands need '
                                   'the llm extra: pip install -e ".[llm]"'),
    (["demo", "--help"], 2, 'need the llm extra: pip install -e ".[llm]"'),
])
def test_the_calculator_only_install_gets_help_and_a_one_line_error(argv, status, said, tmp_path):
    """Issue 38: ``python -m llm_experiments --help`` without the llm extra (no yaml, torch,
    transformers) ended in a ModuleNotFoundError traceback."""
    done = subprocess.run([sys.executable, "-c", BLOCK_LLM_EXTRA,
                           *[a.format(d=tmp_path) for a in argv]],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == status, done.stderr
    assert said in (done.stdout if status == 0 else done.stderr)
    assert "Traceback" not in done.stderr
    if status:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
