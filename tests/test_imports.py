"""Which module may import which, read from the source (ast; nothing is imported).

``figures/`` only reads saved results, so nothing depends on it; ``replaytheory/`` is numpy and
scipy only; the probes see a run through ``probes.RunView``, never the ``Experiment``.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIBRARY = sorted(p for pkg in ("replaytheory", "llm_experiments")
                 for p in (REPO / pkg).rglob("*.py"))


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of every module that ``source`` (a module of ``package``) imports,
    anywhere in the file, relative imports resolved; ``from m import x`` counts m and m.x."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def file_imports(path: Path) -> set[str]:
    """``imported_modules`` of a file of this repository."""
    package = ".".join(path.relative_to(REPO).parts[:-1])
    return imported_modules(path.read_text(), package)


def imports_any(names: set[str], module: str) -> bool:
    """Whether ``module`` or one of its submodules is among ``names``."""
    return any(n == module or n.startswith(module + ".") for n in names)


def test_imported_modules_resolves_relative_imports():
    src = ("import figures.style\nfrom .experiment import x\nfrom . import experiment\n"
           "def f():\n    from ..buffer import Rollout\n")
    names = imported_modules(src, "llm_experiments.samplers")
    assert {"figures.style", "llm_experiments.samplers.experiment",
            "llm_experiments.samplers", "llm_experiments.buffer"} <= names
    assert imports_any(imported_modules("from .experiment import x", "llm_experiments"),
                       "llm_experiments.experiment")
    assert imports_any(imported_modules("from . import experiment", "llm_experiments"),
                       "llm_experiments.experiment")
    assert not imports_any({"figuresque"}, "figures")


def test_nothing_imports_figures():
    offenders = [str(p.relative_to(REPO)) for p in LIBRARY if imports_any(file_imports(p),
                                                                           "figures")]
    assert offenders == []


@pytest.mark.parametrize("forbidden", ["torch", "transformers", "llm_experiments"])
def test_replaytheory_needs_neither_torch_nor_the_harness(forbidden):
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "replaytheory").rglob("*.py")
                 if imports_any(file_imports(p), forbidden)]
    assert offenders == []


def test_probes_do_not_import_the_experiment():
    names = file_imports(REPO / "llm_experiments" / "probes.py")
    assert not imports_any(names, "llm_experiments.experiment")
    assert "llm_experiments.seeds.derived_seed" in names
