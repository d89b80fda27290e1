"""A stand-in for ``llm_experiments run`` in sweep tests: logs steps slowly, resumes.

Opt-in (environment): ``FAKE_PID_DIR`` names a folder where the run leaves one empty file per
process it is (its pid, and its helper's); ``FAKE_HELPER=1`` starts a sleeping helper
subprocess (as a run with its own subprocesses would); ``FAKE_IGNORE_TERM=1`` ignores SIGTERM
(the run and its helper); a run with the override ``slow=1`` sleeps ``FAKE_SLOW_SLEEP`` seconds a
step instead of ``FAKE_SLEEP``."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--config")
p.add_argument("--out")
p.add_argument("--set", action="append", default=[])
p.add_argument("--resume", action="store_true")
a = p.parse_args()
overrides = dict(s.split("=", 1) for s in a.set)
if os.path.exists(os.path.join(a.out, "config.yaml")) and not a.resume:
    raise SystemExit("output exists; use --resume")
os.makedirs(a.out, exist_ok=True)
if os.environ.get("FAKE_IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the helper
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) \
    if os.environ.get("FAKE_HELPER") == "1" else None
if os.environ.get("FAKE_PID_DIR"):
    for pid in [os.getpid()] + ([helper.pid] if helper else []):
        open(os.path.join(os.environ["FAKE_PID_DIR"], str(pid)), "w").close()
with open(os.path.join(a.out, "invocations.txt"), "a") as fh:
    fh.write("resume\n" if a.resume else "fresh\n")
with open(os.path.join(a.out, "config.yaml"), "w") as fh:
    fh.write("\n".join(a.set) + "\n")
metrics = os.path.join(a.out, "metrics.jsonl")
done = 0
if a.resume and os.path.exists(metrics):
    with open(metrics) as fh:
        done = sum(1 for _ in fh)
steps = int(os.environ.get("FAKE_STEPS", "4"))
sleep = os.environ.get("FAKE_SLEEP", "0.15")
if overrides.get("slow") == "1":
    sleep = os.environ.get("FAKE_SLOW_SLEEP", sleep)
for step in range(done + 1, steps + 1):
    time.sleep(float(sleep))
    with open(metrics, "a") as fh:
        fh.write(json.dumps({"step": step}) + "\n")
if helper:
    helper.kill()
    helper.wait()
if overrides.get("fail") == "1":
    raise SystemExit(3)
tmp = os.path.join(a.out, ".summary.tmp")
with open(tmp, "w") as fh:
    json.dump({"best_eval_accuracy": float(overrides.get("seed", 0)) / 10, "steps": steps}, fh)
os.replace(tmp, os.path.join(a.out, "summary.json"))
