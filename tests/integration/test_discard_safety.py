"""Discarding a pending batch never deletes a path read from the checkpoint table (issue #13).

The checkpoint table is state anyone with write access to it can change: a plan planted there
names whatever ``output_location`` its writer likes. ``rewind --discard-pending`` and
``discard-pending`` (operators and command line) delete only the batch's own directory under the
output root they are given, say what they delete before they do, and never drop a batch a live
run holds. Against moto, with real directories under pytest's ``tmp_path``.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from airflow_kinesis_spark.cli import terminal
from airflow_kinesis_spark.cli import main as cli
from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import BatchLeaseHeldError, CheckpointConflictError
from airflow_kinesis_spark.operators.checkpoints import KinesisCheckpointRewindOperator
from demo.producer import put_plain
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream
from tests.helpers import run_batch_without_spark

pytestmark = pytest.mark.integration

CHECK_WRITER = "check who wrote the checkpoint table"


@pytest.fixture(autouse=True)
def _aws(aws_conn, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)  # for the command-line tool's default chain
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)


@pytest.fixture
def store(kinesis, dynamodb, unique_name):
    """A 2-shard stream; batch 1 committed; 10 more records waiting."""
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", f"first {i}".encode()) for i in range(20)])
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    run_batch_without_spark(kinesis, store, batch_id=1)
    put_plain(kinesis, unique_name, [(f"k{i}", f"second {i}".encode()) for i in range(10)])
    return store


@pytest.fixture
def root(tmp_path) -> Path:
    """The consumer's output root: batch 1's committed output is there."""
    root = tmp_path / "lake"
    (root / "batch_id=1").mkdir(parents=True)
    (root / "batch_id=1" / "part-0.parquet").write_bytes(b"committed output of batch 1")
    return root


@pytest.fixture
def victim(tmp_path) -> Path:
    """A directory outside the output root that nothing may delete."""
    victim = tmp_path / "home" / "user"
    victim.mkdir(parents=True)
    (victim / "thesis.tex").write_text("years of work")
    return victim


def batch_dir(root: Path, batch_id: int = 2) -> Path:
    """The batch's directory under ``root``, written as a crashed run of the batch would have left it."""
    path = root / f"batch_id={batch_id}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "part-0.parquet").write_bytes(b"written by the crashed run")
    return path


def plant(store, kinesis, output_location: str, *, owner: str = "crashed-run", live: bool = False) -> None:
    """Make batch 2 pending with a plan naming ``output_location``; its lease expired unless ``live``."""
    now = datetime.now(timezone.utc)
    plan = plan_incremental(batch_id=2, stream_name=store.stream_name, consumer_name="lake",
                            shards=list_shards(kinesis, store.stream_name), checkpoints=store.committed_checkpoints(),
                            cutoff=now, now=now, output_location=output_location)  # fmt: skip
    store.begin(plan, owner)
    if not live:
        store.release(2, owner)


def invoke(moto_endpoint: str, store, command: str, *args: str, input: str | None = None):
    base = ["--endpoint-url", moto_endpoint, "--region", REGION]
    return CliRunner(env={"COLUMNS": "100"}).invoke(
        cli, [*base, command, store.stream_name, "-c", "lake", "-t", store.table_name, *args], input=input
    )


@pytest.fixture
def interactive(monkeypatch):
    """Make the command line take CliRunner's stdin for a terminal, to answer its prompt."""
    monkeypatch.setattr(terminal, "stdin_is_interactive", lambda: True)


def rewind_op(store, **kwargs) -> KinesisCheckpointRewindOperator:
    return KinesisCheckpointRewindOperator(task_id="rewind", stream_name=store.stream_name, consumer_name="lake",
                                           checkpoint_table=store.table_name, to="TRIM_HORIZON", **kwargs)  # fmt: skip


def discard_op(store, **kwargs):
    from airflow_kinesis_spark.operators.checkpoints import KinesisDiscardPendingBatchOperator

    return KinesisDiscardPendingBatchOperator(task_id="discard", stream_name=store.stream_name, consumer_name="lake",
                                              checkpoint_table=store.table_name, **kwargs)  # fmt: skip


def run_tool(tool: str, store, moto_endpoint: str, output_path: str | None) -> str:
    """Discard the pending batch with ``tool`` (without asking); returns its ``discarded_output``."""
    root_args = ["--output-path", output_path] if output_path else []
    if tool == "rewind operator":
        return rewind_op(store, discard_pending=True, output_path=output_path).execute({})["discarded_output"]
    if tool == "discard operator":
        return discard_op(store, output_path=output_path).execute({})["discarded_output"]
    rewind = tool == "rewind cli"
    command, extra = ("rewind", ["--to", "TRIM_HORIZON", "--discard-pending"]) if rewind else ("discard-pending", [])
    result = invoke(moto_endpoint, store, command, *extra, *root_args, "--yes", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["discarded_output"]


TOOLS = ["rewind operator", "rewind cli", "discard operator", "discard cli"]


# -- what may be deleted -------------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOLS)
def test_a_planted_location_outside_the_root_is_never_deleted(tool, store, kinesis, moto_endpoint, root, victim):
    plant(store, kinesis, str(victim))
    said = run_tool(tool, store, moto_endpoint, str(root))
    assert (victim / "thesis.tex").read_text() == "years of work"
    assert said == (f"nothing deleted: the stored plan names {str(victim)!r}, not the batch's directory under the "
                    f"output root {root}/batch_id=2; {CHECK_WRITER}")  # fmt: skip
    assert store.head().pending_batch_id is None  # the batch itself is dropped


@pytest.mark.parametrize("planted", ["{root}/batch_id=2/../../home/user", "file://{victim}", "{root}/batch_id=2/", "{victim}"])
def test_only_the_exact_location_matches(planted, store, kinesis, root, victim):
    """A path that leads elsewhere, or is only written differently, is a mismatch: nothing deleted."""
    from airflow_kinesis_spark.core.admin import discard_pending

    batch_dir(root)
    location = planted.format(root=root, victim=victim)
    plant(store, kinesis, location)
    result = discard_pending(store, output_path=str(root), owner="test")
    assert result["deleted_path"] is None
    assert result["discarded_output"].startswith(f"nothing deleted: the stored plan names {location!r}, not the batch's")
    assert (victim / "thesis.tex").exists() and (root / "batch_id=2" / "part-0.parquet").exists()


@pytest.mark.parametrize("tool", TOOLS)
def test_without_an_output_root_nothing_is_deleted(tool, store, kinesis, moto_endpoint, root):
    """Even the right directory: without the root there is nothing to check the stored path against."""
    path = batch_dir(root)
    plant(store, kinesis, str(path))
    said = run_tool(tool, store, moto_endpoint, None)
    assert (path / "part-0.parquet").exists()
    # each tool names its own way to give the output root: a CLI flag, an operator argument
    flag = "--output-path" if tool.endswith("cli") else "output_path"
    assert said == f"nothing deleted: the stored plan names {str(path)!r}; give {flag} (the consumer's output root) to delete the batch's directory"


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("scheme", ["", "file://"])
def test_the_batch_directory_under_the_root_is_deleted(tool, scheme, store, kinesis, moto_endpoint, root):
    path = batch_dir(root)
    plant(store, kinesis, f"{scheme}{root}/batch_id=2")
    said = run_tool(tool, store, moto_endpoint, f"{scheme}{root}")
    assert said == f"deleted {path}" and not path.exists()
    assert (root / "batch_id=1" / "part-0.parquet").exists()  # committed output is not touched


@pytest.mark.parametrize("tool", TOOLS)
def test_a_symlink_at_the_batch_directory_is_not_followed(tool, store, kinesis, moto_endpoint, root, victim):
    link = root / "batch_id=2"
    link.symlink_to(victim, target_is_directory=True)
    plant(store, kinesis, str(link))
    said = run_tool(tool, store, moto_endpoint, str(root))
    assert said == f"nothing deleted: {link} is a symbolic link, not a directory the batch wrote; check who made it"
    assert link.is_symlink() and (victim / "thesis.tex").read_text() == "years of work"


def test_the_command_line_says_what_it_did(store, kinesis, moto_endpoint, root, victim):
    plant(store, kinesis, str(victim))
    result = invoke(moto_endpoint, store, "rewind", "--to", "TRIM_HORIZON", "--discard-pending", "--output-path",
                    str(root), "--yes")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (f"Discarded pending batch 2 (nothing deleted: the stored plan names {str(victim)!r}, not the batch's "
            f"directory under the output root {root}/batch_id=2; {CHECK_WRITER}).\nRewound as batch 2.\n") in result.stdout
    assert (victim / "thesis.tex").exists()


def test_a_remote_root_is_named_not_deleted(store, kinesis):
    from airflow_kinesis_spark.core.admin import discard_pending

    plant(store, kinesis, "s3a://example-lake/access_log/batch_id=2")
    result = discard_pending(store, output_path="s3a://example-lake/access_log/", owner="test")
    assert result["deleted_path"] is None and result["discarded_output"] == (
        "nothing deleted: s3a://example-lake/access_log/batch_id=2 is not local; delete it yourself, the discarded "
        "batch may have written there"
    )


def test_a_pending_batch_id_that_does_not_follow_the_committed_one_deletes_nothing(store, kinesis, root):
    """A HEAD planted to point at a committed batch's plan: that batch's output is committed output."""
    from airflow_kinesis_spark.core.admin import discard_pending

    now = datetime.now(timezone.utc)
    plan = plan_incremental(batch_id=2, stream_name=store.stream_name, consumer_name="lake",
                            shards=list_shards(kinesis, store.stream_name), checkpoints=store.committed_checkpoints(),
                            cutoff=now, now=now, output_location=f"{root}/batch_id=2")  # fmt: skip
    store.begin(plan, "ingest")
    store.commit(plan, store.committed_checkpoints(), "ingest")
    committed = batch_dir(root, 2)
    store.client.update_item(
        TableName=store.table_name, Key={"pk": {"S": store.pk}, "sk": {"S": "HEAD"}},
        UpdateExpression="SET pending_batch_id = :n, pending_plan_owner = :o, pending_owner = :o, pending_heartbeat = :z",
        ExpressionAttributeValues={":n": {"N": "2"}, ":o": {"S": "ingest"}, ":z": {"N": "0"}},
    )  # fmt: skip
    result = discard_pending(store, output_path=str(root), owner="test")
    assert result["discarded_output"] == f"nothing deleted: pending batch 2 does not follow committed batch 2; {CHECK_WRITER}"
    assert (committed / "part-0.parquet").exists()


# -- destructive actions say what they destroy -----------------------------------------------------


def test_the_dry_run_names_the_batch_and_the_exact_path(store, kinesis, moto_endpoint, root):
    path = batch_dir(root)
    plant(store, kinesis, str(path))
    before = store.head()
    table = invoke(moto_endpoint, store, "rewind", "--to", "TRIM_HORIZON", "--discard-pending", "--output-path", str(root),
                   "--dry-run")  # fmt: skip
    assert table.exit_code == 0, table.output
    assert f"Pending batch 2 (held by crashed-run): would delete {path}.\n" in table.stdout
    as_json = invoke(moto_endpoint, store, "discard-pending", "--output-path", str(root), "--dry-run", "--json")
    preview = json.loads(as_json.stdout)
    assert preview["dry_run"] and preview["discarded_batch_id"] == 2 and preview["holder"] == "crashed-run"
    assert preview["discarded_output"] == f"would delete {path}" and preview["deleted_path"] == str(path)
    operator = rewind_op(store, dry_run=True, discard_pending=True, output_path=str(root)).execute({})
    assert operator["discarded_batch_id"] == 2 and operator["discarded_output"] == f"would delete {path}"
    assert operator["batch_id"] is None
    assert store.head() == before and (path / "part-0.parquet").exists()  # nothing changed


def test_the_dry_run_says_why_nothing_would_be_deleted(store, kinesis, moto_endpoint, root, victim):
    plant(store, kinesis, str(victim))
    result = invoke(moto_endpoint, store, "discard-pending", "--output-path", str(root), "--dry-run")
    assert result.exit_code == 0, result.output
    assert (f"Pending batch 2 (held by crashed-run): would delete nothing: the stored plan names {str(victim)!r}, not the "
            f"batch's directory under the output root {root}/batch_id=2; {CHECK_WRITER}.") in result.stdout  # fmt: skip
    assert store.head().pending_batch_id == 2


def test_the_prompt_names_the_batch_and_the_exact_path(store, kinesis, moto_endpoint, root, interactive):
    path = batch_dir(root)
    plant(store, kinesis, str(path))
    declined = invoke(moto_endpoint, store, "rewind", "--to", "TRIM_HORIZON", "--discard-pending", "--output-path",
                      str(root), input="n\n")  # fmt: skip
    assert declined.exit_code == 1
    assert f"Discard pending batch 2, delete {path} and set these checkpoints? [y/N]: n\nAborted!" in declined.output
    assert store.head().pending_batch_id == 2 and path.exists()
    done = invoke(moto_endpoint, store, "discard-pending", "--output-path", str(root), input="y\n")
    assert done.exit_code == 0, done.output
    assert f"Discard pending batch 2, delete {path}? [y/N]: y\n" in done.output
    assert f"Discarded pending batch 2 (deleted {path}). The committed checkpoints (batch 1) are unchanged." in done.output
    assert not path.exists()


def test_the_prompt_says_why_nothing_will_be_deleted(store, kinesis, moto_endpoint, root, victim, interactive):
    plant(store, kinesis, str(victim))
    result = invoke(moto_endpoint, store, "rewind", "--to", "TRIM_HORIZON", "--discard-pending", "--output-path",
                    str(root), "--json", input="n\n")  # fmt: skip
    assert result.exit_code == 1 and result.stdout == ""  # the prompt went to stderr
    assert (f"Discard pending batch 2 (would delete nothing: the stored plan names {str(victim)!r}, not the batch's "
            f"directory under the output root {root}/batch_id=2; {CHECK_WRITER}) and set the checkpoints of 2 shards? "
            "[y/N]") in result.stderr  # fmt: skip


def test_values_from_the_table_cannot_drive_the_terminal(store, kinesis, moto_endpoint, root):
    plant(store, kinesis, "/srv/out\x1b[2K\rnothing to see", owner="run\x1b]0;pwned\x07")
    result = invoke(moto_endpoint, store, "discard-pending", "--output-path", str(root), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\r" not in result.output and "\x07" not in result.output
    assert "held by run\\x1b]0;pwned\\x07" in result.stdout


def test_a_pending_batch_without_discard_names_the_cli_flag(store, kinesis, moto_endpoint):
    plant(store, kinesis, "/nowhere/batch_id=2")
    for extra in (["--dry-run"], ["--yes"]):
        result = invoke(moto_endpoint, store, "rewind", "--to", "TRIM_HORIZON", *extra)
        assert result.exit_code == 1, result.output
        assert "Error: CheckpointConflictError: consumer 'lake' has pending batch 2 (held by crashed-run)" in result.output
        assert "rewind with --discard-pending to drop it first (with --output-path, also its output directory)" in result.output
        assert "discard_pending=True" not in result.output and "output_path" not in result.output  # no operator argument
    assert store.head().pending_batch_id == 2 and store.head().committed_batch_id == 1


# -- discard-pending: the batch only, never a live one ----------------------------------------------


def test_discard_pending_keeps_the_committed_checkpoints(store, kinesis, moto_endpoint, root):
    before, head = store.committed_checkpoints(), store.head()
    plant(store, kinesis, f"{root}/batch_id=2")
    result = invoke(moto_endpoint, store, "discard-pending", "--output-path", str(root), "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["discarded_batch_id"] == 2
    after = store.head()
    assert after.pending_batch_id is None and after.committed_batch_id == head.committed_batch_id == 1
    assert store.committed_checkpoints() == before
    _, _, records = run_batch_without_spark(kinesis, store, batch_id=2)  # planned anew from the same checkpoints
    assert sorted(r.data for r in records) == sorted(f"second {i}".encode() for i in range(10))


def test_discard_pending_refuses_while_a_live_run_holds_the_batch(store, kinesis, moto_endpoint, root):
    path = batch_dir(root)
    plant(store, kinesis, str(path), owner="live-run", live=True)
    result = invoke(moto_endpoint, store, "discard-pending", "--output-path", str(root), "--yes")
    assert result.exit_code == 1, result.output
    assert (f"Error: BatchLeaseHeldError: pending batch 2 of stream {store.stream_name!r}, consumer 'lake' is held by "
            "live-run (last heartbeat ") in result.output  # fmt: skip
    assert f"a live run may be writing {path}. Nothing was discarded or deleted." in result.output
    assert "Pending batch 2 (held by live-run, last heartbeat " in result.stdout  # shown before it is refused
    with pytest.raises(BatchLeaseHeldError, match="held by live-run"):
        discard_op(store, output_path=str(root)).execute({})
    with pytest.raises(BatchLeaseHeldError, match="held by live-run"):  # nor does a rewind drop it
        rewind_op(store, discard_pending=True, output_path=str(root)).execute({})
    head = store.head()
    assert head.pending_batch_id == 2 and head.pending_owner == "live-run" and (path / "part-0.parquet").exists()


def test_a_batch_other_than_the_confirmed_one_is_left_alone(store, kinesis, root):
    from airflow_kinesis_spark.core.admin import discard_pending

    path = batch_dir(root)
    plant(store, kinesis, str(path))
    with pytest.raises(CheckpointConflictError, match="batch 2 is pending now, not batch 3"):
        discard_pending(store, output_path=str(root), owner="test", expected_batch_id=3)
    assert store.head().pending_batch_id == 2 and path.exists()


def test_no_pending_batch_is_nothing_to_discard(store, moto_endpoint):
    result = invoke(moto_endpoint, store, "discard-pending", "--yes")
    assert result.exit_code == 0, result.output
    assert f"No pending batch of {store.stream_name} / lake (committed batch 1): nothing to discard." in result.stdout
    result = discard_op(store, dry_run=True).execute({})
    assert result["discarded_batch_id"] is None and result["discarded_output"] is None and result["committed_batch_id"] == 1


def test_the_discard_operator_templates_its_names_and_output_path():
    from airflow_kinesis_spark.operators.checkpoints import KinesisDiscardPendingBatchOperator

    assert set(KinesisDiscardPendingBatchOperator.template_fields) == {
        "stream_name", "consumer_name", "checkpoint_table", "output_path", "aws_conn_id", "region_name", "verify",
    }  # fmt: skip
    assert "output_path" in KinesisCheckpointRewindOperator.template_fields


def test_a_lease_that_expires_lets_the_batch_go(store, kinesis, root):
    """The lease is the consumer's: with a short one, a holder silent for longer is not alive."""
    from airflow_kinesis_spark.core.admin import discard_pending

    path = batch_dir(root)
    plant(store, kinesis, str(path), owner="stopped-run", live=True)
    time.sleep(0.3)
    result = discard_pending(store, output_path=str(root), owner="test", lease_seconds=0.2)
    assert result["discarded_batch_id"] == 2 and result["holder"] == "stopped-run" and not path.exists()
