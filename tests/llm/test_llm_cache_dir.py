"""Where warm starts are cached: run.cache_dir, else $LLM_EXPERIMENTS_CACHE, else the per-user
cache ($XDG_CACHE_HOME or ~/.cache), never the working folder."""

import os

from llm_experiments.config import load_config
from llm_experiments.policy.models import cache_dir


def test_cache_dir_resolution_order(tmp_path, monkeypatch):
    home, xdg, env = tmp_path / "home", tmp_path / "xdg", tmp_path / "env"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("LLM_EXPERIMENTS_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = load_config("cpu_tiny")
    assert cache_dir(cfg) == os.path.join(str(home), ".cache", "llm_experiments")
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    assert cache_dir(cfg) == os.path.join(str(xdg), "llm_experiments")
    monkeypatch.setenv("LLM_EXPERIMENTS_CACHE", str(env))
    assert cache_dir(cfg) == str(env)
    explicit = load_config("cpu_tiny", [f"run.cache_dir={tmp_path / 'mine'}"])
    assert cache_dir(explicit) == str(tmp_path / "mine")
