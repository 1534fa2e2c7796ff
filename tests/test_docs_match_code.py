"""Docs that cannot drift from the code: the operators' parameter tables (docs/operators.md)
against ``inspect.signature``, and the CLI's commands and flags (docs/cli.md, docs/*.md) against
the click commands."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import click
import pytest

from airflow_kinesis_spark.cli import main as cli
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.split import KinesisCommitBatchOperator

DOCS = Path(__file__).resolve().parents[1] / "docs"


def table_after(page: str, marker: str) -> list[str]:
    """The first column's names (split at commas) of the Markdown table after ``marker``."""
    text = (DOCS / page).read_text()
    rows = text[text.index(marker):].split("\n\n", 2)[1].splitlines()
    names: list[str] = []
    for row in rows[2:]:
        if not row.startswith("|"):
            break
        names += re.findall(r"`([a-z_][a-z0-9_]*)`", row.split("|")[1])
    return names


def own_parameters(cls: type) -> set[str]:
    """The keyword parameters of ``cls`` and of the provider's classes it inherits them from
    (the shared arguments of ``operators.base``, ``spark_settings`` of ``SparkSettingsMixin``, the
    AWS arguments of ``KinesisAwsBaseOperator``), not Airflow's ``BaseOperator``'s."""
    return {p.name for c in cls.__mro__ if c.__module__.startswith("airflow_kinesis_spark.") and "__init__" in vars(c)
            for p in inspect.signature(c.__init__).parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"}  # fmt: skip


@pytest.mark.parametrize(("cls", "marker"), [
    (KinesisToSparkOperator, "## Parameters"),
    (KinesisCommitBatchOperator, "**`KinesisCommitBatchOperator`** commits"),
], ids=["KinesisToSparkOperator", "KinesisCommitBatchOperator"])  # fmt: skip
def test_operator_parameter_tables_list_exactly_the_signature(cls, marker):
    documented = table_after("operators.md", marker)
    assert len(documented) == len(set(documented)), "a parameter documented twice"
    assert sorted(set(documented) - own_parameters(cls)) == [], "documented, but not a parameter"
    assert sorted(own_parameters(cls) - set(documented)) == [], "a parameter the table does not document"


def commands() -> dict[str, click.Command]:
    return dict(cli.commands)


def test_every_cli_command_has_its_section_and_every_option_is_documented():
    text = (DOCS / "cli.md").read_text()
    for name, command in commands().items():
        assert f"## `kinesis-spark {name}`" in text, f"docs/cli.md has no section for {name}"
        section = text.split(f"## `kinesis-spark {name}`", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", section) for o in param.opts), (
                    f"{name} {'/'.join(param.opts)} is not in its section of docs/cli.md")
    for param in cli.params:
        for flag in [o for o in param.opts if o.startswith("--")]:
            assert flag in text, f"global option {flag} is not in docs/cli.md"


def test_every_flag_the_docs_give_a_command_exists():
    common = {o for p in cli.params for o in p.opts} | {"--help"}
    for page in sorted(DOCS.glob("*.md")):
        for line in page.read_text().splitlines():
            for match in re.finditer(r"kinesis-spark ((?:\[?--?[\w-]+[^\]\s]*\]? )*[a-z-]+)", line):
                name = match.group(1).split()[-1]
                if name in commands():
                    known = common | {o for p in commands()[name].params for o in p.opts}
                    invocation = line[match.start():].split("`", 1)[0]  # to the end of its code span
                    flags = re.findall(r"(?<![\w-])(--[a-z][\w-]*)", invocation)
                    unknown = sorted(f for f in flags if f not in known)
                    assert not unknown, f"{page.name}: {line.strip()!r} gives {unknown}, which kinesis-spark does not take"


def _documented_calls(page: str, heading: str) -> list[tuple[str, list[str]]]:
    """``(name, parameter names)`` of every ``| `name(params)` |`` row under ``heading``."""
    text = (DOCS / page).read_text()
    section = text.split(heading + "\n", 1)[1].split("\n#", 1)[0]
    calls = []
    for row in section.splitlines():
        for name, params in re.findall(r"`([a-z_]+)\(([^`]*)\)`", row.split("|")[1] if row.startswith("|") else ""):
            names = [p.split("=")[0].strip() for p in params.split(",") if p.strip() and p.strip() not in ("*", "/")]
            calls.append((name, names))
    return calls


@pytest.mark.parametrize(("heading", "cls"), [
    ("## KinesisStreamHook", "airflow_kinesis_spark.hooks.kinesis:KinesisStreamHook"),
    ("## DynamoDBCheckpointHook", "airflow_kinesis_spark.hooks.dynamodb:DynamoDBCheckpointHook"),
    ("### DynamoDBCheckpointStore", "airflow_kinesis_spark.core.store:DynamoDBCheckpointStore"),
], ids=lambda v: v if isinstance(v, str) and ":" not in v else "")  # fmt: skip
def test_hook_and_store_method_tables_match_the_signatures(heading, cls):
    import importlib

    module, _, name = cls.partition(":")
    target = getattr(importlib.import_module(module), name)
    calls = _documented_calls("hooks.md", heading)
    assert calls, f"no method rows under {heading}"
    for method, documented in calls:
        assert hasattr(target, method), f"docs/hooks.md {heading}: {name} has no method {method}"
        actual = [p for p in inspect.signature(getattr(target, method)).parameters if p != "self"]
        assert documented == actual, f"docs/hooks.md {heading}: {method}({', '.join(documented)}) but the code has ({', '.join(actual)})"
