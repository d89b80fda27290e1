"""The README's TRL snippet (section "Use with TRL"), run as written on this CPU machine:
the calculator's design mapped to GRPOConfig, a tiny locally built policy, two steps."""

import os
import re

from llm_helpers import REPO, import_extra

import_extra("trl", "trl")

import torch  # noqa: E402


def readme_trl_snippet() -> str:
    """The first ```python block under the README's "## Use with TRL" heading."""
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text[text.index("\n## Use with TRL\n"):]
    section = section[:section.find("\n## ", 1)]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README.md: no python block under '## Use with TRL'"
    return match.group(1)


def test_readme_trl_snippet_runs_on_cpu_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the snippet writes to ./out
    torch.set_num_threads(1)
    scope: dict = {}
    exec(compile(readme_trl_snippet(), "README.md (Use with TRL)", "exec"), scope)
    trainer, mapped = scope["trainer"], scope["mapped"]
    assert trainer.state.global_step == 2
    assert mapped.per_device_train_batch_size == 24 and mapped.replay.buffer_size == 1536
    assert trainer.consumed == 2 * 64 and trainer.clock.generated >= 2 * 24
    assert trainer.calibration.mu() > 0
