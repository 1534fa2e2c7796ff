"""The package's layers as docs/architecture.md draws them, read from the source (``ast``): what
each layer may import, and no cycle among the modules' top-level imports.

An import under ``if TYPE_CHECKING:`` is an annotation, not an arrow: it is left out. An import
inside a function is an arrow (it runs when the function does), except for the cycle check,
which is about import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_kinesis_spark"
NAME = "airflow_kinesis_spark"
AIRFLOW_SIDE = ("operators", "sensors", "triggers", "cli", "hooks", "failures", "lineage", "settings", "get_provider_info",
                "detached", "die_with_parent")  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")  # fmt: skip


def imports(path: Path, *, top_level_only: bool) -> list[tuple[int, str]]:
    """``(line, imported module)`` of ``path``, leaving out ``if TYPE_CHECKING:`` blocks (and, with
    ``top_level_only``, everything inside a function)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child):
                for other in child.orelse:
                    visit_one(other)
                continue
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            visit_one(child)

    def visit_one(child: ast.AST) -> None:
        if isinstance(child, ast.Import):
            found.extend((child.lineno, alias.name) for alias in child.names)
        elif isinstance(child, ast.ImportFrom):
            assert not child.level, f"{path}:{child.lineno}: a relative import; the package imports by absolute name"
            base = child.module or ""
            found.append((child.lineno, base))
            for alias in child.names:  # "from package import module"
                found.append((child.lineno, f"{base}.{alias.name}"))
        visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def arrows(module: str, path: Path, *, top_level_only: bool = False) -> list[tuple[int, str]]:
    """The package's modules that ``module`` imports (only those that exist as modules)."""
    known = modules()
    return [(line, target) for line, target in imports(path, top_level_only=top_level_only)
            if target in known and target != module]  # fmt: skip


RULES = {
    # layer: (may it import airflow?, layers of the package it must not import)
    "core": (False, {"hooks", "job", "sinks", *AIRFLOW_SIDE}),
    "sinks": (False, {"hooks", "job", *AIRFLOW_SIDE}),
    "job": (False, {"hooks", *AIRFLOW_SIDE}),
    "transforms": (False, {"hooks", "job", "sinks", *AIRFLOW_SIDE}),
    "exceptions": (False, {"core", "hooks", "job", "sinks", "transforms", *AIRFLOW_SIDE}),
    "hooks": (True, {"operators", "sensors", "triggers", "cli"}),
}


def layer_violations(name: str) -> list[str]:
    """``"<file>:<line> imports <module>"`` for each import of layer ``name`` that :data:`RULES` refuses."""
    airflow_allowed, refused = RULES[name]
    broken = []
    for module, path in modules().items():
        if layer(module) != name:
            continue
        for line, target in imports(path, top_level_only=False):
            if not airflow_allowed and (target == "airflow" or target.startswith("airflow.")):
                broken.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
            if target.startswith(NAME + ".") and layer(target) in refused and target in modules():
                broken.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    return broken


@pytest.mark.parametrize("name", sorted(RULES))
def test_each_layer_imports_only_what_is_below_it(name):
    assert layer_violations(name) == []


def import_cycles() -> list[list[str]]:
    """The cycles among the package's top-level imports, each as ``[a, b, ..., a]``."""
    graph = {module: {t for _, t in arrows(module, path, top_level_only=True)} for module, path in modules().items()}
    # a package imports its own submodules as it is initialised; that is not a cycle of layers
    for module in graph:
        graph[module] = {t for t in graph[module] if not module_is_package_of(module, t)}
    cycles, state, stack = [], {}, []

    def walk(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                walk(target)
        stack.pop()
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return cycles


def test_no_cycle_among_top_level_imports():
    assert import_cycles() == []


def module_is_package_of(module: str, target: str) -> bool:
    return modules()[module].name == "__init__.py" and target.startswith(module + ".")


def test_the_checks_see_a_forbidden_import_and_a_cycle(tmp_path, monkeypatch):
    """The checks above can fail: a core module importing a hook, and two modules importing each other."""
    root = tmp_path / NAME
    (root / "core").mkdir(parents=True)
    (root / "hooks").mkdir()
    for folder in (root, root / "core", root / "hooks"):
        (folder / "__init__.py").write_text("")
    (root / "core" / "a.py").write_text("from airflow_kinesis_spark.core import b\nfrom airflow_kinesis_spark.hooks import h\n")
    (root / "core" / "b.py").write_text("import airflow_kinesis_spark.core.a\n")
    (root / "hooks" / "h.py").write_text("")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", root)
    assert layer_violations("core") == ["airflow_kinesis_spark/core/a.py:2 imports airflow_kinesis_spark.hooks",
                                        "airflow_kinesis_spark/core/a.py:2 imports airflow_kinesis_spark.hooks.h"]
    assert import_cycles() == [["airflow_kinesis_spark.core.a", "airflow_kinesis_spark.core.b", "airflow_kinesis_spark.core.a"]]
