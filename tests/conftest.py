"""Shared fixtures: emulators on 127.0.0.1 (free ports), AWS clients talking to them, the data."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from demo.stack import free_port, moto_command

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "data"
REGION = "us-east-1"
# Emulators accept any credentials; these are test placeholders, not secrets.
TEST_ACCESS_KEY = "AKIAEMULATORTESTKEY1"
TEST_SECRET_KEY = "emulator-test-secret-key-do-not-log"


def aws_connection(endpoint: str, **extra: object) -> str:
    """An ``aws`` connection (JSON, for ``AIRFLOW_CONN_*``) to an emulator, as a DAG author writes it."""
    return json.dumps({"conn_type": "aws", "login": TEST_ACCESS_KEY, "password": TEST_SECRET_KEY,
                       "extra": {"region_name": REGION, "endpoint_url": endpoint, **extra}})  # fmt: skip


@pytest.fixture
def aws_conn(monkeypatch, moto_endpoint):
    """``aws_default`` pointing at moto; call it with a kinesis endpoint to route Kinesis elsewhere."""

    def configure(kinesis_endpoint: str | None = None) -> None:
        extra = {"service_config": {"kinesis": {"endpoint_url": kinesis_endpoint}}} if kinesis_endpoint else {}
        monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_connection(moto_endpoint, **extra))

    configure()
    return configure


def _wait_for_port(port: int, proc: subprocess.Popen, name: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within {timeout}s")


def _start(cmd: list[str], port: int, name: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_port(port, proc, name)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto in server mode (DynamoDB, Kinesis, S3) on a free port of 127.0.0.1."""
    port = free_port()
    proc = _start(moto_command(port), port, "moto_server")
    yield f"http://127.0.0.1:{port}"
    _stop(proc)


@pytest.fixture(scope="session")
def kinesalite_endpoint() -> Iterator[str]:
    """kinesalite (npm) on a free port of 127.0.0.1: real-looking 56-digit sequence numbers."""
    binary = os.environ.get("KINESALITE_BIN") or str(ROOT / ".cache/node/node_modules/.bin/kinesalite")
    if not Path(binary).exists():
        pytest.fail(f"kinesalite not installed at {binary}: run 'make kinesalite' (make test does it)")
    port = free_port()
    proc = _start([binary, "--port", str(port), "--createStreamMs", "5", "--deleteStreamMs", "5",
                   "--updateStreamMs", "5", "--shardLimit", "200"], port, "kinesalite")  # fmt: skip
    yield f"http://127.0.0.1:{port}"
    _stop(proc)


def make_client(service: str, endpoint: str):
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=TEST_ACCESS_KEY,
        aws_secret_access_key=TEST_SECRET_KEY,
    )


@pytest.fixture
def kinesis(moto_endpoint: str):
    return make_client("kinesis", moto_endpoint)


@pytest.fixture
def dynamodb(moto_endpoint: str):
    return make_client("dynamodb", moto_endpoint)


@pytest.fixture
def kinesalite(kinesalite_endpoint: str):
    return make_client("kinesis", kinesalite_endpoint)


@pytest.fixture
def unique_name() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


def create_stream(client, name: str, shards: int) -> None:
    client.create_stream(StreamName=name, ShardCount=shards)
    client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})


@pytest.fixture(scope="session")
def kpl_vectors() -> list[dict]:
    """The four KPL-produced Kinesis records of data/kpl_vectors.json (see data/README.md)."""
    vectors = json.loads((DATA_DIR / "kpl_vectors.json").read_text())["vectors"]
    for v in vectors:
        v["data"] = base64.b64decode(v["data_base64"])
    return vectors


@pytest.fixture(scope="session")
def spark_connect_endpoint() -> Iterator[tuple[str, int]]:
    """A Spark Connect server (from the pyspark distribution) on a free port of 127.0.0.1."""
    from demo.stack import spark_connect_server

    with spark_connect_server(cores=2) as endpoint:
        yield endpoint


@pytest.fixture
def spark_connect_conn(monkeypatch, spark_connect_endpoint) -> str:
    """A ``spark_connect`` connection (id ``spark_connect_test``) to the test server; returns its id."""
    host, port = spark_connect_endpoint
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_TEST", json.dumps({"conn_type": "spark_connect", "host": host, "port": port}))
    try:  # pyspark refuses a remote session beside a regular one a test of this worker left running
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None and not type(active).__module__.startswith("pyspark.sql.connect"):
            active.stop()
    except ImportError:
        pass
    return "spark_connect_test"


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory):
    """A Spark standalone master and worker (2 cores, 1g) on 127.0.0.1, from the pyspark distribution.

    Yields a ``demo.spark_cluster.StandaloneCluster``; logs and the worker's work dir stay under
    the session's temporary directory for a failing test to be looked at.
    """
    from demo.spark_cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("spark-standalone"), cores=2, memory="1g") as cluster:
        yield cluster


# Under `make test`'s pytest-xdist work stealing, each worker is first handed a contiguous share of
# the collection (the first len // workers items to one, the next to another, ...), and an idle
# worker steals from the END of another's queue: a long test handed out late can only start late,
# and long tests handed to one worker run one after the other there. So the long tests are dealt
# out first: the longest to the worker share with the least estimated time so far (each share
# starts with its long tests, longest first), then the other tests fill the shares up to the sizes
# xdist hands out, in collection order. Estimates: each test's seconds as `make test-durations`
# recorded them in tests/durations.json (setup, call and teardown of its last run on 2 cores); a
# test not recorded there counts as _SHORT, a test marked skip as 0. The deployment tests share a
# module-scoped deployment (minutes to set up): they stay in one share.
_SHORT = 5.0
#: Where `make test-durations` records every test's seconds (RECORD_TEST_DURATIONS names the file).
DURATIONS_FILE = Path(__file__).with_name("durations.json")
_DURATIONS: dict[str, float] = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}
_RECORDED: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    """With RECORD_TEST_DURATIONS set: add up each test's setup, call and teardown seconds (the
    xdist controller receives every worker's reports)."""
    if os.environ.get("RECORD_TEST_DURATIONS"):
        _RECORDED[report.nodeid] = round(_RECORDED.get(report.nodeid, 0.0) + report.duration, 1)


def pytest_sessionfinish(session, exitstatus) -> None:
    """With RECORD_TEST_DURATIONS=FILE: write the recorded seconds there (the tests that ran this
    time; others keep their earlier value), sorted, on the controller only."""
    target = os.environ.get("RECORD_TEST_DURATIONS")
    if target and _RECORDED and not hasattr(session.config, "workerinput"):
        merged = {k: v for k, v in {**_DURATIONS, **_RECORDED}.items() if v >= _SHORT}  # shorter ones count as _SHORT
        Path(target).write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


_ONE_SHARE = ("deployment/",)


def _estimate(item) -> float:
    if item.get_closest_marker("skip") is not None:  # e.g. the EFO crash points `make test` leaves out
        return 0.0
    return _DURATIONS.get(item.nodeid, _SHORT)


def pytest_collection_modifyitems(config, items):
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    groups: dict[str, list] = {}
    for item in items:
        path = item.nodeid.removeprefix("tests/")
        groups.setdefault(path.split("::")[0] if path.startswith(_ONE_SHARE) else item.nodeid, []).append(item)
    weight = {key: sum(_estimate(i) for i in group) for key, group in groups.items()}
    long_keys = sorted((k for k in groups if weight[k] > _SHORT), key=lambda k: -weight[k])
    shares: list[list] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for key in long_keys:
        k = min(range(workers), key=lambda w: (load[w], w))
        shares[k].extend(groups[key])
        load[k] += weight[key]
    short = [i for key, group in groups.items() if key not in long_keys for i in group]
    remaining = len(items)
    for k in range(workers):  # the sizes xdist's work stealing hands out at the start
        size = remaining // (workers - k)
        remaining -= size
        take = max(0, size - len(shares[k])) if k < workers - 1 else len(short)
        shares[k].extend(short[:take])
        del short[:take]
    items[:] = [item for share in shares for item in share]
