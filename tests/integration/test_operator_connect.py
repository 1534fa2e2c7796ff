"""KinesisToSparkOperator over Spark Connect: the same exactly-once batches without a JVM start."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from datetime import datetime, timedelta, timezone

import pyarrow.parquet as pq
import pytest

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.hooks.spark_submit import BatchSparkSubmitHook
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings
from demo.producer import put_aggregated, put_plain, verify
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def connections(monkeypatch, moto_endpoint, spark_connect_endpoint):
    host, port = spark_connect_endpoint
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": TEST_ACCESS_KEY, "password": TEST_SECRET_KEY,
        "extra": {"region_name": REGION, "endpoint_url": moto_endpoint}}))  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_TEST", json.dumps({"conn_type": "spark_connect", "host": host, "port": port}))
    monkeypatch.setattr(BatchSparkSubmitHook, "submit", lambda *a, **k: pytest.fail("spark-submit must not run"))



def consumer_session_id(stream: str, consumer: str) -> str:
    """The reusable server session id the operator derives for (stream, consumer) with this
    checkout's package zip (no py_files)."""
    from airflow_kinesis_spark.hooks.spark_connect import artifacts_digest, connect_session_id, session_secret
    from airflow_kinesis_spark.hooks.spark_package import core_zip

    with tempfile.TemporaryDirectory() as tmp:
        digest = artifacts_digest([core_zip(tmp)])
    return connect_session_id(session_secret(), "KinesisToSparkOperator", stream, consumer, digest)


def test_batches_over_spark_connect(connections, kinesis, dynamodb, unique_name, tmp_path, capfd, monkeypatch):
    from pyspark import cloudpickle


    from airflow_kinesis_spark import job

    shipped: list[bytes] = []
    job_run = job.run

    def spy(spark, plan, transform, aws_env, options, location=None):  # what goes to the server: the pickled read function and its arguments
        shipped.append(cloudpickle.dumps(job.make_reader_function(plan["stream_name"], aws_env, options)))
        shipped.append(json.dumps([plan, aws_env, options]).encode())
        return job_run(spark, plan, transform, aws_env, options, location)

    monkeypatch.setattr(job, "run", spy)
    create_stream(kinesis, unique_name, 2)
    window_start = datetime.now(timezone.utc) - timedelta(seconds=1)
    produced = put_plain(kinesis, unique_name, [(f"10.1.1.{i % 9}", f"line {i}".encode()) for i in range(120)])
    produced += put_aggregated(kinesis, unique_name, [(f"10.1.1.{i % 4}", f"agg {i}".encode()) for i in range(80)])
    output = tmp_path / "out"

    def run():
        return KinesisToSparkOperator(
            task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
            output_path=str(output), spark_settings=SparkSettings(conn_id="spark_connect_test"), read_options=ReadOptions(min_call_interval=0.0),
            transform="airflow_kinesis_spark.transforms.apache_log:parse_combined_log",
        ).execute({})  # fmt: skip

    first = run()
    assert first["status"] == "committed" and first["records"] == 200
    produced += put_plain(kinesis, unique_name, [("k", b"late")])
    second = run()
    assert second["batch_id"] == 2 and second["records"] == 1
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    rows = []
    for batch_id in (1, 2):
        t = pq.read_table(output / f"batch_id={batch_id}", columns=["shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data", "log_parsed"])
        rows.extend(zip(*t.to_pydict().values(), strict=True))
    assert verify(produced, [r[:5] for r in rows]).ok and store.head().committed_batch_id == 2
    assert "log_parsed" in pq.read_schema(next((output / "batch_id=1").glob("*.parquet"))).names
    # Handed over in the store like every job: this process's driver claimed each batch and recorded its report.
    assert re.fullmatch(r".+/driver-[0-9a-f]{12}", store.head().committed_report_owner or ""), store.head()
    # A window over Spark Connect goes through its checkpoint table too (its plan and report are window items).
    time.sleep(0.01)
    window = KinesisWindowToSparkOperator(
        task_id="window", stream_name=unique_name, checkpoint_table=f"{unique_name}_t", output_path=str(tmp_path / "windows"),
        window_start=window_start.isoformat(), window_end=datetime.now(timezone.utc).isoformat(), time_slices=2,
        spark_settings=SparkSettings(conn_id="spark_connect_test"), read_options=ReadOptions(min_call_interval=0.0),
    ).execute({})  # fmt: skip
    assert window["status"] == "written" and window["records"] == len(produced)
    t = pq.read_table(window["output_path"], columns=["shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data"])
    assert verify(produced, list(zip(*t.to_pydict().values(), strict=True))).ok
    captured = capfd.readouterr()
    assert TEST_SECRET_KEY not in captured.out + captured.err
    # only scoped temporary credentials reach the server, never the connection's long-lived keys
    assert len(shipped) == 6 and b"AWS_SESSION_TOKEN" in shipped[1]
    assert all(TEST_SECRET_KEY.encode() not in blob and TEST_ACCESS_KEY.encode() not in blob for blob in shipped)
    # the process is not left marked as a Spark Connect client (a later spark-submit would fail)
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ and "SPARK_REMOTE" not in os.environ


def test_a_batch_whose_observed_metrics_the_server_dropped_is_read_again_in_the_same_task(
    connections, kinesis, dynamodb, unique_name, tmp_path, capfd, caplog, monkeypatch
):
    """SPARK-54279: a busy Spark Connect server drops a query's observed metrics (seen in make
    test's runs on a loaded machine: the task failed and only its retry committed). The first
    one-pass read here loses them as the server would; the job reads the batch again through the
    cache, in the same task, and the batch commits exactly once."""
    from airflow_kinesis_spark.job import batch as job_batch
    from airflow_kinesis_spark.job.reports import ObservedMetricsLostError

    real = job_batch._observed_reports
    dropped: list[str] = []

    def drops_the_first(observation, data, name):
        reports = real(observation, data, name)  # the write ran and its metrics came back...
        if not dropped:
            dropped.append(name)  # ...and are dropped, as a busy server drops them
            raise ObservedMetricsLostError(f"observed metric {name}: dropped by the test")
        return reports

    monkeypatch.setattr(job_batch, "_observed_reports", drops_the_first)
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"line {i}".encode()) for i in range(60)])
    output = tmp_path / "out"
    summary = KinesisToSparkOperator(
        task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
        output_path=str(output), spark_settings=SparkSettings(conn_id="spark_connect_test"), read_options=ReadOptions(min_call_interval=0.0),
    ).execute({})  # fmt: skip
    assert dropped and summary["status"] == "committed" and summary["records"] == 60
    t = pq.read_table(output / "batch_id=1", columns=["shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data"])
    assert verify(produced, list(zip(*t.to_pydict().values(), strict=True))).ok  # no row twice after the second write
    captured = capfd.readouterr()
    logs = caplog.text + captured.out + captured.err
    assert "Reading the batch again through a cache (its output is overwritten)" in logs


def test_a_consumer_keeps_its_server_session_and_survives_losing_it(connections, kinesis, unique_name, tmp_path, caplog, capfd):
    """With ``SparkSettings(connect_reuse_session=True)`` (opt-in) warm batches re-use one server session
    per consumer, whose conf holds no credential and nothing that names the provider; a session
    the server dropped is replaced."""
    import logging

    from pyspark.sql import SparkSession

    from airflow_kinesis_spark.hooks.spark_connect import with_session_id

    caplog.set_level(logging.INFO)
    create_stream(kinesis, unique_name, 1)
    output = tmp_path / "out"

    def run():
        return KinesisToSparkOperator(
            task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
            output_path=str(output), spark_settings=SparkSettings(conn_id="spark_connect_test", connect_reuse_session=True),
            read_options=ReadOptions(min_call_interval=0.0),
        ).execute({})  # fmt: skip

    put_plain(kinesis, unique_name, [("k", b"one")])
    assert run()["records"] == 1
    put_plain(kinesis, unique_name, [("k", b"two")])
    assert run()["records"] == 1
    logs = caplog.text + "".join(capfd.readouterr())
    assert "Running the Spark job of batch 2" in logs and "not reusable" not in logs
    # The kept session, read back: its conf holds no credential and nothing that names the provider.
    session_id = consumer_session_id(unique_name, "lake")
    conn = json.loads(os.environ["AIRFLOW_CONN_SPARK_CONNECT_TEST"])
    url = with_session_id(f"sc://{conn['host']}:{conn['port']}", session_id)
    kept = SparkSession.builder.remote(url).getOrCreate()
    kept.release_session_on_close = False
    assert kept.range(1).count() == 1  # a session the server has (a closed one would refuse)
    state = json.dumps(kept.conf.getAll)
    kept.stop()
    assert TEST_SECRET_KEY not in state and TEST_ACCESS_KEY not in state
    assert "airflow_kinesis_spark" not in state and "artifacts_sha256" not in state
    # Release the consumer's session as another client could; the next batch must still run.
    other = SparkSession.builder.remote(url).getOrCreate()
    other.stop()  # releases it on the server
    for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):  # set by this test's own client
        os.environ.pop(key, None)
    put_plain(kinesis, unique_name, [("k", b"three")])
    assert run()["records"] == 1
    assert "not reusable" in caplog.text + "".join(capfd.readouterr())
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ


def test_a_new_package_version_gets_its_own_reusable_session(connections, kinesis, unique_name, tmp_path, caplog, capfd, monkeypatch):
    """After an upgrade (another package zip under the same name) the consumer's batches keep one
    warm session (``SparkSettings(connect_reuse_session=True)``): a new one for the new version, re-used
    from then on (before: the old session refused the zip, ARTIFACT_ALREADY_EXISTS, and every
    batch started a fresh session)."""
    import logging
    import zipfile

    from airflow_kinesis_spark.hooks import spark_connect

    caplog.set_level(logging.INFO)
    create_stream(kinesis, unique_name, 1)

    def run():
        return KinesisToSparkOperator(
            task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
            output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_connect_test", connect_reuse_session=True),
            read_options=ReadOptions(min_call_interval=0.0),
        ).execute({})  # fmt: skip

    put_plain(kinesis, unique_name, [("k", b"one")])
    assert run()["records"] == 1
    original = spark_connect.core_zip

    def upgraded_zip(directory: str) -> str:  # the same name, other contents
        path = original(directory)
        with zipfile.ZipFile(path, "a") as zf:
            zf.writestr("airflow_kinesis_spark/_upgraded.py", "VERSION = 2\n")
        return path

    monkeypatch.setattr(spark_connect, "core_zip", upgraded_zip)  # where the Connect runner looks it up
    caplog.clear()
    capfd.readouterr()
    for data in (b"two", b"three"):
        put_plain(kinesis, unique_name, [("k", data)])
        assert run()["records"] == 1
    assert "not reusable" not in caplog.text + "".join(capfd.readouterr())


PLANTED_BOTO3 = """
import json


class _Session:
    def __init__(self, **kwargs):
        with open({capture!r}, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(kwargs) + "\\n")
        raise RuntimeError("planted boto3")


class session:
    Session = _Session
"""


def test_a_client_that_precreates_the_consumers_session_gets_no_credential(connections, kinesis, dynamodb, unique_name, tmp_path):
    """The attack of the security review: another client of the shared Connect server creates the
    session id the consumer would use (earlier versions derived it from the stream and consumer
    names) and plants a ``boto3`` artifact that records the credentials the job's readers use."""
    import uuid

    from pyspark.sql import SparkSession

    from airflow_kinesis_spark.hooks.spark_connect import with_session_id

    capture = tmp_path / "stolen.jsonl"
    planted = tmp_path / "attacker" / "boto3.py"
    planted.parent.mkdir()
    planted.write_text(PLANTED_BOTO3.format(capture=str(capture)))
    conn = json.loads(os.environ["AIRFLOW_CONN_SPARK_CONNECT_TEST"])
    url = f"sc://{conn['host']}:{conn['port']}"
    old_derivation = str(uuid.uuid5(uuid.UUID("6d2f3c1e-8a4b-4f0e-9c57-1b2a3d4e5f60"), f"KinesisToSparkOperator/{unique_name}/lake"))
    attacker = SparkSession.builder.remote(with_session_id(url, old_derivation)).getOrCreate()
    attacker.release_session_on_close = False
    attacker.addArtifacts(str(planted), pyfile=True)
    attacker.stop()
    for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):  # set by the attacker's client in this process
        os.environ.pop(key, None)

    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"secret payload")])
    summary = KinesisToSparkOperator(
        task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
        output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_connect_test"), read_options=ReadOptions(min_call_interval=0.0),
    ).execute({})  # fmt: skip
    assert summary["status"] == "committed" and summary["records"] == 1
    assert not capture.exists(), "the planted module ran in the consumer's batch"


def test_credentials_are_not_sent_to_a_plaintext_remote_connect_server(monkeypatch, aws_conn, kinesis, unique_name, tmp_path):
    """A non-loopback server without TLS is refused before any connection is made (``.invalid``
    never resolves, so even a regression would send nothing anywhere)."""
    from airflow_kinesis_spark.hooks import spark_connect as runners

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_REMOTE", json.dumps({"conn_type": "spark_connect", "host": "spark-connect.invalid", "port": 15002}))
    monkeypatch.setattr(runners, "check_spark_connect", lambda *a: pytest.fail("no connection may be attempted"))
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    operator = KinesisToSparkOperator(
        task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
        output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_remote"), read_options=ReadOptions(min_call_interval=0.0),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"Refusing to send AWS credentials to the Spark Connect server sc://spark-connect.invalid:15002.*'use_ssl': true"):
        operator.execute({})
    # TLS (use_ssl) passes the check; the connection attempt is then made (here: refused by the stub).
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_REMOTE", json.dumps({"conn_type": "spark_connect", "host": "spark-connect.invalid", "port": 15002,
                                                                "extra": {"use_ssl": True}}))  # fmt: skip
    with pytest.raises(BaseException, match="no connection may be attempted"):
        KinesisToSparkOperator(
            task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
            output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_remote"), read_options=ReadOptions(min_call_interval=0.0),
        ).execute({})  # fmt: skip


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_connect_server_that_stops_answering_mid_job_fails_the_task_within_its_deadline(
    how, monkeypatch, moto_endpoint, kinesis, dynamodb, unique_name, tmp_path, caplog
):
    """A Spark Connect server killed (``kill -9``) or frozen (``SIGSTOP``) while its job reads:
    PySpark's client retries an unreachable server for about 10 minutes and waits on a frozen one
    for ever, while the task renews the batch's lease. With the connection's
    ``unresponsive_timeout`` the task fails within that many seconds (and one check) of the last
    answer, with an ERROR line naming the server (host:port), and the lease is released: another
    run takes the batch over at once.

    The job is caught mid-read: a proxy in front of moto holds the server's first ``GetRecords``
    (armed when the job starts, after the worker's probes) and the server is stopped then."""
    import logging
    import signal
    import threading
    import time

    import psutil

    from demo.stack import spark_connect_server
    from tests.reliability.fault_proxy import FaultProxy

    deadline = 12.0
    caplog.set_level(logging.INFO, logger="airflow_kinesis_spark")
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(f"k{i}", f"v{i}".encode()) for i in range(10)])
    proxy = FaultProxy(moto_endpoint).start()
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": TEST_ACCESS_KEY, "password": TEST_SECRET_KEY,
        "extra": {"region_name": REGION, "endpoint_url": proxy.endpoint}}))  # fmt: skip
    from airflow_kinesis_spark import job

    job_run = job.run

    def armed(*args, **kwargs):  # the server's first GetRecords is held once the job runs
        proxy.hold = ("GetRecords", "", "before")
        return job_run(*args, **kwargs)

    monkeypatch.setattr(job, "run", armed)
    with spark_connect_server(cores=1) as (host, port):
        (pid,) = {c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DOWN", json.dumps(
            {"conn_type": "spark_connect", "host": host, "port": port, "extra": {"unresponsive_timeout": deadline}}))  # fmt: skip
        outcome: dict[str, object] = {}

        def task() -> None:
            try:
                outcome["summary"] = KinesisToSparkOperator(
                    task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
                    output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_connect_down"), read_options=ReadOptions(min_call_interval=0.0),
                ).execute({})  # fmt: skip
            except BaseException as err:  # noqa: BLE001 - the outcome is asserted below
                outcome["error"] = err

        running = threading.Thread(target=task, daemon=True)
        running.start()
        try:
            assert proxy.held.wait(240), f"the job never read through the proxy: {outcome}"
            os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
            stopped_at = time.monotonic()
            running.join(deadline + 45)
            waited = time.monotonic() - stopped_at
            assert not running.is_alive(), f"the task still runs {waited:.0f} s after its Connect server was {how}"
        finally:
            os.kill(pid, signal.SIGKILL)  # a stopped JVM would not act on the server's SIGTERM
            proxy.stop()
            for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):  # in case the task did not restore them
                os.environ.pop(key, None)
    # within the deadline from the last answer, plus one check (at most 5 s apart, 5 s each) and the release
    assert waited < deadline + 15, waited
    error = outcome.get("error")
    assert isinstance(error, TimeoutError), outcome
    assert f"sc://{host}:{port}" in str(error) and "unresponsive_timeout" in str(error)
    given_up = [r for r in caplog.records if r.name == "airflow_kinesis_spark.hooks.spark" and r.levelno == logging.ERROR]
    assert len(given_up) == 1 and f"sc://{host}:{port}" in given_up[0].getMessage(), [r.getMessage() for r in given_up]
    assert f"{deadline:g} s" in given_up[0].getMessage()
    # the lease was released when the job was given up: another run takes the batch over at once
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    head = store.head()
    assert head.pending_batch_id == 1 and head.pending_heartbeat == 0 and head.committed_batch_id == 0, head
    assert store.take_over(1, "retry-run", 60.0).pending_owner == "retry-run"
