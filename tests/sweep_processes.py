"""Processes of the sweep tests (Linux ``/proc``): which are alive, waiting for a sweep's runs
to get under way, killing the runs a test left behind."""

import os
import signal
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel (a zombie then counts as alive)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def survivors(pid_dir: Path, within: float = 2.0) -> list[int]:
    """The recorded run processes still alive after ``within`` seconds (an orphaned helper is
    reaped by init a moment after its group is killed)."""
    deadline = time.time() + within
    while True:
        left = [int(p.name) for p in pid_dir.iterdir() if alive(int(p.name))]
        if not left or time.time() > deadline:
            return left
        time.sleep(0.05)


def runs_under_way(runs_dir: Path, finished: int, deadline: float) -> None:
    """Wait until ``finished`` runs are done and another has started (its config written,
    after its pids)."""
    while time.time() < deadline:
        done = list(runs_dir.glob("*/summary.json")) if runs_dir.exists() else []
        started = [p for p in runs_dir.glob("*/config.yaml")
                   if not (p.parent / "summary.json").exists()] if runs_dir.exists() else []
        if len(done) >= finished and started:
            return
        time.sleep(0.02)
    raise AssertionError("the sweep's runs did not get under way")


def kill_processes_naming(path: Path) -> None:
    """SIGKILL every process whose command line names ``path`` (the runs of a test's sweep,
    in sessions of their own), until none is left."""
    deadline = time.time() + 5
    while time.time() < deadline:
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(path).encode() in \
                        (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile
                pass
        pids = [pid for pid in pids if pid != os.getpid() and alive(pid)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"processes naming {path} survive SIGKILL")


def kill_recorded(pid_dir: Path) -> None:
    """SIGKILL the processes recorded in ``pid_dir`` (``FAKE_PID_DIR``) that are still alive:
    a failing test leaves none behind."""
    for entry in pid_dir.iterdir():
        if alive(int(entry.name)):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
