import json

import numpy as np
import pytest

from llm_experiments.config import load_config
from llm_experiments.tasks.make import make_task
from llm_experiments.tasks.arithmetic import AdditionTask


def test_addition_lsd_first_and_disjoint_splits():
    task = AdditionTask(digits=2, eval_size=300, eval_seed=1)
    p = task.problem(17 * 100 + 25)
    assert (p.prompt, p.answer) == ("17+25=", "24")
    assert task.reward(p, "24") == 1.0 and task.reward(p, "42") == 0.0
    held = {q.prompt for q in task.eval_problems}
    train = task.sample_train(5000, np.random.default_rng(0))
    assert len(held) == 300 and not held & {q.prompt for q in train}
    assert AdditionTask(3).problem(999_999).answer == "8991"
    with pytest.raises(ValueError, match="task.digits"):
        AdditionTask(digits=0)


def test_reasoning_gym_adapter():
    pytest.importorskip("reasoning_gym")
    cfg = load_config("cpu_tiny", ["task.name=reasoning_gym", "task.rg_name=chain_sum",
                                   "task.rg_size=200", "task.eval_size=20",
                                   "task.prompt_field=metadata.expression",
                                   "task.prompt_template={problem}="])
    task = make_task(cfg.task)
    p = task.eval_problems[0]
    assert p.prompt.endswith("=") and task.reward(p, p.answer) == 1.0
    assert task.reward(p, "nonsense") < 1.0
    assert not {q.prompt for q in task.eval_problems} & {q.prompt for q in task.train}
    with pytest.raises(ValueError, match="task.rg_name"):
        make_task(load_config("cpu_tiny", ["task.name=reasoning_gym",
                                           "task.rg_name=no_such_task"]).task)


def test_math_task_from_local_jsonl(tmp_path):
    pytest.importorskip("math_verify")
    path = tmp_path / "math.jsonl"
    rows = [{"problem": f"What is {i}/4?", "answer": f"\\frac{{{i}}}{{4}}"} for i in range(1, 13)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = load_config("cpu_tiny", ["task.name=math", f"task.dataset={path}",
                                   "task.eval_size=4",
                                   "task.prompt_template={problem} Answer in \\boxed{}."])
    task = make_task(cfg.task)
    assert len(task.eval_problems) == 4 and len(task.train) == 8
    one = next(p for p in task.train + task.eval_problems
               if p.prompt == "What is 3/4? Answer in \\boxed{}.")
    assert task.reward(one, "so the answer is \\boxed{0.75}") == 1.0
    assert task.reward(one, "\\boxed{0.7}") == 0.0
    with pytest.raises(ValueError, match="does not exist"):
        make_task(load_config("cpu_tiny", ["task.name=math",
                                           f"task.dataset={tmp_path}/none.jsonl"]).task)
