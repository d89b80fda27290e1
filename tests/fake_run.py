"""A stand-in for ``llm_experiments run`` in sweep tests: logs steps slowly, resumes."""

import argparse
import json
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--config")
p.add_argument("--out")
p.add_argument("--set", action="append", default=[])
p.add_argument("--resume", action="store_true")
a = p.parse_args()
if os.path.exists(os.path.join(a.out, "config.yaml")) and not a.resume:
    raise SystemExit("output exists; use --resume")
os.makedirs(a.out, exist_ok=True)
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
for step in range(done + 1, steps + 1):
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0.15")))
    with open(metrics, "a") as fh:
        fh.write(json.dumps({"step": step}) + "\n")
overrides = dict(s.split("=", 1) for s in a.set)
if overrides.get("fail") == "1":
    raise SystemExit(3)
tmp = os.path.join(a.out, ".summary.tmp")
with open(tmp, "w") as fh:
    json.dump({"best_eval_accuracy": float(overrides.get("seed", 0)) / 10, "steps": steps}, fh)
os.replace(tmp, os.path.join(a.out, "summary.json"))
