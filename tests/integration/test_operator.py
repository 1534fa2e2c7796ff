"""KinesisToSparkOperator end to end: real spark-submit, moto / kinesalite over HTTP."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from pathlib import Path

import pytest
from airflow.providers.apache.spark.hooks import spark_submit as spark_submit_module
from airflow.sdk.exceptions import AirflowFailException

from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import StreamNotFoundError
from airflow_kinesis_spark.hooks.spark_logs import log4j_config_path
from airflow_kinesis_spark.hooks.spark_submit import BatchSparkSubmitHook
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings
from demo.producer import committed_rows, put_aggregated, put_plain, put_raw, verify
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

FAILING_TRANSFORM = Path(__file__).resolve().parents[1] / "spark" / "failing_transform.py"


def environ_after_exec(pid: int) -> dict[str, str]:
    """``/proc/PID/environ`` once the wrappers (``hooks.spark_submit.write_wrapper``'s script, then
    ``die_with_parent``) have exec'd spark-submit and it has exec'd the JVM."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
        # the shell wrapper (a file named spark-submit-*), die_with_parent, spark-submit, spark-class
        # and the JVM replace one another in this process; the JVM's main class is the last of them
        if b"org.apache.spark.deploy.SparkSubmit" in cmdline:
            break
        time.sleep(0.005)
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item)


@pytest.fixture
def spark_calls(monkeypatch):
    """Record every spark-submit: command line and environment."""
    calls: list[dict] = []
    original = BatchSparkSubmitHook.submit
    real_popen = subprocess.Popen

    def submit(self, application: str = "", **kwargs):
        calls.append({"cmd": self._build_spark_submit_command(application), "env": dict(self._env or {})})
        return original(self, application, **kwargs)

    def popen(*args, **kwargs):  # the environment the spark-submit process really runs with
        process = real_popen(*args, **kwargs)
        if calls and args and list(args[0]) == calls[-1]["cmd"]:
            calls[-1]["process_env"] = environ_after_exec(process.pid)
        return process

    monkeypatch.setattr(BatchSparkSubmitHook, "submit", submit)
    monkeypatch.setattr(spark_submit_module.subprocess, "Popen", popen)
    return calls


def operator(name: str, output: Path, **kwargs) -> KinesisToSparkOperator:
    return KinesisToSparkOperator(
        task_id=f"ingest_{name}",
        stream_name=name,
        consumer_name="tests",
        checkpoint_table=f"{name}_ckpt",
        output_path=str(output),
        read_options=ReadOptions(min_call_interval=0.0),
        **kwargs,
    )


@pytest.mark.parametrize("kinesis_emulator", ["moto", "kinesalite"])
def test_batches_are_exactly_once_and_leak_no_credentials(
    kinesis_emulator, request, aws_conn, spark_calls, dynamodb, tmp_path, unique_name, kpl_vectors, caplog, capfd
):
    caplog.set_level(logging.INFO)
    if kinesis_emulator == "kinesalite":
        aws_conn(request.getfixturevalue("kinesalite_endpoint"))
        kinesis = request.getfixturevalue("kinesalite")
    else:
        kinesis = request.getfixturevalue("kinesis")
    create_stream(kinesis, unique_name, 3)
    lines = [(f"10.0.0.{i % 7}", f"line {i}".encode()) for i in range(300)]
    produced = put_plain(kinesis, unique_name, lines[:150]) + put_aggregated(kinesis, unique_name, lines[150:])
    produced += put_raw(
        kinesis, unique_name,
        [(v["partition_key"], v["data"], [(u["sub_sequence_number"], u["partition_key"], u["data"].encode())
                                         for u in v["expected_user_records"]]) for v in kpl_vectors],
    )  # fmt: skip
    output = tmp_path / "out"
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "tests")

    first = operator(unique_name, output).execute({})
    assert first["status"] == "committed" and first["batch_id"] == 1
    assert first["records"] == len(produced) == 317

    more = put_aggregated(kinesis, unique_name, [(f"k{i}", f"more {i}".encode()) for i in range(40)])
    second = operator(unique_name, output).execute({})
    assert second["batch_id"] == 2 and second["records"] == 40

    verdict = verify(produced + more, committed_rows(output, store.head().committed_batch_id))
    assert verdict.ok, verdict

    # An idle run: no Spark job, no files, no batch.
    third = operator(unique_name, output).execute({})
    assert third["status"] == "no_new_records" and third["batch_id"] is None
    assert len(spark_calls) == 2
    assert sorted(p.name for p in output.iterdir()) == ["_committed", "_kinesis_spark_output.json", "batch_id=1", "batch_id=2"]
    assert sorted(p.parent.name for p in (output / "_committed").glob("*/manifest")) == ["batch_id=1", "batch_id=2"]
    assert all((output / f"batch_id={n}" / "_SUCCESS").exists() for n in (1, 2))  # written after each commit
    assert store.head().committed_batch_id == 2

    # Credentials reach Spark through the environment only, and they are temporary (scoped by a
    # session policy from GetFederationToken): the connection's long-lived keys never leave the worker.
    for call in spark_calls:
        assert call["env"]["AWS_SESSION_TOKEN"] and call["env"]["AWS_ACCESS_KEY_ID"] != TEST_ACCESS_KEY
        # the whole environment of the Spark processes: not even the worker's AIRFLOW_CONN_AWS_DEFAULT
        process_env = {k.decode(): v.decode() for k, v in call["process_env"].items()}
        assert process_env["AWS_SESSION_TOKEN"] == call["env"]["AWS_SESSION_TOKEN"]
        leaked = sorted(k for k, v in process_env.items() if TEST_SECRET_KEY in v or TEST_ACCESS_KEY in v)
        assert leaked == [], leaked
        assert TEST_SECRET_KEY not in " ".join(call["cmd"]) and TEST_ACCESS_KEY not in " ".join(call["cmd"])
    items = dynamodb.scan(TableName=f"{unique_name}_ckpt")["Items"]
    stored = json.dumps(items)
    assert "BATCH#" in stored and TEST_SECRET_KEY not in stored and TEST_ACCESS_KEY not in stored
    for summary in (first, second, third):
        assert TEST_SECRET_KEY not in json.dumps(summary) and TEST_ACCESS_KEY not in json.dumps(summary)
    captured = capfd.readouterr()
    logs = caplog.text + captured.out + captured.err
    assert "Spark-Submit cmd" in logs and "Batch 2 committed" in logs  # the operator's and the hook's logs
    assert TEST_SECRET_KEY not in logs and TEST_ACCESS_KEY not in logs
    # Spark's own INFO is off (issue 17): the job's log4j 2 configuration goes with it, none of
    # Spark's INFO lines reach the task log, the job's own lines do; its temporary directory is gone.
    for call in spark_calls:
        java_options = [c for c in call["cmd"] if c.startswith("spark.driver.extraJavaOptions=")]
        assert java_options and java_options[0].endswith("-Dlog4j2.configurationFile=" + log4j_config_path()), call["cmd"]
        core = call["cmd"][call["cmd"].index("--py-files") + 1].split(",")[0]
        assert Path(core).name == "airflow_kinesis_spark_core.zip" and not Path(core).parent.exists()
    assert "INFO airflow_kinesis_spark.core.job: batch 2 claimed by" in logs
    assert not re.search(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO ", logs), re.findall(r".*\d\d:\d\d:\d\d INFO .*", logs)[:5]
    assert "Using Spark's default log4j profile" not in logs


def test_failed_spark_job_is_rerun_from_the_same_plan(aws_conn, spark_calls, kinesis, dynamodb, tmp_path, unique_name):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"p{i}", f"r{i}".encode()) for i in range(120)])
    output = tmp_path / "out"
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "tests")

    failing = operator(unique_name, output, transform="failing_transform:explode",
                       spark_settings=SparkSettings(py_files=str(FAILING_TRANSFORM)))
    # The error names the driver's exception first (class and message), not stack frames.
    with pytest.raises(RuntimeError, match=r"(?s)^The Spark job of batch 1 failed: RuntimeError: injected failure in the user "
                                           r"transform \(spark connection .*plan stays pending"):
        failing.execute({})
    head = store.head()
    assert head.committed_batch_id == 0 and head.pending_batch_id == 1
    assert store.committed_checkpoints() == {}
    pending = store.pending_plan()

    # Records arriving after the failure are not in the re-used plan: same plan, same records.
    late = put_plain(kinesis, unique_name, [(f"q{i}", f"late{i}".encode()) for i in range(30)])
    # The plan was made with the transform: a retry without it is refused, naming the difference.
    with pytest.raises(AirflowFailException, match=r"transform: the plan has 'failing_transform:explode', this task has "
                                                   r"None \(set by transform\)"):  # fmt: skip
        operator(unique_name, output).execute({})
    # The transform is fixed in its module (same module:function): the retry re-uses the plan.
    fixed = tmp_path / "fixed" / "failing_transform.py"
    fixed.parent.mkdir()
    fixed.write_text("def explode(df):\n    return df\n")
    retry = operator(unique_name, output, transform="failing_transform:explode",
                     spark_settings=SparkSettings(py_files=str(fixed))).execute({})
    assert retry["reused_plan"] is True and retry["batch_id"] == 1 and retry["records"] == 120
    assert store.committed_checkpoints() != {}
    assert verify(produced, committed_rows(output, store.head().committed_batch_id)).ok
    assert pending is not None and format_timestamp(pending.cutoff) == retry["cutoff"]

    nxt = operator(unique_name, output).execute({})
    assert nxt["batch_id"] == 2 and nxt["records"] == 30
    assert verify(produced + late, committed_rows(output, store.head().committed_batch_id)).ok


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_records_per_shard": -5}, "max_records_per_shard must be a positive integer"),
        ({"max_bytes_per_shard": 0}, "max_bytes_per_shard must be a positive integer"),
        ({"transform": "not a transform path"}, "is not of the form 'package.module:function'"),
        ({"transform": "no_such_module_xyz:parse"}, "module 'no_such_module_xyz' does not import"),
        ({"transform": "airflow_kinesis_spark.transforms.apache_log:no_such_function"}, "has no function 'no_such_function'"),
        ({"transform": "json:loads"}, "is in Python's standard library"),
        ({"initial_position": "EARLIEST"}, "initial_position must be one of"),
        ({"consumer_name": "bad consumer!"}, "consumer_name 'bad consumer!' is not valid"),
    ],
)
def test_bad_arguments_fail_before_any_io(kwargs, message, aws_conn, kinesis, dynamodb, tmp_path, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"x")])
    args = {"task_id": "t", "stream_name": unique_name, "consumer_name": "tests",
            "checkpoint_table": f"{unique_name}_ckpt", "output_path": str(tmp_path / "o")} | kwargs  # fmt: skip
    with pytest.raises(ValueError, match=message):
        KinesisToSparkOperator(**args).execute({})
    assert f"{unique_name}_ckpt" not in [t for page in dynamodb.get_paginator("list_tables").paginate() for t in page["TableNames"]]


def test_unwritable_output_path_fails_before_any_io(aws_conn, kinesis, dynamodb, tmp_path, unique_name):
    create_stream(kinesis, unique_name, 1)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="cannot be written: .* is a file, not a directory"):
        operator(unique_name, blocker / "out").execute({})
    assert f"{unique_name}_ckpt" not in [t for page in dynamodb.get_paginator("list_tables").paginate() for t in page["TableNames"]]


def test_missing_stream_names_stream_region_and_endpoint(aws_conn, moto_endpoint, dynamodb, tmp_path, unique_name):
    with pytest.raises(StreamNotFoundError) as err:
        operator(unique_name, tmp_path / "out").execute({})
    text = str(err.value)
    assert unique_name in text and REGION in text and moto_endpoint in text
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "tests")
    head = store.head()
    assert head.committed_batch_id == 0 and head.pending_batch_id is None


def test_an_output_path_the_worker_cannot_read_fails_before_planning(aws_conn, kinesis, dynamodb, tmp_path, unique_name):
    """A URI scheme the worker has no file system for: the output's owner record (and later its
    committed records) cannot be read, so the run fails before it plans or starts Spark."""
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"x"), ("k", b"y")])
    with pytest.raises(ValueError, match="handles local paths, file:// and s3://"):
        operator(unique_name, "nosuchfs://bucket/out").execute({})
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "tests")
    assert store.committed_checkpoints() == {} and store.head().pending_batch_id is None
