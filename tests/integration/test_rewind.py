"""Checkpoint rewind: operator and command-line tool against moto."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import datetime, timezone

import pytest
from airflow.sdk.exceptions import AirflowFailException
from click.testing import CliRunner

from airflow_kinesis_spark.cli import terminal
from airflow_kinesis_spark.cli import main as cli
from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.positions import Sentinel, format_timestamp
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.checkpoints import KinesisCheckpointRewindOperator
from demo.producer import put_plain
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream
from tests.helpers import run_batch_without_spark

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _aws(aws_conn, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)  # for the command-line tool's default chain
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)


@pytest.fixture
def consumed(kinesis, dynamodb, unique_name):
    """A 2-shard stream with two bursts of records, the first committed as batch 1."""
    create_stream(kinesis, unique_name, 2)
    first = put_plain(kinesis, unique_name, [(f"k{i}", f"first {i}".encode()) for i in range(20)])
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    run_batch_without_spark(kinesis, store, batch_id=1)
    time.sleep(0.05)
    between = datetime.now(timezone.utc)
    time.sleep(0.05)
    second = put_plain(kinesis, unique_name, [(f"k{i}", f"second {i}".encode()) for i in range(10)])
    return store, first, second, between


def rewind_op(store, to, **kwargs):
    return KinesisCheckpointRewindOperator(task_id="rewind", stream_name=store.stream_name, consumer_name="lake",
                                           checkpoint_table=store.table_name, to=to, **kwargs)  # fmt: skip


def test_dry_run_changes_nothing(consumed):
    store, *_ = consumed
    before = store.committed_checkpoints()
    result = rewind_op(store, "TRIM_HORIZON", dry_run=True).execute({})
    assert result["batch_id"] is None and all(v["to"] == "TRIM_HORIZON" for v in result["shards"].values())
    assert {k: v["from"] for k, v in result["shards"].items()} == {k: str(v) for k, v in before.items()}
    assert store.head().committed_batch_id == 1 and store.committed_checkpoints() == before


def test_rewind_to_trim_horizon_rereads_everything(consumed, kinesis):
    store, first, second, _ = consumed
    assert rewind_op(store, "TRIM_HORIZON").execute({})["batch_id"] == 2
    _, _, records = run_batch_without_spark(kinesis, store, batch_id=3)
    assert len(records) == len(first) + len(second)


def test_rewind_to_a_timestamp_rereads_from_it(consumed, kinesis):
    store, _, second, between = consumed
    rewind_op(store, format_timestamp(between)).execute({})
    _, _, records = run_batch_without_spark(kinesis, store, batch_id=3)
    assert sorted(r.data for r in records) == sorted(f"second {i}".encode() for i in range(10))
    assert len(second) == 10


def test_rewind_to_latest_skips_the_backlog(consumed, kinesis):
    store, *_ = consumed
    rewind_op(store, "LATEST").execute({})
    assert all(c.sentinel is Sentinel.AT_TIMESTAMP for c in store.committed_checkpoints().values())
    _, _, records = run_batch_without_spark(kinesis, store, batch_id=3)
    assert records == []


def test_rewind_refuses_a_pending_batch_unless_discarded(consumed, kinesis, tmp_path):
    store, *_ = consumed
    now = datetime.now(timezone.utc)
    plan = plan_incremental(batch_id=2, stream_name=store.stream_name, consumer_name="lake",
                            shards=list_shards(kinesis, store.stream_name), checkpoints=store.committed_checkpoints(),
                            cutoff=now, now=now, output_location="x")  # fmt: skip
    store.begin(plan, "crashed-run")
    with pytest.raises(AirflowFailException, match=r"has pending batch 2 .held by crashed-run.*rewind with discard_pending=True"):
        rewind_op(store, "TRIM_HORIZON").execute({})
    plan_output = tmp_path / "batch_id=2"
    (plan_output / "part-0.parquet").parent.mkdir(parents=True)
    (plan_output / "part-0.parquet").write_bytes(b"written by the crashed run")
    store.discard_pending(2, "crashed-run")
    store.begin(replace(plan, output_location=str(plan_output)), "crashed-run-2")
    store.release(2, "crashed-run-2")  # the crashed run's lease expired
    result = rewind_op(store, "TRIM_HORIZON", discard_pending=True, output_path=str(tmp_path)).execute({})
    assert result["discarded_batch_id"] == 2 and result["batch_id"] == 2 and result["holder"] == "crashed-run-2"
    # the rewind commits batch 2: the discarded attempt's files must not pass for its output
    assert result["discarded_output"] == f"deleted {plan_output}" and not plan_output.exists()
    assert store.head().pending_batch_id is None and store.head().committed_batch_id == 2


def test_rewind_rejects_a_future_or_malformed_target(consumed):
    store, *_ = consumed
    with pytest.raises(ValueError, match="is in the future"):
        rewind_op(store, "2999-01-01T00:00:00Z").execute({})
    with pytest.raises(ValueError, match="is not TRIM_HORIZON, LATEST or an ISO 8601 timestamp"):
        rewind_op(store, "yesterday").execute({})


def test_cli_lists_checkpoints_and_lag_and_rewinds(consumed, moto_endpoint, monkeypatch):
    store, *_ = consumed
    base = ["--endpoint-url", moto_endpoint, "--region", REGION]
    args = [store.stream_name, "-c", "lake", "-t", store.table_name]
    runner = CliRunner(env={"COLUMNS": "200"})
    table = runner.invoke(cli, [*base, "checkpoints", *args])
    assert table.exit_code == 0, table.output
    assert "shardId-000000000000" in table.output and "committed batch 1" in table.output and "yes" in table.output
    as_json = json.loads(runner.invoke(cli, [*base, "checkpoints", *args, "--json"]).stdout)
    assert as_json["committed_batch_id"] == 1 and as_json["lag"]["shards_with_unconsumed"]
    dry = runner.invoke(cli, [*base, "rewind", *args, "--to", "TRIM_HORIZON", "--dry-run"])
    assert dry.exit_code == 0 and "TRIM_HORIZON" in dry.output and store.head().committed_batch_id == 1
    monkeypatch.setattr(terminal, "stdin_is_interactive", lambda: True)  # CliRunner's stdin is not a terminal
    refused = runner.invoke(cli, [*base, "rewind", *args, "--to", "TRIM_HORIZON"], input="n\n")
    assert refused.exit_code == 1 and "Set these checkpoints? [y/N]: n\nAborted!" in refused.output
    assert store.head().committed_batch_id == 1
    done = runner.invoke(cli, [*base, "rewind", *args, "--to", "TRIM_HORIZON", "--yes"])
    assert done.exit_code == 0 and "Rewound as batch 2" in done.output
    bad = runner.invoke(cli, [*base, "rewind", *args, "--to", "yesterday", "--yes"])
    assert bad.exit_code == 1 and "Error: ValueError: rewind target 'yesterday'" in bad.output and "Traceback" not in bad.output
