"""Spark Connect sessions private to a batch (issue #28): what another client of the same server can do.

The server here is set up as a shared server usually is: it checks a token
(``SPARK_CONNECT_AUTHENTICATE_TOKEN``, Spark 4) that every client holds, and writes an event log,
which, like the UI's Connect tab, lists every session with its id and user id
(``SparkListenerConnectSessionStarted``). The other client holds the token and reads the event log:
it learns every session id, joins what it can (with the user id the log names), looks for the
provider's sessions by their conf, and runs a task in each session it joins that replaces
``boto3.session.Session`` in the session's reused Python workers by one that writes the
credentials it is given to a file (the attack of the security review).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_kinesis_spark.hooks.spark_submit import BatchSparkSubmitHook
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings
from demo.producer import put_plain
from demo.stack import BIN, free_port, local_server
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SESSION_STARTED = "org.apache.spark.sql.connect.service.SparkListenerConnectSessionStarted"
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@dataclass
class SharedServer:
    port: int
    token: str
    event_log_dir: Path

    def url(self, **params: str) -> str:
        """``sc://localhost:PORT/;token=...`` (PySpark sends a token in plaintext to ``localhost`` only)."""
        return f"sc://localhost:{self.port}/;" + ";".join(f"{k}={v}" for k, v in {"token": self.token, **params}.items())

    def sessions(self) -> list[tuple[str, str]]:
        """``(session id, user id)`` of every session the event log names, in order."""
        found = []
        for path in sorted(self.event_log_dir.iterdir()):
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                if SESSION_STARTED in line[:200]:
                    try:
                        event = json.loads(line)
                    except ValueError:  # the line being written
                        continue
                    found.append((event["sessionId"], event["userId"]))
        return found

    def event_log_text(self) -> str:
        return "".join(p.read_text(encoding="utf-8", errors="replace") for p in self.event_log_dir.iterdir())


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """A Spark 4 Connect server on 127.0.0.1 that checks a token and writes an uncompressed event log."""
    events = tmp_path_factory.mktemp("connect-event-log")
    token = secrets.token_urlsafe(24)
    port = free_port()
    command = [str(BIN / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
               "--master", "local[2]", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
               "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.sql.session.timeZone=UTC", "--conf", "spark.eventLog.enabled=true",
               "--conf", f"spark.eventLog.dir={events.as_uri()}", "--conf", "spark.eventLog.compress=false",
               "--conf", "spark.eventLog.rolling.enabled=false", "spark-internal"]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_CONNECT_AUTHENTICATE_TOKEN": token}  # fmt: skip
    with local_server(command, port, "Spark Connect server", timeout=120, env=env):
        yield SharedServer(port, token, events)


@pytest.fixture
def connections(monkeypatch, moto_endpoint, shared_server):
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": TEST_ACCESS_KEY, "password": TEST_SECRET_KEY,
        "extra": {"region_name": REGION, "endpoint_url": moto_endpoint}}))  # fmt: skip
    # The token in the connection's password: the provider passes it on (``token=...``).
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_SHARED", json.dumps(
        {"conn_type": "spark_connect", "host": "localhost", "port": shared_server.port, "password": shared_server.token}))  # fmt: skip
    monkeypatch.setattr(BatchSparkSubmitHook, "submit", lambda *a, **k: pytest.fail("spark-submit must not run"))
    yield
    for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):  # set by the other client in this process
        os.environ.pop(key, None)


def _plant(capture: str) -> Any:
    """The other client's task: wraps ``boto3.session.Session`` in the Python worker it runs in (which
    the session reuses for later tasks) to write the credentials it is given to ``capture``."""

    def planted(batches: Any) -> Any:
        import json as json_
        import os as os_

        import boto3.session

        cls = boto3.session.Session
        if not getattr(cls.__init__, "_planted", False):
            original = cls.__init__

            def spy(self: Any, *args: Any, **kwargs: Any) -> None:
                with open(capture, "a", encoding="utf-8") as fh:
                    fh.write(json_.dumps({"pid": os_.getpid(), **{k: kwargs.get(k) for k in (
                        "aws_access_key_id", "aws_secret_access_key", "aws_session_token")}}) + "\n")  # fmt: skip
                original(self, *args, **kwargs)

            spy._planted = True  # type: ignore[attr-defined]
            cls.__init__ = spy
        yield from batches

    return planted


class OtherClient:
    """Another client of the shared server: holds its token and reads its event log."""

    def __init__(self, server: SharedServer, capture: Path) -> None:
        self.server = server
        self.capture = str(capture)
        #: the sessions that started before it came (other tests'), and its own
        self.own: set[str] = {s for s, _ in server.sessions()}
        self.joined: list[str] = []
        self.refused: dict[str, str] = {}
        self.marked: dict[str, list[str]] = {}
        self.baseline: dict[str, str] | None = None

    def _open(self, **params: str) -> Any:
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # as SparkSession.builder.remote(...) sets it
        session = RemoteSparkSession.builder.remote(self.server.url(**params)).create()
        session.release_session_on_close = False  # leave the session it joined as it was
        return session

    def _baseline(self) -> dict[str, str]:
        """The conf of a session of its own: what a session nobody configured holds."""
        if self.baseline is None:
            own = str(uuid.uuid4())
            self.own.add(own)
            session = self._open(session_id=own)
            try:
                self.baseline = dict(session.conf.getAll)
            finally:
                session.release_session_on_close = True
                session.stop()
        return self.baseline

    def attack(self) -> None:
        """Join every session the event log names (but its own and those it tried), note the conf
        the session holds beyond a fresh one's, and plant the credential recorder in its workers."""
        baseline = self._baseline()
        tried = self.own | set(self.joined) | set(self.refused)
        for session_id, user_id in self.server.sessions():
            if session_id in tried:
                continue
            tried.add(session_id)
            params = {"session_id": session_id, **({"user_id": user_id} if user_id else {})}
            session = None
            try:
                session = self._open(**params)
                conf = dict(session.conf.getAll)
                self.marked[session_id] = sorted(k for k, v in conf.items() if baseline.get(k) != v)
                session.range(0, 64, 1, 8).mapInArrow(_plant(self.capture), "id long").collect()
                self.joined.append(session_id)
            except Exception as err:  # noqa: BLE001 - what the server answered is the observation
                self.refused[session_id] = str(err).splitlines()[0][:300]
            finally:
                if session is not None:
                    session.stop()

    def stolen(self) -> list[dict[str, Any]]:
        path = Path(self.capture)
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


@pytest.fixture
def job_credentials_seen(monkeypatch):
    """The AWS environment each batch's job got, in order (from the runner's call of the job)."""

    from airflow_kinesis_spark import job

    seen: list[dict[str, str]] = []
    hooks: list[Any] = []
    job_run = job.run

    def spy(spark, plan, transform, aws_env, options, *args, **kwargs):
        if aws_env.get("AWS_SESSION_TOKEN"):
            # moto hands out the same example credentials for every GetFederationToken (and
            # checks no token): a token of this batch's own tells the batches apart.
            aws_env = {**aws_env, "AWS_SESSION_TOKEN": f"{aws_env['AWS_SESSION_TOKEN']}-batch-{secrets.token_hex(4)}"}
        seen.append({k: aws_env[k] for k in CREDENTIAL_KEYS if k in aws_env})
        for hook in hooks:
            hook()
        return job_run(spark, plan, transform, aws_env, options, *args, **kwargs)

    monkeypatch.setattr(job, "run", spy)
    return seen, hooks


def _run(stream: str, tmp_path: Path) -> dict[str, Any]:
    return KinesisToSparkOperator(
        task_id="ingest", stream_name=stream, consumer_name="lake", checkpoint_table=f"{stream}_t",
        output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_connect_shared"),
        read_options=ReadOptions(min_call_interval=0.0),
    ).execute({})  # fmt: skip


def test_a_second_client_finds_no_session_of_a_finished_batch_and_no_marker(
    connections, shared_server, job_credentials_seen, kinesis, unique_name, tmp_path
):
    """The must-show test of issue #28 (item 4). With the operator's defaults, another client of
    the server, between two batches and after the second, finds the batches' sessions in the
    event log but cannot join them (released at each batch's end: ``SESSION_CLOSED``), and the
    sessions held no conf that told them from anyone else's while they ran. So nothing it plants
    runs in a later batch, and no credential of any batch reaches it; nor is any in the event log.

    Before the fix (sessions kept across batches by default, with the conf
    ``spark.airflow_kinesis_spark.artifacts_sha256``), the other client joined batch 1's session,
    recognised it by that conf, and recorded batch 2's scoped key, secret and session token."""
    seen, hooks = job_credentials_seen
    other = OtherClient(shared_server, tmp_path / "stolen.jsonl")
    live_conf: list[list[str]] = []

    def look_while_running() -> None:
        """While the batch's job starts: the conf of the running session beyond a fresh one's
        (joining it only to look; what a running batch's session exposes is the next test's)."""
        baseline = other._baseline()
        session_id, user_id = [s for s in shared_server.sessions() if s[0] not in other.own][-1]
        session = other._open(session_id=session_id, **({"user_id": user_id} if user_id else {}))
        try:
            live_conf.append(sorted(k for k, v in dict(session.conf.getAll).items() if baseline.get(k) != v))
        finally:
            session.stop()

    create_stream(kinesis, unique_name, 1)
    hooks.append(look_while_running)
    put_plain(kinesis, unique_name, [("k", b"one")])
    first = _run(unique_name, tmp_path)
    hooks.clear()
    other.attack()  # between the batches
    put_plain(kinesis, unique_name, [("k", b"two")])
    second = _run(unique_name, tmp_path)
    other.attack()  # after the last batch
    assert first["records"] == 1 and second["records"] == 1 and len(seen) == 2
    assert all(c.get("AWS_SESSION_TOKEN") for c in seen), "the test expects scoped, temporary job credentials"

    provider_sessions = [s for s, _ in shared_server.sessions() if s not in other.own]
    log = shared_server.event_log_text()
    observed = {
        "provider sessions in the event log": len(provider_sessions),
        "sessions the other client joined": other.joined,
        "conf a running session held beyond a fresh one's": live_conf,
        "conf of the sessions it joined beyond a fresh one's": other.marked,
        "credentials it recorded": [{k: bool(v) for k, v in s.items() if k != "pid"} for s in other.stolen()],
        "credentials in the event log": [k for c in seen for k, v in c.items() if v in log],
    }
    assert provider_sessions and set(other.refused) <= set(provider_sessions), (provider_sessions, other.refused)
    expected = {
        "provider sessions in the event log": len(provider_sessions),
        "sessions the other client joined": [],
        "conf a running session held beyond a fresh one's": [[]],
        "conf of the sessions it joined beyond a fresh one's": {},
        "credentials it recorded": [],
        "credentials in the event log": [],
    }
    assert observed == expected, json.dumps(observed, indent=1)
    # every batch's session refused it: released when its batch ended
    assert set(other.refused) == set(provider_sessions), other.refused
    assert all("SESSION_CLOSED" in why for why in other.refused.values()), other.refused


def test_a_client_that_joins_a_running_batch_gets_that_batch_credentials_only(
    connections, shared_server, job_credentials_seen, kinesis, unique_name, tmp_path
):
    """What a private session does not prevent (docs/security.md says so): the server binds a
    session to the session id and user id a client names, both of which its event log and UI
    show, and a token every client holds. A client that joins while the batch runs (here: just
    before the job starts reading) runs code in the batch's Python workers and records the
    credentials that batch's job uses: temporary ones, scoped to the batch. It does not get the
    connection's keys, and it loses the session when the batch ends: the next batch runs in a
    new session whose workers it never reached, and its credentials do not reach the client."""
    seen, hooks = job_credentials_seen
    other = OtherClient(shared_server, tmp_path / "stolen.jsonl")
    create_stream(kinesis, unique_name, 1)
    hooks.append(other.attack)
    put_plain(kinesis, unique_name, [("k", b"one")])
    assert _run(unique_name, tmp_path)["records"] == 1
    hooks.clear()
    joined_first = list(other.joined)
    put_plain(kinesis, unique_name, [("k", b"two")])
    assert _run(unique_name, tmp_path)["records"] == 1
    other.attack()  # after the second batch: its session is gone
    assert len(joined_first) == 1 and other.joined == joined_first, (other.joined, other.refused)
    stolen = {(s["aws_access_key_id"], s["aws_secret_access_key"], s["aws_session_token"]) for s in other.stolen()}
    first, second = ((c["AWS_ACCESS_KEY_ID"], c["AWS_SECRET_ACCESS_KEY"], c["AWS_SESSION_TOKEN"]) for c in seen)
    assert stolen == {first}, "the joined batch's temporary credentials, and nothing else"
    assert second not in stolen and TEST_SECRET_KEY not in json.dumps(other.stolen())
