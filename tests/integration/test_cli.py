"""The ``kinesis-spark`` command line: help with examples, progress on stderr only, JSON, errors."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone

import click
import pytest
from click.testing import CliRunner

from airflow_kinesis_spark.cli import terminal
from airflow_kinesis_spark.cli import main as cli
from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.producer import put_plain
from demo.stack import free_port
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream
from tests.helpers import run_batch_without_spark

pytestmark = pytest.mark.integration

#: Rich shows live progress only on an interactive terminal; this makes CliRunner's stderr one.
INTERACTIVE = {"TTY_INTERACTIVE": "1", "TTY_COMPATIBLE": "1"}


def commands() -> list[list[str]]:
    """Every command path: the group itself and each subcommand."""
    with click.Context(cli) as ctx:
        return [[]] + [[name] for name in cli.list_commands(ctx)]


@pytest.fixture
def consumed(kinesis, dynamodb, unique_name, monkeypatch):
    """A 3-shard stream, batch 1 committed, then more records waiting."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)  # the command's default chain
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
    create_stream(kinesis, unique_name, 3)
    put_plain(kinesis, unique_name, [(f"k{i}", f"first {i}".encode()) for i in range(30)])
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    run_batch_without_spark(kinesis, store, batch_id=1)
    put_plain(kinesis, unique_name, [(f"k{i}", f"second {i}".encode()) for i in range(30)])
    return store


def invoke(runner: CliRunner, endpoint: str, *args: str, **kwargs):
    return runner.invoke(cli, ["--endpoint-url", endpoint, "--region", REGION, *args], **kwargs)


@pytest.mark.parametrize("command", commands(), ids=lambda c: " ".join(c) or "kinesis-spark")
def test_every_command_has_help_with_an_unwrapped_example(command):
    result = CliRunner(env={"COLUMNS": "50"}).invoke(cli, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Examples:\n" in result.output
    # the examples are printed as written (click's \b), not re-wrapped to the 50 columns
    epilog = (cli.commands[command[0]] if command else cli).epilog
    written = [line.strip() for line in epilog.splitlines() if line.strip() not in ("", "\b")]
    printed = [line.strip() for line in result.output.splitlines()]
    assert any(line.startswith("kinesis-spark ") and len(line) > 50 for line in written)
    assert all(line in printed for line in written)


def test_top_level_help_lists_exit_statuses():
    output = CliRunner().invoke(cli, ["--help"]).output
    assert "Exit status:" in output and "2  a usage error" in output


def test_json_stays_parseable_while_progress_is_shown(consumed, moto_endpoint, monkeypatch):
    args = [consumed.stream_name, "-c", "lake", "-t", consumed.table_name]
    result = invoke(CliRunner(env={**INTERACTIVE, "COLUMNS": "120"}), moto_endpoint, "checkpoints", *args, "--json")
    assert result.exit_code == 0, result.output
    assert "Probing 3 of 3 shards" in result.stderr  # the progress went to stderr...
    data = json.loads(result.stdout)  # ...and nothing but the JSON to stdout
    assert data["committed_batch_id"] == 1 and len(data["lag"]["shards_with_unconsumed"]) == 3

    dry = invoke(CliRunner(env=INTERACTIVE), moto_endpoint, "rewind", *args, "--to", "TRIM_HORIZON", "--dry-run", "--json")
    assert dry.exit_code == 0 and "Listing the shards" in dry.stderr
    preview = json.loads(dry.stdout)
    assert preview["batch_id"] is None and {v["to"] for v in preview["shards"].values()} == {"TRIM_HORIZON"}

    monkeypatch.setattr(terminal, "stdin_is_interactive", lambda: True)  # CliRunner's stdin is not a terminal
    done = invoke(CliRunner(env=INTERACTIVE), moto_endpoint, "rewind", *args, "--to", "LATEST", "--json", input="y\n")
    assert done.exit_code == 0, done.output
    assert "Set the checkpoints of 3 shards?" in done.stderr  # the prompt does not break the JSON either
    assert json.loads(done.stdout)["batch_id"] == 2 and consumed.head().committed_batch_id == 2


def test_no_progress_output_when_stderr_is_not_a_terminal(consumed, moto_endpoint):
    args = [consumed.stream_name, "-c", "lake", "-t", consumed.table_name]
    result = invoke(CliRunner(env={"TTY_INTERACTIVE": "0"}), moto_endpoint, "checkpoints", *args)
    assert result.exit_code == 0 and result.stderr == ""


def test_table_has_a_row_per_shard_and_a_summary(consumed, moto_endpoint):
    result = invoke(CliRunner(env={"COLUMNS": "120"}), moto_endpoint, "checkpoints", consumed.stream_name, "-c", "lake",
                    "-t", consumed.table_name)  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "shardId-" in line]
    assert len(rows) == 3 and all("readable" in row and " yes " in row for row in rows)
    assert "3 shards, 3 readable, 3 with records waiting, oldest waiting" in result.stdout


def test_unreachable_endpoint_is_one_line_within_seconds(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
    endpoint = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    result = invoke(CliRunner(), endpoint, "checkpoints", "orders", "-c", "lake", "-t", "checkpoints")
    assert time.monotonic() - start < 8
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"Error: EndpointUnreachableError: Cannot reach Kinesis at {endpoint} (--endpoint-url" in result.output


def test_aws_errors_are_one_line_too(consumed, moto_endpoint):
    result = invoke(CliRunner(), moto_endpoint, "checkpoints", "no-such-stream", "-c", "lake", "-t", consumed.table_name)
    assert result.exit_code == 1 and "Error: StreamNotFoundError: Kinesis stream 'no-such-stream'" in result.output
    # what to check is named as the command line names it, not as a connection's extras
    assert "Check the stream name, --region, --profile and --endpoint-url." in result.output
    assert "extras" not in result.output and "endpoint_url" not in result.output
    no_region = CliRunner(env={"AWS_DEFAULT_REGION": None, "AWS_REGION": None, "AWS_CONFIG_FILE": "/dev/null"}).invoke(
        cli, ["--endpoint-url", moto_endpoint, "checkpoints", "s", "-c", "lake", "-t", "t"]
    )
    assert no_region.exit_code == 1 and "Error: NoRegionError" in no_region.output and "Traceback" not in no_region.output


def test_usage_errors_exit_with_2():
    result = CliRunner().invoke(cli, ["rewind", "orders", "-c", "lake", "-t", "checkpoints"])
    assert result.exit_code == 2 and "Missing option '--to'" in result.output


def test_probes_stay_within_the_clients_connection_pool(kinesis, dynamodb, unique_name, moto_endpoint, monkeypatch, caplog):
    """More readable shards than botocore pools connections (10): no connection is opened and
    thrown away ("Connection pool is full"), as more probe threads than connections would do."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
    create_stream(kinesis, unique_name, 24)
    DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake").ensure_table()
    caplog.set_level(logging.WARNING, logger="urllib3")
    try:
        result = invoke(CliRunner(), moto_endpoint, "checkpoints", unique_name, "-c", "lake", "-t", f"{unique_name}_t", "--json")
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.stdout)["lag"]["shards"]) == 24
        assert not [r for r in caplog.records if "Connection pool is full" in r.getMessage()]
    finally:
        kinesis.delete_stream(StreamName=unique_name)


@pytest.mark.parametrize("command", [["rewind", "--to", "TRIM_HORIZON"], ["discard-pending"]], ids=lambda c: c[0])
def test_a_change_without_yes_fails_when_stdin_is_not_a_terminal(consumed, kinesis, moto_endpoint, command):
    """A piped "y" is not a confirmation: without --yes, a non-interactive run changes nothing and
    says which flag to pass (a usage error, exit status 2)."""
    if command[0] == "discard-pending":  # something to discard, whose lease expired
        now = datetime.now(timezone.utc)
        plan = plan_incremental(batch_id=2, stream_name=consumed.stream_name, consumer_name="lake",
                                shards=list_shards(kinesis, consumed.stream_name),
                                checkpoints=consumed.committed_checkpoints(), cutoff=now, now=now,
                                output_location="/nowhere/batch_id=2")  # fmt: skip
        consumed.begin(plan, "crashed-run")
        consumed.release(2, "crashed-run")
    before = consumed.head()
    args = [consumed.stream_name, "-c", "lake", "-t", consumed.table_name]
    result = invoke(CliRunner(), moto_endpoint, command[0], *args, *command[1:], input="y\n")
    assert result.exit_code == 2, result.output
    assert f"stdin is not a terminal, so {command[0]} cannot ask for confirmation: pass --yes" in result.output
    assert consumed.head() == before
