"""The Spark Connect runner (:class:`SparkConnectJob`): this process as the batch's driver against a
running Spark Connect server (connection type ``spark_connect``), and what it needs around it.

* The server: :func:`check_spark_connect` (fail fast when nothing accepts the channel),
  :func:`server_answers` and :func:`unresponsive_timeout` (a server that stops answering while
  the job runs is given up), :func:`check_connect_transport` (credentials go over TLS or to a
  loopback server only).
* The sessions: :func:`with_session_id`, and for reusable sessions
  (``spark_connect_reuse_session=True``) :func:`connect_session_id`, keyed by
  :func:`session_secret` (the connection's ``session_secret`` extra, or this worker's own at
  :func:`worker_secret_path`) over the digest of the session's artifacts (:func:`artifacts_digest`).

``hooks.spark.spark_job_for`` picks this runner for a ``spark_connect`` connection; this module
does not import ``hooks.spark``. Log lines keep its logger (``airflow_kinesis_spark.hooks.spark``),
where they were written before this module held them: logging configurations and readers of the
task log filter on it.

pyspark and the apache-spark provider are imported when the runner runs, not when this module
is imported.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import math
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_kinesis_spark.core.job import JobArguments
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.exceptions import EndpointUnreachableError, KinesisSparkError
from airflow_kinesis_spark.hooks.spark_package import core_zip
from airflow_kinesis_spark.hooks.spark_settings import SparkJobSettings, after_failure, describe
from airflow_kinesis_spark.hooks.spark_temp import batch_temp_dir

# The logger of ``hooks.spark``, where these lines were written before this module held them:
# logging configurations and readers of the task log filter on it.
log = logging.getLogger("airflow_kinesis_spark.hooks.spark")

__all__ = [
    "SparkConnectJob",
    "CONNECT_ENV_VARS",
    "CONNECT_READY_TIMEOUT",
    "UNRESPONSIVE_TIMEOUT_EXTRA",
    "DEFAULT_UNRESPONSIVE_TIMEOUT",
    "SESSION_SECRET_EXTRA",
    "ALLOW_INSECURE_EXTRA",
    "check_spark_connect",
    "server_answers",
    "unresponsive_timeout",
    "check_connect_transport",
    "with_session_id",
    "artifacts_digest",
    "worker_secret_path",
    "session_secret",
    "connect_session_id",
]

#: Environment variables by which PySpark marks a process as a Spark Connect client.
CONNECT_ENV_VARS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
#: Seconds a Spark Connect server has to accept the gRPC channel (PySpark's own retries take minutes).
CONNECT_READY_TIMEOUT = 10.0
#: ``spark_connect`` connection extra: seconds a running job waits for a Spark Connect server that
#: does not answer (killed, frozen, unreachable) before it is given up (:class:`SparkConnectJob`).
UNRESPONSIVE_TIMEOUT_EXTRA = "unresponsive_timeout"
#: Its default: PySpark's client would retry an unreachable server for about 10 minutes
#: (``DefaultPolicy``: "the maximum tolerated wait is guaranteed to be at least 10 minutes") and
#: wait on one that accepts connections but does not answer for ever; a server that answered no
#: call for a minute is down (a busy server answers: its gRPC threads are not Spark's).
DEFAULT_UNRESPONSIVE_TIMEOUT = 60.0
#: Seconds between two checks that the server answers while a job runs, and the longest a check
#: waits (less when ``unresponsive_timeout`` is short: a third of it).
SERVER_CHECK_INTERVAL = 5.0
#: ``spark_connect`` connection extra: a secret (string) that keys the reusable session ids
#: (``spark_connect_reuse_session=True``), shared by the workers that should reuse each other's
#: sessions. Without it, each worker keeps its own secret in :func:`worker_secret_path`.
SESSION_SECRET_EXTRA = "session_secret"
#: ``spark_connect`` connection extra that allows sending credentials to a non-loopback server
#: over plaintext gRPC (only for a network you trust: anyone on the path can read them).
ALLOW_INSECURE_EXTRA = "allow_insecure_credentials"


def artifacts_digest(paths: Sequence[str]) -> str:
    """SHA-256 (hex) over the names and contents of ``paths``: what a reusable Spark Connect
    session's artifacts are (:func:`connect_session_id`)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(os.path.basename(path).encode() + b"\0")
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port/;param=value...``) with its ``session_id`` parameter set."""
    base, _, params = url.partition("/;")
    base = base.rstrip("/")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    return f"{base}/;" + ";".join([*kept, f"session_id={session_id}"])


def check_spark_connect(url: str, conn_id: str) -> None:
    """Fail fast when the Spark Connect server of ``url`` does not accept a gRPC channel
    within :data:`CONNECT_READY_TIMEOUT` seconds.

    :raises EndpointUnreachableError: naming the connection and ``sc://host:port`` (never the token).
    """
    import grpc
    builder = _channel_builder(url)
    channel = builder.toChannel()
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_READY_TIMEOUT)
    except grpc.FutureTimeoutError:
        endpoint = f"sc://{builder.endpoint}"
        raise EndpointUnreachableError(
            f"Cannot reach the Spark Connect server of spark_connect connection {conn_id!r} at {endpoint} "
            f"within {CONNECT_READY_TIMEOUT:g} s. Check the connection's host, port and use_ssl, and that the "
            "server runs and this machine can reach it. With a token (the connection's password) PySpark opens a "
            "TLS channel to any host but one named 'localhost'.",
            service="Spark Connect", endpoint=endpoint, source=f"spark_connect connection {conn_id!r}",
        ) from None  # fmt: skip
    finally:
        channel.close()


def server_answers(url: str, timeout: float) -> bool:
    """Whether the Spark Connect server of ``url`` answers a gRPC call within ``timeout`` seconds.

    The call is the standard health check (``grpc.health.v1.Health/Check``) on a new channel: any
    answer counts, ``UNIMPLEMENTED`` included (the server's gRPC layer is alive; it answers while
    its Spark jobs run); ``DEADLINE_EXCEEDED`` (a frozen server, or one whose host is gone) and
    ``UNAVAILABLE`` (nothing listens: a killed server) do not. No session is touched.
    """
    import grpc

    channel = _channel_builder(url).toChannel()
    try:
        channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=timeout)
        return True
    except grpc.RpcError as err:
        return err.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    finally:
        channel.close()


def unresponsive_timeout(extra: dict[str, Any], conn_id: str) -> float:
    """The connection's ``unresponsive_timeout`` extra (seconds; default :data:`DEFAULT_UNRESPONSIVE_TIMEOUT`).

    :raises ValueError: not a number of seconds > 0 (naming the connection).
    """
    value = extra.get(UNRESPONSIVE_TIMEOUT_EXTRA)
    if value is None or value == "":
        return DEFAULT_UNRESPONSIVE_TIMEOUT
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"spark_connect connection {conn_id!r}: extra {UNRESPONSIVE_TIMEOUT_EXTRA!r} must be a number of "
                         f"seconds > 0; got {value!r}")  # fmt: skip
    return seconds


def _channel_builder(url: str) -> Any:
    """PySpark's parser of ``sc://`` URLs (``DefaultChannelBuilder``; ``ChannelBuilder`` before Spark 4)."""
    try:
        from pyspark.sql.connect.client import DefaultChannelBuilder as builder_class
    except ImportError:
        from pyspark.sql.connect.client import ChannelBuilder as builder_class
    return builder_class(url)


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_connect_transport(url: str, conn_id: str, *, allow_insecure: bool = False) -> None:
    """Refuse to send credentials to a Spark Connect server over plaintext gRPC off this machine.

    Allowed: TLS (``use_ssl`` or a token in the connection, PySpark then uses a secure channel),
    a loopback server (``127.0.0.0/8``, ``::1``, ``localhost``), or the connection's extra
    ``allow_insecure_credentials: true``.

    :raises ValueError: naming the connection, the server (never the token) and the fix.
    """
    builder = _channel_builder(url)
    if builder.secure or _is_loopback(builder.host) or allow_insecure:
        return
    raise ValueError(
        f"Refusing to send AWS credentials to the Spark Connect server sc://{builder.endpoint} of connection "
        f"{conn_id!r} over plaintext gRPC: anyone on the network path could read them. Set the connection's extra "
        "'use_ssl': true (the server or a proxy in front of it must speak TLS), or run the job with "
        "job_credentials='none' (the server's own role). Only on a network you trust: extra "
        f"'{ALLOW_INSECURE_EXTRA}': true."
    )


def worker_secret_path() -> Path:
    """Where this worker keeps the secret that keys its reusable Spark Connect session ids:
    ``$AIRFLOW_KINESIS_SPARK_STATE_DIR/connect_session.key``, default under ``~/.cache``."""
    base = os.environ.get("AIRFLOW_KINESIS_SPARK_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "airflow_kinesis_spark")
    return Path(base) / "connect_session.key"


def session_secret(configured: str | None = None) -> bytes:
    """The secret that keys reusable session ids: the connection's ``session_secret`` extra, else
    this worker's own, made on first use (32 random bytes, file mode 0600)."""
    if configured:
        return str(configured).encode()
    path = worker_secret_path()
    try:
        return path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        secret = secrets.token_bytes(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # made concurrently by another task on this worker
            return path.read_bytes()
        with os.fdopen(fd, "wb") as fh:
            fh.write(secret)
        return secret


def connect_session_id(secret: bytes, scope: str, stream_name: str, consumer_name: str, artifacts: str = "") -> str:
    """The reusable Spark Connect session id of a consumer (``spark_connect_reuse_session=True``):
    a UUID from HMAC-SHA256 keyed by ``secret`` over scope, stream, consumer and the digest of the
    artifacts the session holds (:func:`artifacts_digest`). Without the secret it cannot be
    derived, so no other client can create the session before the consumer does (the server
    accepts any id a client names) and plant code in it. It does not keep the session from being
    joined: the server shows the ids of its sessions, with their user ids, in its event log and
    its UI's Connect tab. Another package version (an upgrade) gets another session: a session's
    artifacts cannot be replaced under the same name (``ARTIFACT_ALREADY_EXISTS``), and the old
    session ends with the server's idle timeout."""
    digest = hmac.new(secret, f"{scope}/{stream_name}/{consumer_name}/{artifacts}".encode(), hashlib.sha256).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


class SparkConnectJob:
    """Run the batch handed over in the checkpoint store with this process as its driver, against a
    running Spark Connect server (no JVM start).

    The job is the same code spark-submit runs (``airflow_kinesis_spark.job``, which
    ``spark_scripts/kinesis_batch.py`` calls); the Airflow-free part of the package, the job
    included, goes to the server as a session artifact. Credentials
    travel inside the read function to the server's Python workers, never in the plan, the URL
    or a log line. PySpark marks the whole process as a Connect client in ``os.environ``; that
    is undone after the run, so a later spark-submit from this process is not affected.

    Credentials go to the server only over TLS (or to a loopback server), see
    :func:`check_connect_transport`; the connection's token (its password) and ``use_ssl`` reach
    PySpark in the URL (``sc://host:port/;token=...;use_ssl=true``), for a server that checks a
    token (Spark 4's ``spark.connect.authenticate.token``, a managed service's session token, an
    authenticating proxy).

    Each batch runs in a session of its own: a random id, nothing set in its conf that tells it
    from another client's session, released when the run ends (``SparkSession.stop()``, which
    sends ``ReleaseSession``; the server then refuses the id, ``SESSION_CLOSED``). So no client
    of the server can join a batch's session after the batch, or plant code in its Python
    workers for the next batch. A client that learns the session's id and user id while the
    batch runs (the server's event log and UI show both) can join it then: the server binds a
    session to the ids a client names, not to whom it authenticated (see docs/security.md).

    With ``reuse_connect_session`` (opt-in) the session is kept for the consumer's next batch
    instead, under an id keyed by a secret (:func:`connect_session_id`): no other client can
    create it first, but any client that reads its id from the server can join it between
    batches, and what it plants in the session's warm Python workers runs in the next batches.
    The artifacts are added again each batch (the server keeps an identical file it already has),
    so no state about the session is kept in its conf. A session the server no longer accepts
    (expired, released) is left to the server and this run uses a new one, released at its end.

    A server that stops answering while the job runs (killed, frozen, unreachable) is given up
    after the connection's extra ``unresponsive_timeout`` seconds without an answer (default
    :data:`DEFAULT_UNRESPONSIVE_TIMEOUT`), with :class:`TimeoutError`; see :meth:`run_handed`.
    """

    def __init__(self, settings: SparkJobSettings, session_scope: str = "KinesisToSparkOperator") -> None:
        self.settings = settings
        self.session_scope = session_scope
        self._spark: Any = None
        self._secret = b""
        #: The gRPC channels of this run's sessions (:meth:`_connect`), closed when the run is given up.
        self._channels: list[Any] = []
        self._abandoned = False

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        """Run the job of the batch (or window) handed over in the checkpoint store, over Spark Connect.

        This process is the job's driver: as a spark-submit driver does (``core.job``), it claims
        the batch from the store under a writer id of its own, reads the plan there (refused unless
        it is the plan the worker checked, ``check_bound_plan``), holds the lease while the job
        runs (losing it interrupts the server's jobs), and records the report there, fenced on its
        writer id; a window's report is stored under the window's items. The store is reached with
        the task's own DynamoDB client (``SparkJobSettings.checkpoint_hook``). A Connect client
        cannot move files on the server's file system, so the job writes the plan's output
        location itself rather than a staging directory (``run_handed_batch``'s ``publish=None``).

        The job runs in a thread of this process while this one checks that the server answers
        (:func:`server_answers`, every :data:`SERVER_CHECK_INTERVAL` seconds). A server that
        answered nothing for the connection's ``unresponsive_timeout`` seconds (default
        :data:`DEFAULT_UNRESPONSIVE_TIMEOUT`) is given up: an ERROR line names it
        (``sc://host:port``, never a token), the client is closed and :class:`TimeoutError` is
        raised, so the protocol releases the batch's lease and a retry may take it over at once.

        :param output_location: the batch's output location (scopes the job's credentials).
        :raises RuntimeError: the job failed; :raises EndpointUnreachableError: no server at the start.
        :raises TimeoutError: the server stopped answering while the job ran.
        :raises ValueError: the connection's ``unresponsive_timeout`` is not a number of seconds > 0.
        :raises KinesisSparkError: as ``core.job.run_handed_batch`` / ``run_handed_window`` (the
            batch is not pending or was taken over, its plan is not the one checked, its report
            does not match the plan); not wrapped, so the operators' error policy sees them.
        """
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from airflow_kinesis_spark import job  # what spark_scripts/kinesis_batch.py runs
        from airflow_kinesis_spark.core.job import check_planned_transform, run_handed_batch, run_handed_window
        from airflow_kinesis_spark.core.names import stream_name_of
        from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
        from airflow_kinesis_spark.core.transform import resolve_transform

        s = self.settings
        label, after = describe(arguments), after_failure(arguments)
        transform = resolve_transform(s.transform, s.transform_allowed_modules) if s.transform else None
        if s.checkpoint_hook is None:
            raise ValueError("the Spark Connect runner takes its batch from the checkpoint store: SparkJobSettings "
                             "needs the checkpoint_hook of the task's checkpoint table")  # fmt: skip
        connect_hook = SparkConnectHook(conn_id=s.spark_conn_id)
        url = connect_hook.get_connection_url()
        extra = connect_hook.get_connection(s.spark_conn_id).extra_dejson
        timeout = unresponsive_timeout(extra, s.spark_conn_id)
        if s.job_credentials != "none":  # before any credential is even made
            check_connect_transport(url, s.spark_conn_id, allow_insecure=bool(extra.get(ALLOW_INSECURE_EXTRA)))
        aws_env = s.aws_environment(arguments.stream_name, output_location=output_location)
        if s.reuse_connect_session:
            self._secret = session_secret(extra.get(SESSION_SECRET_EXTRA))
        check_spark_connect(url, s.spark_conn_id)
        store = DynamoDBCheckpointStore(s.checkpoint_hook.conn, arguments.checkpoint_table, arguments.stream_name,
                                        arguments.consumer_name)  # fmt: skip
        options = s.read_options.job_options(arguments.records_expected)
        saved = {k: os.environ.get(k) for k in CONNECT_ENV_VARS}
        abandoned = False
        self._channels, self._abandoned = [], False
        log.info("Running the Spark job of %s of stream %r, consumer %r over Spark Connect", label,
                 stream_name_of(arguments.stream_name), arguments.consumer_name)  # fmt: skip

        def work() -> dict[str, Any]:
            with batch_temp_dir(arguments.batch_id) as tmp:
                artifacts = [core_zip(tmp), *filter(None, (s.py_files or "").split(","))]

                def write(plan: BatchPlan, location: str) -> dict[str, Any]:
                    check_planned_transform(plan, s.transform)  # the plan's transform is the DAG's (BOUND)
                    spark = self._session(url, plan, artifacts)
                    return job.run(spark, plan.to_dict(), transform, aws_env, options, location)

                if arguments.window:
                    return run_handed_window(store, arguments, write=write, publish=None, discard=lambda staging: None)
                return run_handed_batch(store, arguments, write=write, publish=None, discard=lambda staging: None,
                                        cancel=self.kill)  # fmt: skip

        try:
            outcome = _while_server_answers(work, url, timeout, what=f"the Spark job of {label}")
        except _ServerUnresponsive as gone:
            abandoned = True
            endpoint = f"sc://{_channel_builder(url).endpoint}"
            log.error("The Spark Connect server %s (spark_connect connection %r) answered nothing for %.0f s "
                      "(unresponsive_timeout %g s): giving up the Spark job of %s", endpoint, s.spark_conn_id,
                      gone.silent, timeout, label)  # fmt: skip
            raise TimeoutError(
                f"The Spark Connect server {endpoint} of spark_connect connection {s.spark_conn_id!r} answered nothing "
                f"for {gone.silent:.0f} s while it ran the Spark job of {label} (the connection's extra "
                f"{UNRESPONSIVE_TIMEOUT_EXTRA!r} is {timeout:g} s): it was killed, froze or cannot be reached; the job "
                f"was given up. {after}"
            ) from None
        except KinesisSparkError:
            raise  # the protocol's own errors: the error policy decides whether a retry can help
        except Exception as err:
            raise RuntimeError(f"The Spark job of {label} failed over Spark Connect: {err}. {after}") from err
        finally:
            if abandoned:
                self._abandon()
            elif self._spark is not None:
                self._spark.stop()
            self._spark = None
            self._channels = []
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        log.debug("Spark job of %s: %s (writer %s)", label, outcome.get("status"), outcome.get("writer"))

    def kill(self) -> None:
        spark = self._spark
        if spark is not None:
            try:
                spark.interruptAll()
            except Exception as err:  # noqa: BLE001 - the session may be gone already
                log.warning("Could not interrupt the Spark Connect job: %s", err)

    def _abandon(self) -> None:
        """Close the client of a server that stopped answering, without asking the server
        anything: its gRPC channels first (every call on them ends at once, the job's and
        PySpark's pending release calls, which would retry an unreachable server for minutes or
        wait on a frozen one for ever, keeping this process from exiting), then the session,
        not released (in a daemon thread, waited for 5 s at most), so this process may start new
        sessions."""
        self._abandoned = True  # the job's thread, if it goes on, makes no new session
        for channel in self._channels:
            try:
                channel.close()
            except Exception as err:  # noqa: BLE001 - closing is best effort
                log.debug("closing a gRPC channel of an abandoned Spark Connect session: %s", err)
        spark = self._spark
        if spark is not None:
            spark.release_session_on_close = False
            closing = threading.Thread(target=spark.stop, name="spark-connect-close", daemon=True)
            closing.start()
            closing.join(5)

    def _connect(self, url: str) -> Any:
        """The Spark Connect session of ``url`` (as ``SparkSession.builder.remote(url).getOrCreate()``),
        made through a channel builder that keeps the gRPC channels it makes (PySpark's hook for
        customising them, ``SparkSession.builder.channelBuilder``), for :meth:`_abandon`."""
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        if self._abandoned:
            raise RuntimeError("this run gave its Spark Connect server up")
        channels = self._channels

        class KeepingChannelBuilder(type(_channel_builder(url))):  # type: ignore[misc]
            def toChannel(self) -> Any:  # noqa: N802 - PySpark's name
                channel = super().toChannel()
                channels.append(channel)
                return channel

        # What pyspark.sql.SparkSession.builder.remote(...).getOrCreate() sets before it makes a
        # Connect session: PySpark's functions then build Connect columns (restored after the run).
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        self._spark = RemoteSparkSession.builder.channelBuilder(KeepingChannelBuilder(url)).getOrCreate()
        return self._spark

    def _session(self, url: str, plan: BatchPlan, artifacts: list[str]) -> Any:
        if self.settings.reuse_connect_session:
            digest = artifacts_digest(artifacts)
            session_id = connect_session_id(self._secret, self.session_scope, plan.stream_name, plan.consumer_name, digest)
            spark = None
            try:
                spark = self._connect(with_session_id(url, session_id))
                spark.release_session_on_close = False
                # Added each batch, whether the session has them or not: the server keeps a file it
                # already has with the same contents (the id is keyed by their digest, so it has no
                # other), and nothing in the session's conf marks it as this provider's.
                for artifact in artifacts:
                    spark.addArtifacts(artifact, pyfile=True)
                return spark
            except Exception as err:  # noqa: BLE001 - any refusal: fall back to a new session
                log.info("The consumer's Spark Connect session is not reusable (%s); starting a new one", err)
                if spark is not None:
                    # Close this client only: the server session may serve another run of the
                    # consumer (a window re-run) right now, so it is not released.
                    spark.release_session_on_close = False
                    spark.stop()
        # The batch's own session: a random id, released at the end of the run (stop() in run()).
        spark = self._connect(with_session_id(url, str(uuid.uuid4())))
        spark.release_session_on_close = True
        for artifact in artifacts:
            spark.addArtifacts(artifact, pyfile=True)
        return spark


class _ServerUnresponsive(Exception):
    """The Spark Connect server answered nothing for ``silent`` seconds (:func:`_while_server_answers`)."""

    def __init__(self, silent: float) -> None:
        super().__init__(f"no answer for {silent:.0f} s")
        self.silent = silent


def _while_server_answers(work: Callable[[], Any], url: str, timeout: float, *, what: str) -> Any:
    """``work()`` in a thread, while this one checks that the Spark Connect server of ``url``
    answers (:func:`server_answers`); returns its result or raises its exception.

    A check every :data:`SERVER_CHECK_INTERVAL` seconds (or a third of ``timeout``), each
    waiting as long at most. The first check without an answer logs a WARNING, an answer again
    an INFO line. When no check was answered for ``timeout`` seconds, :class:`_ServerUnresponsive`
    is raised and the thread is left behind (a daemon: PySpark's client may retry for minutes;
    closing the client ends its calls).
    """
    interval = min(SERVER_CHECK_INTERVAL, timeout / 3)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = work()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = err

    thread = threading.Thread(target=target, name="spark-connect-job", daemon=True)
    thread.start()
    endpoint = f"sc://{_channel_builder(url).endpoint}"
    answered = time.monotonic()
    silent_since: float | None = None
    while True:
        thread.join(interval)
        if not thread.is_alive():
            break
        if server_answers(url, interval):
            if silent_since is not None:
                log.info("The Spark Connect server %s answers again", endpoint)
                silent_since = None
            answered = time.monotonic()
            continue
        silent = time.monotonic() - answered
        if silent >= timeout:
            raise _ServerUnresponsive(silent)
        if silent_since is None:
            silent_since = answered
            log.warning("The Spark Connect server %s has not answered for %.0f s while it runs %s; it is given up "
                        "after %g s without an answer (unresponsive_timeout)", endpoint, silent, what, timeout)  # fmt: skip
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")
