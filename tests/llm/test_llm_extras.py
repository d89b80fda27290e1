"""Tests that need an optional extra (Ray, TRL, vLLM) say which one when it is missing
(issue 38: ``pip install -e ".[test]"`` alone skipped them with only a module name)."""

import os
import re
import sys

import pytest

from llm_helpers import REPO, import_extra


def test_a_missing_extra_skips_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl now raises ImportError
    with pytest.raises(pytest.skip.Exception, match=r'pip install -e "\.\[trl\]"') as skipped:
        import_extra("trl", "trl")
    assert "\n" not in str(skipped.value)


def test_no_test_skips_an_extra_without_naming_it():
    bare = re.compile(r"importorskip\(\s*['\"](ray|trl|vllm)['\"]\s*\)")
    tests = os.path.join(REPO, "tests")
    found = [os.path.join(d, f) for d, _, files in os.walk(tests) for f in files
             if f.endswith(".py") and bare.search(open(os.path.join(d, f)).read())]
    assert not found, f"use llm_helpers.import_extra in {found}"
