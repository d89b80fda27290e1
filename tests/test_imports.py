"""Which module may import which, read from the source (ast; nothing is imported).

``figures/`` only reads saved results, so nothing depends on it; ``replaytheory/`` is numpy and
scipy only; the probes see a run through ``probes.RunView``, never the ``Experiment``; the
harness never imports the study that uses it (``llm_experiments.study``); no two modules import
each other, directly or around a circle (imports inside functions included), and config.py
imports only leaves; no package holds more than ``MAX_MODULES`` modules.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAX_MODULES = 15  # per package, __init__ and __main__ not counted: a tree a reader can scan
LIBRARY = sorted(p for pkg in ("replaytheory", "llm_experiments")
                 for p in (REPO / pkg).rglob("*.py"))


def from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module of ``from m import ...`` in ``package``."""
    if not node.level:
        return node.module
    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of every module that ``source`` (a module of ``package``) imports,
    anywhere in the file, relative imports resolved; ``from m import x`` counts m and m.x."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
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
    names = file_imports(REPO / "llm_experiments" / "probing" / "probes.py")
    assert not imports_any(names, "llm_experiments.engines.experiment")
    assert "llm_experiments.engines.seeds.derived_seed" in names


def test_the_harness_never_imports_the_study():
    harness = [p for p in (REPO / "llm_experiments").rglob("*.py")
               if "study" not in p.relative_to(REPO).parts
               and p.name not in ("cli.py", "__main__.py")]  # the command line sits above both
    offenders = [str(p.relative_to(REPO)) for p in harness
                 if imports_any(file_imports(p), "llm_experiments.study")]
    assert offenders == []


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def module_names() -> dict[str, Path]:
    """Library module name -> file; a package is its ``__init__`` (named by the package)."""
    return {module_name(p.parent if p.name == "__init__.py" else p): p for p in LIBRARY}


def module_imports(name: str, path: Path, modules) -> set[str]:
    """The library modules (of ``modules``) that module ``name`` imports anywhere in its file,
    inside functions too: such an import runs later, but the two modules still need each
    other. ``from package import x`` counts ``package.x`` when x is a module, else the package
    (whose ``__init__`` defines x). A package's ``__init__`` does not count for its
    submodules: a package re-exporting its modules is not a circle between them."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                      for alias in node.names}
    return {n for n in found if n in modules and n != name}


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports (``module_imports``)."""
    modules = module_names()
    return {name: module_imports(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (one path each), by depth-first search."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_circles_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_import_graph_sees_imports_inside_functions_and_package_modules(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("def make():\n    from .impl import Thing\n")
    (package / "impl.py").write_text("from . import Base\nfrom . import helper\n")
    (package / "helper.py").write_text("")
    modules = {"pkg": package / "__init__.py", "pkg.impl": package / "impl.py",
               "pkg.helper": package / "helper.py"}
    assert module_imports("pkg", modules["pkg"], modules) == {"pkg.impl"}
    assert module_imports("pkg.impl", modules["pkg.impl"], modules) == {"pkg", "pkg.helper"}


def test_no_import_circle():
    graph = import_graph()
    assert "llm_experiments.engines.ray_engine" in graph  # the graph reaches the subpackages
    assert "llm_experiments.samplers" in graph  # and the packages' own modules
    assert circles(graph) == []


def test_config_imports_only_leaves():
    """The subsystems import config.py, so it imports only modules that import nothing of
    ``llm_experiments`` (the choice lists' leaf modules and plain arithmetic)."""
    graph = import_graph()
    ours = [m for m in graph["llm_experiments.config"] if m.startswith("llm_experiments")]
    assert "llm_experiments.rl.choices" in ours
    assert {m: sorted(graph[m]) for m in ours
            if any(n.startswith("llm_experiments") for n in graph[m])} == {}


def test_no_package_holds_more_than_max_modules():
    crowded = {}
    for pkg in ("replaytheory", "llm_experiments", "figures"):
        for folder in [REPO / pkg, *[d for d in (REPO / pkg).rglob("*") if d.is_dir()]]:
            n = len([p for p in folder.glob("*.py")
                     if p.name not in ("__init__.py", "__main__.py")])
            if n > MAX_MODULES:
                crowded[str(folder.relative_to(REPO))] = n
    assert crowded == {}
