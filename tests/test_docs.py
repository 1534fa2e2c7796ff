"""The Sphinx documentation: it builds without a warning, its API reference documents every public
class and function, and its how-to pages include every example DAG."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import airflow_kinesis_spark

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DAGS = ROOT / "dags"

# `make docs` runs the same command, into docs/_build/html.
SPHINX = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]

# A literalinclude in a Markdown (MyST) page or a reStructuredText page, and its options.
INCLUDE = re.compile(r"^(?:```\{literalinclude\}|\.\. literalinclude::)\s+(\S+)\s*$")
OPTION = re.compile(r"^\s*:([\w-]+):\s*(.*?)\s*$")


def public_modules() -> list[ModuleType]:
    """Every module of the package; packages only when they declare ``__all__``."""
    modules = []
    for info in pkgutil.walk_packages(airflow_kinesis_spark.__path__, f"{airflow_kinesis_spark.__name__}."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        if not info.ispkg or hasattr(module, "__all__"):
            modules.append(module)
    return modules


def public_objects(module: ModuleType) -> list[str]:
    """Qualified names of a module's public classes and functions.

    With ``__all__``: the classes and functions it lists. Without: the public classes defined in
    the module itself.
    """
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, obj in vars(module).items() if inspect.isclass(obj) and obj.__module__ == module.__name__]
        names = [n for n in names if not n.startswith("_")]
    objects = {n: getattr(module, n) for n in names}
    return sorted(f"{module.__name__}.{n}" for n, obj in objects.items() if inspect.isclass(obj) or inspect.isfunction(obj))


def html_ids(html_dir: Path) -> set[str]:
    """Every element id of the built pages: autodoc gives each documented object its full name."""
    ids: set[str] = set()
    for page in html_dir.rglob("*.html"):
        ids.update(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))
    return ids


def missing_from_reference(ids: set[str]) -> list[str]:
    """Public modules, classes and functions without an entry in the built API reference."""
    missing = []
    for module in public_modules():
        if f"module-{module.__name__}" not in ids:
            missing.append(f"module {module.__name__}")
        missing += [name for name in public_objects(module) if name not in ids]
    return missing


def literal_includes() -> list[tuple[Path, Path, dict[str, str]]]:
    """(page, included file, options) of every literalinclude in the docs sources."""
    found = []
    for page in sorted(p for p in DOCS.rglob("*") if p.suffix in (".md", ".rst") and "_build" not in p.parts):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            match = INCLUDE.match(line.strip())
            if not match:
                continue
            options = {}
            for option_line in lines[i + 1 :]:
                option = OPTION.match(option_line)
                if not option:
                    break
                options[option.group(1)] = option.group(2).strip('"')
            found.append((page, (page.parent / match.group(1)).resolve(), options))
    return found


@pytest.mark.slow
def test_docs_build_without_warnings_and_document_every_public_object(tmp_path):
    # One Sphinx build (96 s in a recorded run, tests/durations.json) for both checks: as two tests sharing a fixture,
    # pytest-xdist ran them on two workers and built the docs twice.
    built_html = tmp_path / "html"
    proc = subprocess.run([*SPHINX, str(DOCS), str(built_html)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, f"sphinx -W failed:\n{proc.stderr[-5000:]}"
    for page in ("index", "installation", "connections", "operators", "sensors", "triggers", "hooks", "iam",
                 "troubleshooting", "changelog", "api/index"):  # fmt: skip
        assert (built_html / f"{page}.html").is_file(), page

    ids = html_ids(built_html)
    assert missing_from_reference(ids) == []
    # The check sees a class that is left out (here: by dropping its entry from the pages).
    hidden = "airflow_kinesis_spark.operators.kinesis_to_spark.KinesisToSparkOperator"
    assert hidden in ids
    assert missing_from_reference(ids - {hidden}) == [hidden]


def test_every_example_dag_is_included_by_its_markers():
    includes = literal_includes()
    included = {path for _, path, _ in includes}
    dags = sorted(p.resolve() for p in DAGS.glob("*.py") if p.name != "__init__.py")
    assert dags, "no example DAGs found"
    assert [p.name for p in dags if p not in included] == []
    for page, path, options in includes:
        if path.parent != DAGS.resolve():
            continue
        start, end = options.get("start-after", ""), options.get("end-before", "")
        assert start.startswith("[START howto_"), f"{page.name} includes {path.name} without a [START howto_...] marker"
        assert end == start.replace("[START", "[END", 1), f"{page.name}: {start!r} ends at {end!r}"
        text = path.read_text(encoding="utf-8")
        assert f"# {start}\n" in text and f"# {end}\n" in text, f"{path.name} lacks the markers {page.name} uses"
