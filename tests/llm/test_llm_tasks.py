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


def test_long_addition_worked_solution_by_hand():
    from llm_experiments.tasks.long_addition import LongAdditionTask, parse_answer
    from llm_experiments.tasks.long_shape import prompt_chars, solution_chars
    task = LongAdditionTask(digits=3, eval_size=50, eval_seed=2)
    p = task.problem(458 * 1000 + 67)  # 458 + 67 = 525, carries out of columns 1 and 2
    assert p.prompt == "458+067="
    assert p.answer == (".45+.06|8+7+0=15|5..;"
                        "..4+..0|5+6+1=12|25.;"
                        "...+...|4+0+1=05|525;"
                        "=0525")
    assert len(p.prompt) == prompt_chars(3) and len(p.answer) == solution_chars(3)
    assert task.reward(p, p.answer) == 1.0
    assert task.reward(p, "junk=525") == 1.0  # only the final answer is graded
    assert task.reward(p, p.answer[:-1] + "6") == 0.0
    # unparseable: no "=", nothing after it, or a non-digit in the answer
    for bad in ("", "525", p.answer[:20], "=", "=52a", "=5 2", "=-525"):
        assert parse_answer(bad) is None and task.reward(p, bad) == 0.0, bad
    assert parse_answer("x=1=0525") == 525


def test_long_addition_sizes_splits_and_errors():
    from llm_experiments.tasks.long_addition import LongAdditionTask
    from llm_experiments.tasks.long_shape import solution_chars
    cfg = load_config("cpu_long", ["task.eval_size=40"])
    task = make_task(cfg.task)
    assert isinstance(task, LongAdditionTask) and len(task.eval_problems) == 40
    # the shipped setting: a worked solution of >= 128 tokens, the prompt at most a quarter
    # of the sequence, and the whole solution within the sampler's completion length
    prompt, solution = len(task.eval_problems[0].prompt), solution_chars(task.digits)
    assert solution >= 128 and prompt * 4 <= prompt + solution + 1
    assert cfg.sampler.max_new_tokens >= solution + 1 and cfg.model.max_len >= prompt + solution + 1
    held = {q.pid for q in task.eval_problems}
    train = task.sample_train(3000, np.random.default_rng(0))
    assert not held & {q.pid for q in train}
    assert set("".join(q.prompt + q.answer for q in train)) <= set(task.alphabet())
    for q in train[:200]:
        a, b = divmod(q.pid, 10 ** 5)
        assert task.reward(q, q.answer) == 1.0 and int(q.answer.rsplit("=", 1)[1]) == a + b
    with pytest.raises(ValueError, match=r"task.digits must be an integer in \[1, 9\]"):
        LongAdditionTask(digits=10)
    from llm_experiments.tasks.long_addition import worked_solution
    with pytest.raises(ValueError, match=r"a must be an integer in \[0, 99\]"):
        worked_solution(100, 1, 2)
    with pytest.raises(ValueError, match="task.eval_size"):
        LongAdditionTask(digits=1, eval_size=51)
    with pytest.raises(ValueError, match="sampler.max_new_tokens must be an integer >= 143"):
        load_config("cpu_tiny", ["task.name=long_addition", "task.digits=5",
                                 "model.max_len=160"])
    with pytest.raises(ValueError, match="model.max_len must be an integer >= 155"):
        load_config("cpu_tiny", ["task.name=long_addition", "task.digits=5",
                                 "sampler.max_new_tokens=143"])


def test_evaluation_counts_unparseable_completions():
    """eval_unparseable is the share of held-out completions without a final answer; they
    score 0 like wrong ones."""
    from llm_experiments.engines.metrics import evaluate
    from llm_experiments.policy.models import char_tokenizer
    from llm_experiments.samplers import Generation
    cfg = load_config("cpu_tiny", ["task.name=long_addition", "task.digits=2",
                                   "task.eval_size=4", "model.max_len=64",
                                   "sampler.max_new_tokens=60", "eval.pass_k=[]"])
    task = make_task(cfg.task)
    tok = char_tokenizer(task.alphabet())
    probs = task.eval_problems
    # right, wrong but parseable, cut before its answer, garbage
    texts = [probs[0].answer, "=0", probs[2].answer[:30], "|;."]

    class Canned:
        def generate(self, prompts, *, max_new_tokens, **kw):
            ids = [tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in texts]
            out = np.zeros((len(ids), max_new_tokens), np.int32)
            for i, r in enumerate(ids):
                out[i, :len(r)] = r
            n = len(ids)
            return Generation(out, np.zeros(out.shape, np.float32),
                              np.array([len(r) for r in ids], np.int32), np.ones(n, bool))

    result = evaluate(Canned(), tok, task, [[0]] * 4, cfg, seed=0)
    assert result["eval_accuracy"] == 0.25 and result["eval_unparseable"] == 0.5


@pytest.mark.parametrize("every, checks", [(None, [0, 2, 4, 6]), (3, [0, 3, 6])])
def test_warm_start_checks_as_often_as_the_task_asks(monkeypatch, every, checks):
    """A task with long solutions sets warm_start_check_every (a check is a forward pass over
    512 problems); others are checked every 2 steps."""
    from llm_experiments.policy import warm_start as ws
    from llm_experiments.policy.models import char_tokenizer, tiny_model
    from llm_experiments.tasks.arithmetic import AdditionTask
    cfg = load_config("cpu_tiny", ["model.hidden_size=16", "model.layers=1", "model.heads=2",
                                   "model.kv_heads=1", "model.intermediate_size=16",
                                   "model.warm_start_steps=7", "model.warm_start_batch=4",
                                   "model.warm_start_target=0.99"])
    task = AdditionTask(1, 10)
    if every is not None:
        task.warm_start_check_every = every
    tok = char_tokenizer(task.alphabet())
    calls = []
    monkeypatch.setattr(ws, "_exact_match", lambda *a: calls.append(1) or 0.0)
    assert ws.warm_start(tiny_model(cfg, len(tok)), tok, task, cfg) == 7
    assert len(calls) == len(checks)  # at these steps of 0..6
