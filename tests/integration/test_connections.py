"""The ``aws``, ``spark`` and ``spark_connect`` connections as users configure them, against moto and kinesalite.

Region from the extra, ``role_arn`` assume-role (moto's STS), an endpoint per service,
``config_kwargs`` reaching the clients, and connections that point nowhere failing within
seconds with a message naming the connection, the service and the endpoint.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import boto3
import pytest
from airflow_kinesis_spark.core.admin import CHECK_ATTEMPTS
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import EndpointUnreachableError, StreamNotFoundError
from airflow_kinesis_spark.hooks.dynamodb import DynamoDBCheckpointHook
from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook
from airflow_kinesis_spark.hooks.spark_submit import BatchSparkSubmitHook
from airflow_kinesis_spark.hooks import spark_connect
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import SparkSettings
from demo.producer import put_plain
from demo.stack import free_port
from tests.conftest import TEST_ACCESS_KEY, TEST_SECRET_KEY, aws_connection, create_stream
from tests.helpers import run_batch_without_spark

pytestmark = pytest.mark.integration

ROLE_ARN = "arn:aws:iam::123456789012:role/kinesis-to-spark"
#: What "fails fast" means here: well below botocore's 60 s connect timeout times its retries.
FAST = 8.0


def connect(monkeypatch, conn_id: str, endpoint: str, **extra: object) -> str:
    """Define ``aws`` connection ``conn_id`` (as ``AIRFLOW_CONN_*``) and return its id."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", aws_connection(endpoint, **extra))
    return conn_id


#: The sockets that hold the ports of :func:`closed_endpoint` (bound for the rest of the session).
_HELD_PORTS: list[socket.socket] = []


def closed_endpoint() -> str:
    """An endpoint on 127.0.0.1 that nothing listens on: connections are refused. The port stays
    bound (not listening) by this process, so no server of a test running in parallel can take it
    between the test's two calls (a free port alone did: the fail-fast check then met that server
    and passed, and the call after it failed with botocore's error)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(held)
    return f"http://127.0.0.1:{held.getsockname()[1]}"


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint that accepts TCP connections and never answers (a hung proxy or service)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    for conn in accepted:
        conn.close()
    server.close()


def seconds(func) -> tuple[float, BaseException | None]:
    """How long ``func()`` took, and what it raised."""
    start = time.monotonic()
    try:
        func()
    except BaseException as err:  # noqa: BLE001 - returned to the test
        return time.monotonic() - start, err
    return time.monotonic() - start, None


# -- (a) region from the extra -----------------------------------------------------------------


def test_region_comes_from_the_connection_extra(monkeypatch, moto_endpoint, unique_name):
    conn_id = connect(monkeypatch, "aws_eu", moto_endpoint, region_name="eu-west-1")
    eu = boto3.client("kinesis", endpoint_url=moto_endpoint, region_name="eu-west-1",
                      aws_access_key_id=TEST_ACCESS_KEY, aws_secret_access_key=TEST_SECRET_KEY)  # fmt: skip
    create_stream(eu, unique_name, 2)  # moto keeps each region apart: the stream exists in eu-west-1 only
    hook = KinesisStreamHook(aws_conn_id=conn_id)
    assert hook.conn.meta.region_name == "eu-west-1"
    assert len(hook.list_shards(unique_name)) == 2
    assert hook.spark_environment()["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert DynamoDBCheckpointHook(aws_conn_id=conn_id).conn.meta.region_name == "eu-west-1"
    # an operator's region_name overrides the extra
    with pytest.raises(StreamNotFoundError, match="in region 'us-east-1'"):
        KinesisStreamHook(aws_conn_id=conn_id, region_name="us-east-1").list_shards(unique_name)


def test_the_hooks_sessions_share_botocore_data_loader(monkeypatch, moto_endpoint, kinesis, unique_name):
    """botocore parses its data files (endpoints.json, service models) once per loader: the hooks
    of one process share one loader, whatever their connection and region, and still call the
    region and endpoint of their own connection."""
    us = connect(monkeypatch, "aws_us", moto_endpoint)
    eu = connect(monkeypatch, "aws_eu", moto_endpoint, region_name="eu-west-1")
    create_stream(kinesis, unique_name, 1)
    hooks = [KinesisStreamHook(aws_conn_id=us), DynamoDBCheckpointHook(aws_conn_id=us), KinesisStreamHook(aws_conn_id=eu)]
    loaders = {id(hook.get_session(region_name=hook.region_name)._session.get_component("data_loader")) for hook in hooks}
    assert len(loaders) == 1
    assert [h.conn.meta.region_name for h in hooks] == ["us-east-1", "us-east-1", "eu-west-1"]
    assert len(hooks[0].list_shards(unique_name)) == 1
    hooks[1].conn.list_tables()
    with pytest.raises(StreamNotFoundError, match="in region 'eu-west-1'"):
        hooks[2].list_shards(unique_name)


# -- (b) role_arn: assume-role through STS ------------------------------------------------------


def test_assume_role_gives_the_hooks_and_the_spark_job_temporary_credentials(monkeypatch, moto_endpoint, kinesis, unique_name):
    # The assume-role call never uses the extra 'endpoint_url' (AwsBaseHook, connection_wrapper:
    # sts_connection_assume); 'service_config' -> 'sts' -> 'endpoint_url' is the supported way.
    conn_id = connect(
        monkeypatch, "aws_role", moto_endpoint, role_arn=ROLE_ARN, assume_role_method="assume_role",
        assume_role_kwargs={"RoleSessionName": "airflow-test"}, service_config={"sts": {"endpoint_url": moto_endpoint}},
    )  # fmt: skip
    create_stream(kinesis, unique_name, 1)
    hook = KinesisStreamHook(aws_conn_id=conn_id)
    identity = hook.get_session().client("sts", endpoint_url=moto_endpoint).get_caller_identity()
    assert identity["Arn"] == "arn:aws:sts::123456789012:assumed-role/kinesis-to-spark/airflow-test"

    signed: list[dict] = []
    hook.conn.meta.events.register("before-send.kinesis.*", lambda request, **_: signed.append(dict(request.headers)))
    assert len(hook.list_shards(unique_name)) == 1
    authorization = signed[-1]["Authorization"]
    authorization = authorization.decode() if isinstance(authorization, bytes) else authorization
    assert "X-Amz-Security-Token" in signed[-1] and f"Credential={TEST_ACCESS_KEY}/" not in authorization

    env = hook.spark_environment(hook.job_credentials(unique_name))
    assert env["AWS_SESSION_TOKEN"] and env["AWS_ACCESS_KEY_ID"] != TEST_ACCESS_KEY
    assert env["AWS_SECRET_ACCESS_KEY"] != TEST_SECRET_KEY
    # the job's credentials come from a second AssumeRole (with the session policy), not the hook's own session
    assert hook.connection_credentials()["AWS_SESSION_TOKEN"] != env["AWS_SESSION_TOKEN"]

    store = DynamoDBCheckpointHook(aws_conn_id=conn_id).get_store(f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    assert store.head().committed_batch_id == 0


# -- (c) an endpoint per service -----------------------------------------------------------------


def test_kinesis_and_dynamodb_on_different_endpoints(monkeypatch, moto_endpoint, kinesalite_endpoint, kinesalite, dynamodb, unique_name):
    conn_id = connect(monkeypatch, "aws_split", moto_endpoint, service_config={"kinesis": {"endpoint_url": kinesalite_endpoint}})
    create_stream(kinesalite, unique_name, 2)  # only kinesalite has the stream
    kinesis_hook, dynamodb_hook = KinesisStreamHook(aws_conn_id=conn_id), DynamoDBCheckpointHook(aws_conn_id=conn_id)
    assert kinesis_hook.conn.meta.endpoint_url == kinesalite_endpoint
    assert dynamodb_hook.conn.meta.endpoint_url == moto_endpoint
    assert len(kinesis_hook.list_shards(unique_name)) == 2
    assert kinesis_hook.spark_environment()["AWS_ENDPOINT_URL_KINESIS"] == kinesalite_endpoint
    store = dynamodb_hook.get_store(f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    assert f"{unique_name}_t" in [t for page in dynamodb.get_paginator("list_tables").paginate() for t in page["TableNames"]]  # the table is in moto

    # a committed batch (kinesalite's 56-digit sequence numbers), listed by the CLI through the connection
    put_plain(kinesalite, unique_name, [(f"k{i}", f"r{i}".encode()) for i in range(6)])
    run_batch_without_spark(kinesis_hook.conn, store, batch_id=1)
    # In its own process, as users run it: with --aws-conn-id the command moves Airflow's logging
    # (which importing Airflow points at stdout) to stderr, for the whole process.
    result = subprocess.run(
        [sys.executable, "-c", "from airflow_kinesis_spark.cli import main; main()", "--aws-conn-id", conn_id,
         "checkpoints", unique_name, "-c", "lake", "-t", store.table_name],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # stdout holds the table only (no log records), readable at 80 columns: nothing cropped or
    # wrapped by the terminal, shard ids never broken
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and not any("[info" in line or "INFO" in line for line in lines)
    assert "shardId-000000000000" in result.stdout and "shardId-000000000001" in result.stdout
    assert "2 shards, 2 readable, 0 with records waiting" in result.stdout


# -- (d) botocore config from the extra -----------------------------------------------------------


def test_config_kwargs_reach_the_clients(monkeypatch, moto_endpoint, kinesis, unique_name):
    retries = {"mode": "standard", "max_attempts": 7}
    conn_id = connect(monkeypatch, "aws_tuned", moto_endpoint,
                      config_kwargs={"connect_timeout": 2, "read_timeout": 9, "retries": retries})  # fmt: skip
    create_stream(kinesis, unique_name, 1)
    for hook in (KinesisStreamHook(aws_conn_id=conn_id), DynamoDBCheckpointHook(aws_conn_id=conn_id)):
        config = hook.conn.meta.config
        # botocore stores max_attempts (retries) as total_max_attempts (the first call included)
        assert (config.connect_timeout, config.read_timeout, config.retries) == (2, 9, {"mode": "standard", "total_max_attempts": 8})
        assert config.signature_version != "unsigned"  # the endpoint check's settings stay out of the client
    assert len(KinesisStreamHook(aws_conn_id=conn_id).list_shards(unique_name)) == 1


# -- (e) connections that point nowhere fail fast ---------------------------------------------------


@pytest.mark.parametrize("service", ["kinesis", "dynamodb"])
def test_a_closed_port_fails_within_seconds_naming_connection_service_and_endpoint(monkeypatch, service):
    endpoint = closed_endpoint()
    conn_id = connect(monkeypatch, "aws_nowhere", endpoint)
    if service == "kinesis":
        took, err = seconds(lambda: KinesisStreamHook(aws_conn_id=conn_id).list_shards("orders"))
        name = "Kinesis"
    else:
        took, err = seconds(lambda: DynamoDBCheckpointHook(aws_conn_id=conn_id).get_store("checkpoints", "orders", "lake").head())
        name = "DynamoDB"
    assert isinstance(err, EndpointUnreachableError), err
    assert took < FAST
    text = str(err)
    assert f"Cannot reach {name} at {endpoint}" in text and "aws connection 'aws_nowhere'" in text
    assert f"'service_config': {{'{service}': {{'endpoint_url'" in text and "region 'us-east-1'" in text
    assert (err.service, err.endpoint) == (name, endpoint)


def test_an_unresolvable_host_fails_fast(monkeypatch):
    conn_id = connect(monkeypatch, "aws_typo", "http://kinesis.invalid:4566")
    took, err = seconds(lambda: KinesisStreamHook(aws_conn_id=conn_id).list_shards("orders"))
    assert isinstance(err, EndpointUnreachableError) and took < FAST
    assert "http://kinesis.invalid:4566" in str(err) and "aws connection 'aws_typo'" in str(err)


def test_an_endpoint_that_never_answers_fails_within_the_read_timeout(monkeypatch, silent_endpoint):
    # the check keeps a connection's lower timeouts: 1 s here instead of the check's 5 s
    conn_id = connect(monkeypatch, "aws_silent", silent_endpoint, config_kwargs={"read_timeout": 1})
    took, err = seconds(lambda: KinesisStreamHook(aws_conn_id=conn_id).list_shards("orders"))
    assert isinstance(err, EndpointUnreachableError), err
    assert took < CHECK_ATTEMPTS * 1 + 3 and "Read timeout" in str(err) and silent_endpoint in str(err)


def test_an_unreachable_sts_endpoint_fails_the_assume_role_fast(monkeypatch, moto_endpoint):
    sts = closed_endpoint()
    conn_id = connect(monkeypatch, "aws_role_nowhere", moto_endpoint, role_arn=ROLE_ARN,
                      service_config={"sts": {"endpoint_url": sts}})  # fmt: skip
    took, err = seconds(lambda: KinesisStreamHook(aws_conn_id=conn_id).list_shards("orders"))
    assert isinstance(err, EndpointUnreachableError) and took < FAST
    text = str(err)
    assert f"Cannot reach STS at {sts}" in text and "aws connection 'aws_role_nowhere'" in text and ROLE_ARN in text
    assert "the assume-role call does not use the extra 'endpoint_url'" in text


def test_the_operator_fails_fast_and_moves_no_checkpoint_when_kinesis_is_unreachable(
    monkeypatch, moto_endpoint, kinesis, dynamodb, unique_name, tmp_path
):
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(10)])
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    run_batch_without_spark(kinesis, store, batch_id=1)
    before = store.committed_checkpoints()
    put_plain(kinesis, unique_name, [("k", b"late")])
    nowhere = closed_endpoint()
    conn_id = connect(monkeypatch, "aws_half", moto_endpoint, service_config={"kinesis": {"endpoint_url": nowhere}})
    monkeypatch.setattr(BatchSparkSubmitHook, "submit", lambda *a, **k: pytest.fail("Spark must not run"))
    op = KinesisToSparkOperator(task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=store.table_name,
                                output_path=str(tmp_path / "out"), aws_conn_id=conn_id)  # fmt: skip
    took, err = seconds(lambda: op.execute({}))
    assert isinstance(err, EndpointUnreachableError) and took < FAST
    assert f"Cannot reach Kinesis at {nowhere}" in str(err)
    head = store.head()
    assert head.committed_batch_id == 1 and head.pending_batch_id is None and store.committed_checkpoints() == before


def test_a_spark_connect_connection_pointing_nowhere_fails_fast_naming_it(
    monkeypatch, aws_conn, kinesis, dynamodb, unique_name, tmp_path
):
    port = free_port()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_NOWHERE", json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1", "port": port,
                                                                 "password": "connect-token-not-logged"}))  # fmt: skip
    monkeypatch.setattr(spark_connect, "CONNECT_READY_TIMEOUT", 2.0)
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"x")])
    op = KinesisToSparkOperator(task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
                                output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_nowhere"))  # fmt: skip
    took, err = seconds(lambda: op.execute({}))
    assert isinstance(err, EndpointUnreachableError), err
    assert took < 2.0 + FAST  # the readiness timeout, plus planning and PySpark's import
    text = str(err)
    assert f"spark_connect connection 'spark_nowhere' at sc://127.0.0.1:{port}" in text and "connect-token-not-logged" not in text
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    # the plan stays pending for the next attempt (its lease released); no checkpoint moved
    assert store.committed_checkpoints() == {} and store.head().pending_batch_id == 1


@pytest.mark.spark
def test_a_spark_connection_with_a_bad_master_fails_naming_it(monkeypatch, aws_conn, kinesis, dynamodb, unique_name, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_BAD", json.dumps({"conn_type": "spark", "host": "nosuchmaster://cluster"}))
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"x")])
    op = KinesisToSparkOperator(task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
                                output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_bad"))  # fmt: skip
    took, err = seconds(lambda: op.execute({}))
    assert isinstance(err, RuntimeError), err
    text = str(err)
    assert "--master nosuchmaster://cluster" in text and "(spark connection 'spark_bad')" in text
    assert "No checkpoint moved" in text and took < 60
    assert DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake").committed_checkpoints() == {}
