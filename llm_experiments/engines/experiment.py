"""Start (or resume) one training run with the engine its config names (``schedule.engine``):
``serial.Experiment`` (emulated, the default), ``overlap.OverlapRun`` or
``ray_engine.RayRun`` (imported only when named: it needs the ``ray`` package).

``Experiment`` is also importable from here, where it lived before the overlapped engine.
"""

from __future__ import annotations

import os

from . import checkpoint
from ..config import Config, save_config
from .overlap import OverlapRun
from .serial import Experiment

__all__ = ["Experiment", "OverlapRun", "run_experiment"]


def run_experiment(cfg: Config, out_dir: str, resume: bool = False,
                   address: str | None = None) -> dict:
    """Run (or resume) one experiment into ``out_dir`` with the engine of
    ``schedule.engine``; returns the summary. ``address``: the Ray cluster of the "ray"
    engine (None = ``$RAY_ADDRESS``, else a local one).

    ``out_dir`` must not exist (or be empty) unless ``resume``; with ``resume`` it must hold
    the config.yaml of an earlier run, equal to ``cfg``. A new run that fails with an error
    before its first checkpoint leaves ``out_dir`` as it found it (absent or empty): nothing
    there could be resumed, and a half-made folder would block a plain rerun.
    """
    from ..config import differences, read_config
    cfg_path = os.path.join(out_dir, "config.yaml")
    if resume:
        if not os.path.exists(cfg_path):
            raise ValueError(f"--resume: {out_dir!r} holds no run to resume (no config.yaml); "
                             f"drop --resume to start a new run there")
        diff = differences(read_config(cfg_path), cfg)
        if diff:
            raise ValueError(f"--resume with a config that differs from {cfg_path} in: "
                             f"{', '.join(diff)}")
    elif os.path.exists(out_dir) and os.listdir(out_dir):
        raise ValueError(f"output folder {out_dir!r} exists and is not empty; pass --resume to "
                         f"continue it or choose another --out")
    existed = os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    save_config(cfg, cfg_path)
    try:
        if cfg.schedule.engine == "ray" and cfg.schedule.ray_loop == "actors":
            from .ray_pull import RayPullRun
            return RayPullRun(cfg, out_dir, address).run(resume=resume)
        if cfg.schedule.engine == "ray":
            from .ray_engine import RayRun
            return RayRun(cfg, out_dir, address).run(resume=resume)
        if address is not None:
            raise ValueError("--address needs schedule.engine=ray")
        if cfg.schedule.engine == "overlap":
            return OverlapRun(cfg, out_dir).run(resume=resume)
        return Experiment(cfg, out_dir).run(resume=resume)
    except Exception:
        # Errors only: an interrupted run (KeyboardInterrupt, a sweep's signal) keeps its
        # folder for --resume.
        if not resume and not os.path.exists(os.path.join(out_dir, "checkpoint",
                                                          checkpoint.FILE)):
            _empty(out_dir, remove=not existed)
        raise


def _empty(folder: str, remove: bool) -> None:
    """Delete what ``folder`` holds, and the folder itself when ``remove``."""
    import shutil
    if remove:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) \
            else os.remove(path)
