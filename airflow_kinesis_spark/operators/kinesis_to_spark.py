"""KinesisToSparkOperator: one exactly-once micro-batch, plan -> read -> write -> commit."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from airflow.sdk import Asset, AssetAlias, BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException

import airflow_kinesis_spark
from airflow_kinesis_spark.core.lag import trim_gap
from airflow_kinesis_spark.core.planner import (
    INITIAL_POSITIONS,
    BatchPlan,
    plan_incremental,
    validate_report,
)
from airflow_kinesis_spark.core.positions import (
    Checkpoint,
    Sentinel,
    format_timestamp,
    parse_timestamp,
)
from airflow_kinesis_spark.core.reader import READ_BYTES_PER_SECOND, probe_range
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport, StartPosition
from airflow_kinesis_spark.core.store import (
    DynamoDBCheckpointStore,
    validate_table_name,
)
from airflow_kinesis_spark.core.transform import check_transform_spec, resolve_transform
from airflow_kinesis_spark.core.window import (
    derive_slices,
    plan_window,
    validate_window,
    validate_window_report,
    window_label,
    window_summary,
)
from airflow_kinesis_spark.exceptions import (
    CheckpointConflictError,
    DataLossError,
    EndpointUnreachableError,
    ReportValidationError,
)
from airflow_kinesis_spark.hooks.consumer import ConsumerHooksMixin
from airflow_kinesis_spark.hooks.kinesis import validate_stream_name
from airflow_kinesis_spark.hooks.spark import BatchSparkSubmitHook
from airflow_kinesis_spark.lineage import asset_event_extra, asset_for_output, operator_lineage, output_uri

__all__ = ["KinesisToSparkOperator", "KinesisWindowToSparkOperator", "spark_script_path"]

# Consumer (application) names: as KCL application names, 1-128 of a-z A-Z 0-9 _ - .
_CONSUMER_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
SPARK_SCRIPT = "kinesis_batch.py"
#: The shortest retention period a stream can have (24 hours, Kinesis developer guide).
MIN_RETENTION = timedelta(hours=24)
#: Environment variables by which PySpark marks a process as a Spark Connect client.
#: Namespace of the Spark Connect session ids derived from a consumer (uuid5).
_CONNECT_SESSION_NAMESPACE = uuid.UUID("6d2f3c1e-8a4b-4f0e-9c57-1b2a3d4e5f60")


#: Session conf holding the digest of the artifacts a reused Spark Connect session already has.
_ARTIFACTS_CONF = "spark.airflow_kinesis_spark.artifacts_sha256"


def _files_digest(paths: Sequence[str]) -> str:
    """SHA-256 over the names and contents of ``paths``."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(os.path.basename(path).encode() + b"\0")
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def _with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port/;param=value...``) with its ``session_id`` parameter set."""
    base, _, params = url.partition("/;")
    base = base.rstrip("/")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    return f"{base}/;" + ";".join([*kept, f"session_id={session_id}"])


CONNECT_ENV_VARS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
#: How often an idle consumer records that its shards were empty up to the cutoff.
IDLE_REFRESH = timedelta(hours=1)
#: Seconds a Spark Connect server has to accept the gRPC channel (PySpark's own retries take minutes).
CONNECT_READY_TIMEOUT = 10.0


def spark_script_path() -> str:
    """Path of the PySpark job: inside the installed wheel, or ``spark_scripts/`` of a checkout."""
    package = Path(airflow_kinesis_spark.__file__).resolve().parent
    for candidate in (package / "spark_scripts" / SPARK_SCRIPT, package.parent / "spark_scripts" / SPARK_SCRIPT):
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(f"{SPARK_SCRIPT} is not shipped with airflow_kinesis_spark at {package}")


def _check_spark_connect(url: str, conn_id: str) -> None:
    """Fail fast when the Spark Connect server of ``url`` does not accept a gRPC channel.

    :raises EndpointUnreachableError: naming the connection and ``sc://host:port`` (never the token).
    """
    import grpc
    from pyspark.sql.connect.client import DefaultChannelBuilder

    builder = DefaultChannelBuilder(url)
    channel = builder.toChannel()
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_READY_TIMEOUT)
    except grpc.FutureTimeoutError:
        endpoint = f"sc://{builder.endpoint}"
        raise EndpointUnreachableError(
            f"Cannot reach the Spark Connect server of spark_connect connection {conn_id!r} at {endpoint} "
            f"within {CONNECT_READY_TIMEOUT:g} s. Check the connection's host, port and use_ssl, and that the "
            "server runs and this machine can reach it.",
            service="Spark Connect", endpoint=endpoint, source=f"spark_connect connection {conn_id!r}",
        ) from None  # fmt: skip
    finally:
        channel.close()


def _core_zip(directory: str) -> str:
    """Zip the Airflow-free part of ``airflow_kinesis_spark`` (core, transforms, exceptions) for Spark."""
    package = Path(airflow_kinesis_spark.__file__).resolve().parent
    target = Path(directory) / "airflow_kinesis_spark_core.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in [
            package / "__init__.py",
            package / "exceptions.py",
            *sorted((package / "core").glob("*.py")),
            *sorted((package / "transforms").glob("*.py")),
        ]:
            zf.write(path, f"airflow_kinesis_spark/{path.relative_to(package)}")
    return str(target)


def _die_with_parent() -> None:
    """In the spark-submit child: get SIGKILL when this worker process dies (Linux PR_SET_PDEATHSIG).

    A worker killed hard (OOM killer, ``kill -9``) would otherwise leave a local or client-mode
    Spark job running, which could write the batch's output after a retry started writing it.
    """
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG


def _check_local_output(path: str) -> None:
    """Fail early when a local output path cannot be written (remote paths are Spark's to check)."""
    parsed = urlparse(path)
    if parsed.scheme not in ("", "file"):
        return
    local = Path(parsed.path if parsed.scheme else path)
    probe = local
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"output_path {path!r} cannot be written: {str(probe)!r} is a file, not a directory")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"output_path {path!r} cannot be written: no write permission on {str(probe)!r}")


class KinesisToSparkOperator(ConsumerHooksMixin, BaseOperator):
    """Read every shard of a Kinesis stream from its checkpoint to the cutoff into Parquet, exactly once.

    One run is one batch of the batch protocol: **plan** (committed checkpoints + shard lineage,
    persisted in the checkpoint table before any record is read), **read** and **write** (a
    PySpark job submitted with the apache-spark provider's ``SparkSubmitHook``: one task per shard,
    Parquet at ``{output_path}/batch_id={N}``), **commit** (the job's per-shard report is
    validated against the plan, then every checkpoint advances in one conditional write).

    A failed run leaves its plan pending; the next attempt re-uses it (never replaces it), so a
    retry reads the same records and overwrites the same output. A run with no new records starts
    no Spark job and writes no files.

    .. seealso:: docs/operators.md

    :param stream_name: the Kinesis stream (templated).
    :param consumer_name: the consumer (application) name: the namespace of the checkpoints (templated).
    :param checkpoint_table: DynamoDB table of the checkpoints; created on first use (templated).
    :param output_path: root of the output; batch ``N`` goes to ``{output_path}/batch_id=N``. Any
        path Spark's Parquet writer takes (local, ``s3a://``, ...) (templated).
    :param transform: optional ``package.module:function`` taking and returning a pyspark
        DataFrame, applied before the write (templated).
    :param cutoff: records arriving at or after this time are left for the next batch (ISO 8601 or
        datetime, UTC). Default: the run's ``data_interval_end``; ``now`` for manual runs. Never
        later than the planning time (templated).
    :param initial_position: where a never-seen shard starts: ``TRIM_HORIZON`` (default),
        ``LATEST`` or ``AT_TIMESTAMP``. Children of checkpointed shards always start at
        ``TRIM_HORIZON`` (templated).
    :param initial_timestamp: with ``AT_TIMESTAMP`` (ISO 8601, UTC) (templated).
    :param max_records_per_shard: cap on user records read per shard per batch, or ``None``.
        An aggregated record is never cut: reading stops before an aggregate that would pass the
        cap, except the first one of the range, which is taken whole (so every batch moves on).
    :param max_bytes_per_shard: cap on Kinesis record bytes read per shard per batch, or ``None``.
    :param aws_conn_id: the ``aws`` connection for Kinesis and DynamoDB (templated).
    :param region_name: overrides the connection's region (templated).
    :param spark_conn_id: the Spark connection: type ``spark`` (spark-submit through the
        apache-spark provider; ``local[*]`` if the connection does not exist) or ``spark_connect``
        (the job runs over Spark Connect against a running server: no JVM start per batch).
    :param spark_conf: extra ``--conf`` of spark-submit (templated, JSON).
    :param spark_py_files: extra ``--py-files`` (comma-separated), e.g. for the transform's module.
    :param get_records_limit: ``Limit`` of each GetRecords call, 1..10,000 (Kinesis API reference).
    :param min_call_interval: seconds between two GetRecords calls on one shard; 0.2 matches the
        service's 5 calls per second per shard.
    :param read_bytes_per_second: the per-shard read budget (bytes per second) the readers pace
        themselves to: after a GetRecords response of B bytes a shard's next call waits
        B / budget seconds. The default, 2 MiB/s, is the service's per-shard read limit
        (Kinesis API reference, GetRecords); lower it when other consumers share the shards'
        budget, or ``None`` for no byte pacing (an emulator without limits).
    :param read_tasks: Spark tasks that read the shard ranges; each task reads its ranges at the
        same time, one thread per range. ``None``: Spark's default parallelism (at most one task
        per range).
    :param spark_connect_reuse_session: over Spark Connect, keep one server session per
        consumer (its id derived from stream and consumer names) across batches, so a warm batch
        pays neither an artifact upload nor a Python worker start. The server drops it after its
        idle timeout (``spark.connect.session.manager.defaultSessionTimeout``); a session it no
        longer accepts is replaced by a new one.
    :param lease_seconds: a run holding a pending batch renews its lease every third of this
        (seconds); another run may take the batch over (re-using its plan) only after the lease
        expired. Keep it below the task's ``retry_delay``.
    :param allow_data_loss: go on when records may be lost: a checkpointed shard vanished before
        ``SHARD_END``, or a checkpoint fell behind the trim horizon (records after it may have
        aged out). The gap is logged and reported in the summary; without this flag the run fails
        without retry and nothing is read (LOUD).
    :param output_asset: declare the output root as an Airflow Asset outlet (URI from
        ``lineage.output_uri``: ``file://`` for a local path, ``s3://`` for ``s3a://``; not for a
        templated or relative path), so DAGs scheduled on it run after each batch. Every
        successful run emits an asset event whose ``extra`` is the batch summary in short
        (``lineage.asset_event_extra``: ``batch_id``, ``records``, ``shards``, ``output_path``, ...),
        also a run without new records (``records`` 0: Airflow emits an event for every declared
        outlet). For events only when records were written, pass ``output_asset=False`` and
        ``outlets=[AssetAlias(...)]``: the operator adds the output asset's event to each alias
        outlet only when ``records`` > 0. OpenLineage: :meth:`get_openlineage_facets_on_complete`.
    :returns: (XCom) the batch summary: ``batch_id``, ``status`` (``committed``,
        ``committed_without_records`` or ``no_new_records``), ``stream_name``,
        ``consumer_name``, ``records``, ``bytes``, ``output_path``, ``quarantined`` (corrupt
        aggregates, kept raw under ``{output_path}/batch_id=N/_quarantine`` = ``quarantine_path``),
        ``out_of_range`` (aggregated user records outside their shard's hash key range, kept),
        ``cutoff``, ``reused_plan``,
        ``shards`` (per shard: ``records``, ``bytes``, ``first``, ``last``, ``checkpoint``,
        ``stop_reason``, ``shard_end``), ``waiting_shards`` (shard id -> reason) and
        ``lost_shards`` and ``trim_gaps`` (what was passed over with ``allow_data_loss``).
    :raises ValueError: bad arguments (names, caps, transform, output path), before anything is read.
    :raises StreamNotFoundError: the stream does not exist (names stream, region, endpoint).
    :raises AirflowFailException: (no retry) another run of this consumer moved the checkpoints
        (from :class:`CheckpointConflictError`), the job's report does not match the plan (from
        :class:`ReportValidationError`), or records would be lost (from :class:`DataLossError`).
        Nothing is committed.
    :raises RuntimeError: the Spark job failed; the plan stays pending for the next attempt.
    """

    template_fields: Sequence[str] = (
        "stream_name",
        "consumer_name",
        "checkpoint_table",
        "output_path",
        "transform",
        "cutoff",
        "initial_position",
        "initial_timestamp",
        "aws_conn_id",
        "region_name",
        "spark_conf",
    )
    template_fields_renderers = {"spark_conf": "json"}
    ui_color = "#f4a460"
    #: Whether runs read and advance the checkpoint store (window mode does not).
    uses_checkpoints = True

    def __init__(
        self,
        *,
        stream_name: str,
        consumer_name: str,
        checkpoint_table: str,
        output_path: str,
        transform: str | None = None,
        cutoff: str | datetime | None = None,
        initial_position: str = "TRIM_HORIZON",
        initial_timestamp: str | datetime | None = None,
        max_records_per_shard: int | None = None,
        max_bytes_per_shard: int | None = None,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        spark_conn_id: str = "spark_default",
        spark_conf: dict[str, Any] | None = None,
        spark_py_files: str | None = None,
        get_records_limit: int = 10_000,
        min_call_interval: float = 0.2,
        read_bytes_per_second: float | None = READ_BYTES_PER_SECOND,
        read_tasks: int | None = None,
        spark_connect_reuse_session: bool = True,
        allow_data_loss: bool = False,
        lease_seconds: float = 120.0,
        output_asset: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.lease_seconds = lease_seconds
        self.output_asset = output_asset
        if output_asset and (uri := output_uri(output_path)) and not any(getattr(o, "uri", None) == uri for o in self.outlets):
            self.outlets = [*self.outlets, asset_for_output(output_path)]
        self._outcome: dict[str, Any] | None = None  # the last run's summary, for lineage
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.output_path = output_path
        self.transform = transform
        self.cutoff = cutoff
        self.initial_position = initial_position
        self.initial_timestamp = initial_timestamp
        self.max_records_per_shard = max_records_per_shard
        self.max_bytes_per_shard = max_bytes_per_shard
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.spark_py_files = spark_py_files
        self.get_records_limit = get_records_limit
        self.min_call_interval = min_call_interval
        self.read_bytes_per_second = read_bytes_per_second
        self.read_tasks = read_tasks
        self.spark_connect_reuse_session = spark_connect_reuse_session
        self.allow_data_loss = allow_data_loss
        self._spark_hook: BatchSparkSubmitHook | None = None


    # -- validation ----------------------------------------------------------------------------

    def validate(self) -> None:
        """Check every argument; called first in :meth:`execute`, before any I/O.

        :raises ValueError: naming the argument, the problem and the fix.
        """
        validate_stream_name(self.stream_name)
        if self.uses_checkpoints:
            validate_table_name(self.checkpoint_table)
        if not isinstance(self.consumer_name, str) or not _CONSUMER_NAME.match(self.consumer_name):
            raise ValueError(
                f"consumer_name {self.consumer_name!r} is not valid: use 1-128 characters of a-z, A-Z, 0-9, '_', '-', '.'"
            )
        for name in ("max_records_per_shard", "max_bytes_per_shard"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None; got {value!r}")
        if not 1 <= int(self.get_records_limit) <= 10_000:
            raise ValueError(f"get_records_limit must be 1..10,000 (GetRecords Limit); got {self.get_records_limit!r}")
        if not self.lease_seconds or self.lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0 seconds; got {self.lease_seconds!r}")
        if self.min_call_interval < 0:
            raise ValueError(f"min_call_interval must be >= 0 seconds; got {self.min_call_interval!r}")
        if self.read_bytes_per_second is not None and not self.read_bytes_per_second > 0:
            raise ValueError(
                f"read_bytes_per_second must be > 0 (bytes per second per shard) or None; got {self.read_bytes_per_second!r}"
            )
        if self.read_tasks is not None and (isinstance(self.read_tasks, bool) or not isinstance(self.read_tasks, int) or self.read_tasks < 1):
            raise ValueError(f"read_tasks must be a positive integer or None; got {self.read_tasks!r}")
        if self.initial_position not in INITIAL_POSITIONS:
            raise ValueError(f"initial_position must be one of {', '.join(INITIAL_POSITIONS)}; got {self.initial_position!r}")
        if self.initial_position == "AT_TIMESTAMP" and not self.initial_timestamp:
            raise ValueError("initial_position='AT_TIMESTAMP' needs initial_timestamp (ISO 8601, UTC)")
        if not self.output_path or not isinstance(self.output_path, str):
            raise ValueError("output_path is required: a directory Spark can write Parquet to")
        _check_local_output(self.output_path)
        for name in ("cutoff", "initial_timestamp"):
            value = getattr(self, name)
            if value:
                try:
                    parse_timestamp(value)
                except (TypeError, ValueError) as err:
                    raise ValueError(f"{name}: {err}") from err
        if self.transform:
            check_transform_spec(self.transform)
            if not self.spark_py_files:
                # Shipped with spark_py_files, the module need not import here; the job checks it
                # before reading anything.
                resolve_transform(self.transform)

    # -- the batch -----------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        self.validate()
        try:
            summary = self._run_batch(context)
        except (CheckpointConflictError, ReportValidationError, DataLossError) as err:
            # A retry cannot help: another writer won, the job disagrees with its plan, or
            # records would be lost. Fail without retries; nothing was committed.
            raise AirflowFailException(str(err)) from err
        self._publish(context, summary)
        return summary

    def _publish(self, context: Context, summary: dict[str, Any]) -> None:
        """Put the batch summary on the output asset's event (see ``output_asset``); keep it for lineage."""
        self._outcome = summary
        events = context.get("outlet_events")
        uri = output_uri(self.output_path)
        if events is None or uri is None:
            return
        extra = asset_event_extra(summary)
        for outlet in self.outlets:
            if isinstance(outlet, Asset) and outlet.uri == uri:
                events[outlet].extra = extra
                self.log.info("Asset event for %s: batch %s, %d records", uri, extra["batch_id"], extra["records"])
            elif isinstance(outlet, AssetAlias) and extra["records"]:
                events[outlet].add(asset_for_output(self.output_path), extra=extra)
                self.log.info("Asset event for %s through alias %s: batch %s, %d records", uri, outlet.name,
                              extra["batch_id"], extra["records"])  # fmt: skip

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage datasets (``lineage.operator_lineage``): the stream (namespace
        ``kinesis://{region}``) in, the output root out, with the run's record counts."""
        try:
            region = self.region_name or self.kinesis_hook.conn_region_name
        except Exception:  # noqa: BLE001 - lineage must not fail for want of a region
            region = self.region_name
        return operator_lineage(stream_name=self.stream_name, region=region, output_path=self.output_path, summary=self._outcome)

    def _run_batch(self, context: Context) -> dict[str, Any]:
        store = self.checkpoint_hook.get_store(self.checkpoint_table, self.stream_name, self.consumer_name)
        owner = self._owner(context)
        store.ensure_table()
        head = store.head()
        plan = store.pending_plan(head)
        reports: list[ShardReport] | None = None
        records_expected = False  # a resumed batch is read with no expectation
        reused = plan is not None
        if plan is not None:
            self.log.info(
                "Re-using the pending plan of batch %d (planned %s, cutoff %s, %d shard ranges)",
                plan.batch_id, format_timestamp(plan.created_at), format_timestamp(plan.cutoff), len(plan.ranges),
            )  # fmt: skip
            head = store.take_over(plan.batch_id, owner, self.lease_seconds)
            reports = store.pending_report(head)
            if reports is not None:
                self.log.info("Batch %d's output was already written; committing without re-running Spark", plan.batch_id)
        else:
            plan = self._plan(store, head.committed_batch_id + 1, context)
            if not plan.ranges:
                self.log.info("No shard to read: every shard is at SHARD_END or waiting for its parents (%s)", plan.waiting)
                return self._summary(plan, [], plan.checkpoints, "no_new_records", reused)
            probes = self._probe(plan)
            if not any(r.records or r.quarantined for r in probes):
                return self._commit_without_records(store, plan, probes, owner)
            records_expected = any(r.records for r in probes)
            store.begin(plan, owner)
        if reports is None:
            with self._lease(store, plan.batch_id, owner):
                reports = self._run_spark(plan, records_expected)
            checkpoints = validate_report(plan, reports)
            store.record_report(plan.batch_id, owner, reports)
        else:
            checkpoints = validate_report(plan, reports)
        store.commit(plan, checkpoints, owner)
        summary = self._summary(plan, reports, checkpoints, "committed", reused)
        self.log.info(
            "Batch %d committed: %d records from %d shards, output %s",
            plan.batch_id, summary["records"], len(plan.ranges), plan.output_location,
        )  # fmt: skip
        return summary

    @contextmanager
    def _lease(self, store: DynamoDBCheckpointStore, batch_id: int, owner: str) -> Iterator[None]:
        """Renew the lease on the pending batch while the Spark job runs.

        If another writer took the batch over (this run stalled past its lease), the Spark job
        is killed at once and the run fails: its output must not race the other writer's.
        """
        done = threading.Event()
        fenced: list[CheckpointConflictError] = []

        def renew() -> None:
            while not done.wait(self.lease_seconds / 3):
                try:
                    store.heartbeat(batch_id, owner)
                except CheckpointConflictError as err:
                    fenced.append(err)
                    self.log.error("Lost the lease on batch %d: %s. Killing the Spark job.", batch_id, err)
                    self.on_kill()
                    return
                except Exception as err:  # noqa: BLE001 - a missed heartbeat is retried next time
                    self.log.warning("Could not renew the lease on batch %d: %s", batch_id, err)

        thread = threading.Thread(target=renew, name=f"lease-batch-{batch_id}", daemon=True)
        thread.start()
        try:
            yield
        except Exception:
            done.set()
            thread.join(timeout=10)
            if fenced:
                raise fenced[0] from None
            store.release(batch_id, owner)  # this run stops here: its retry need not wait for the lease
            raise
        finally:
            done.set()
            thread.join(timeout=10)
        if fenced:
            raise fenced[0]

    def _plan(self, store: DynamoDBCheckpointStore, batch_id: int, context: Context) -> BatchPlan:
        now = datetime.now(timezone.utc)
        cutoff = self._cutoff(context, now)
        shards = self.kinesis_hook.list_shards(self.stream_name)
        plan = plan_incremental(
            batch_id=batch_id,
            stream_name=self.stream_name,
            consumer_name=self.consumer_name,
            shards=shards,
            checkpoints=store.committed_checkpoints(),
            cutoff=cutoff,
            now=now,
            output_location=f"{self.output_path.rstrip('/')}/batch_id={batch_id}",
            initial_position=self.initial_position,
            initial_timestamp=parse_timestamp(self.initial_timestamp) if self.initial_timestamp else None,
            max_records_per_shard=self.max_records_per_shard,
            max_bytes_per_shard=self.max_bytes_per_shard,
            allow_data_loss=self.allow_data_loss,
        )
        gaps = self._trim_gaps(plan, now)
        if gaps:
            detail = "; ".join(f"{k}: {v}" for k, v in sorted(gaps.items()))
            if not self.allow_data_loss:
                raise DataLossError(
                    f"Checkpoints of consumer {self.consumer_name!r} fell behind the trim horizon of stream "
                    f"{self.stream_name!r}: {detail}. Records after them may have aged out unread. Nothing was "
                    "read. To go on from the oldest records kept (TRIM_HORIZON), re-run with allow_data_loss=True.",
                    trim_gaps=gaps,
                )
            self.log.warning("Going on from the oldest records kept (allow_data_loss=True): %s", detail)
            from_horizon = Checkpoint(Sentinel.TRIM_HORIZON)
            ranges = tuple(
                replace(r, start=StartPosition.after(from_horizon), start_checkpoint=from_horizon) if r.shard_id in gaps else r
                for r in plan.ranges
            )
            plan = replace(plan, ranges=ranges, trim_gaps=gaps)
        for rng in plan.ranges:
            self.log.info("Plan batch %d: shard %s from %s to cutoff %s", batch_id, rng.shard_id, rng.start, format_timestamp(rng.cutoff))
        return plan

    def _trim_gaps(self, plan: BatchPlan, now: datetime) -> dict[str, str]:
        """Shards whose checkpoint may have fallen behind the trim horizon (see ``lag.trim_gap``).

        Costs nothing while every checkpoint is known good within 24 hours (the shortest
        retention period, Kinesis developer guide); otherwise one DescribeStreamSummary and one
        TRIM_HORIZON probe per doubtful shard.
        """
        def known_until(rng: ShardRange) -> datetime | None:
            return rng.start_checkpoint.clear_until or rng.start_checkpoint.timestamp

        doubtful = [
            r for r in plan.ranges
            if r.start_checkpoint.sentinel is not Sentinel.TRIM_HORIZON
            and ((known_until(r) is None) or known_until(r) < now - MIN_RETENTION)  # type: ignore[operator]
        ]  # fmt: skip
        if not doubtful:
            return {}
        retention = float(self.kinesis_hook.describe_stream_summary(plan.stream_name)["RetentionPeriodHours"])
        horizon = now - timedelta(hours=retention)
        gaps = {}
        for rng in doubtful:
            oldest = probe_range(
                self.kinesis_hook.conn, plan.stream_name,
                ShardRange(rng.shard_id, StartPosition("TRIM_HORIZON"), Checkpoint(Sentinel.TRIM_HORIZON), now,
                           rng.ending_sequence_number),
                min_call_interval=self.min_call_interval,
            )  # fmt: skip
            oldest_seq = oldest.first.sequence_number if oldest.first else None
            if trim_gap(rng.start_checkpoint, oldest_seq, oldest.first_arrival, horizon):
                gaps[rng.shard_id] = (
                    f"checkpoint {rng.start_checkpoint}, oldest record kept {oldest_seq} "
                    f"(retention {retention:g} h, trim horizon {format_timestamp(horizon)})"
                )
        return gaps

    def _cutoff(self, context: Context, now: datetime) -> datetime:
        if self.cutoff:
            return parse_timestamp(self.cutoff)
        dag_run = context.get("dag_run")
        run_type = str(getattr(dag_run, "run_type", "") or "").lower()
        interval_end = context.get("data_interval_end")
        if interval_end is None or "manual" in run_type:
            return now
        return parse_timestamp(interval_end)

    def _probe(self, plan: BatchPlan) -> list[ShardReport]:
        """Look for a first record in every range (``Limit`` 1), in parallel threads."""
        client = self.kinesis_hook.conn
        with ThreadPoolExecutor(max_workers=min(16, len(plan.ranges))) as pool:
            return list(pool.map(lambda rng: probe_range(client, plan.stream_name, rng, min_call_interval=self.min_call_interval), plan.ranges))

    def _commit_without_records(
        self, store: DynamoDBCheckpointStore, plan: BatchPlan, probes: list[ShardReport], owner: str
    ) -> dict[str, Any]:
        """No planned range has a record: skip Spark. Commit only if a checkpoint must be recorded
        (a new shard's starting position, or a shard's end)."""
        checkpoints = validate_report(plan, probes)
        newly_ended = [k for k, v in checkpoints.items() if v.is_shard_end and not (plan.checkpoints.get(k) or v).is_shard_end]
        new_shards = sorted(set(checkpoints) - set(plan.checkpoints))
        # Record, at most hourly, that idle shards were seen empty up to the cutoff: otherwise a
        # stream idle for longer than its retention period would look like lost data.
        stale = [
            r.shard_id for r in plan.ranges
            if (r.start_checkpoint.clear_until or r.start_checkpoint.timestamp or plan.cutoff) < plan.cutoff - IDLE_REFRESH
            or (r.start_checkpoint.position is not None and r.start_checkpoint.clear_until is None)
        ]  # fmt: skip
        if not newly_ended and not new_shards and not stale:
            self.log.info("No new records in %d shards before cutoff %s: no Spark job, no files, no batch", len(plan.ranges), format_timestamp(plan.cutoff))
            return self._summary(plan, probes, plan.checkpoints, "no_new_records", False)
        self.log.info(
            "No new records; recording checkpoints without a Spark job (new shards: %s; shards ended: %s; "
            "idle shards seen empty up to the cutoff: %s)",
            new_shards, newly_ended, stale,
        )  # fmt: skip
        store.begin(plan, owner)
        store.commit(plan, checkpoints, owner)
        return self._summary(plan, probes, checkpoints, "committed_without_records", False)

    def _spark_hook_for(self, plan: BatchPlan, plan_file: str, report_file: str, py_files: str,
                        records_expected: bool) -> BatchSparkSubmitHook:
        application_args = [
            "--plan-file", plan_file, "--report-file", report_file,
            "--limit", str(self.get_records_limit), "--min-call-interval", str(self.min_call_interval),
            "--read-bytes-per-second", str(self.read_bytes_per_second or 0), "--read-tasks", str(self.read_tasks or 0),
        ]  # fmt: skip
        if self.transform:
            application_args += ["--transform", self.transform]
        if records_expected:
            application_args.append("--records-expected")
        py_files = ",".join(p for p in (py_files, self.spark_py_files) if p)
        name = f"kinesis-batch-{plan.stream_name}-{plan.consumer_name}-{plan.batch_id}"

        def build(env: dict[str, str] | None) -> BatchSparkSubmitHook:
            return BatchSparkSubmitHook(
                conf=dict(self.spark_conf or {}), conn_id=self.spark_conn_id, py_files=py_files,
                application_args=application_args, env_vars=env, name=name,
            )  # fmt: skip

        # On YARN and Kubernetes the provider turns env_vars into --conf options on the command
        # line; credentials must not go there, so the cluster's own role is used instead.
        on_command_line = build(None).env_goes_on_command_line
        if on_command_line:
            self.log.info("Spark master is YARN/Kubernetes: the job uses the cluster's AWS credentials")
        env = self.kinesis_hook.spark_environment(include_credentials=not on_command_line)
        env.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))
        venv_bin = Path(sys.executable).parent
        if not on_command_line and not shutil.which("spark-submit") and (venv_bin / "spark-submit").exists():
            # pyspark installs spark-submit next to this interpreter, which may not be on PATH
            # (a virtualenv that was not activated).
            self.log.info("spark-submit is not on PATH; using the one installed with pyspark in %s", venv_bin)
            env["PATH"] = os.pathsep.join(p for p in (str(venv_bin), os.environ.get("PATH", "")) if p)
        hook = build(env)
        return hook

    def _reader_options(self, records_expected: bool) -> dict[str, Any]:
        """The job's reader settings (``kinesis_batch.reader_options`` builds the same from its arguments)."""
        return {
            "limit": self.get_records_limit,
            "min_call_interval": self.min_call_interval,
            "read_bytes_per_second": self.read_bytes_per_second,
            "read_tasks": self.read_tasks,
            "records_expected": records_expected,
        }

    def _spark_conn_type(self) -> str | None:
        """The ``spark_conn_id`` connection's type, ``None`` when it does not exist."""
        from airflow.sdk import BaseHook

        try:
            return BaseHook.get_connection(self.spark_conn_id).conn_type
        except Exception:  # noqa: BLE001 - any lookup failure means "no such connection"
            return None

    def _run_spark(self, plan: BatchPlan, records_expected: bool) -> list[ShardReport]:
        """Run the batch's Spark job: over Spark Connect for a ``spark_connect`` connection, else
        spark-submit. ``records_expected``: the probes saw a user record, so the job reads and
        writes in one pass."""
        if self._spark_conn_type() == "spark_connect":
            return self._run_spark_connect(plan, records_expected)
        return self._run_spark_submit(plan, records_expected)

    def _run_spark_connect(self, plan: BatchPlan, records_expected: bool) -> list[ShardReport]:
        """Run the job in this process against a running Spark Connect server (no JVM start).

        The job is the same code as spark-submit runs (``spark_scripts/kinesis_batch.py``); the
        Airflow-free part of the package is shipped to the server as a session artifact.
        Credentials travel inside the read function to the server's Python workers, never in the
        plan, the URL or a log line.
        """
        import importlib.util

        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from pyspark.sql import SparkSession

        spec = importlib.util.spec_from_file_location("airflow_kinesis_spark_batch_job", spark_script_path())
        job = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(job)  # type: ignore[union-attr]
        transform = resolve_transform(self.transform) if self.transform else None
        url = SparkConnectHook(conn_id=self.spark_conn_id).get_connection_url()
        self.log.info("Running the Spark job of batch %d over Spark Connect (%d shard ranges)", plan.batch_id, len(plan.ranges))
        _check_spark_connect(url, self.spark_conn_id)
        # PySpark marks the whole process as a Spark Connect client in os.environ; a spark-submit
        # started later from this process would inherit it and fail. Put the environment back after.
        saved = {k: os.environ.get(k) for k in CONNECT_ENV_VARS}
        spark = None
        try:
            with tempfile.TemporaryDirectory(prefix=f"kinesis-batch-{plan.batch_id}-") as tmp:
                artifacts = [_core_zip(tmp), *filter(None, (self.spark_py_files or "").split(","))]
                spark = self._connect_session(SparkSession, url, plan, artifacts)
                result = job.run(spark, plan.to_dict(), transform, self.kinesis_hook.spark_environment(),
                                 self._reader_options(records_expected))  # fmt: skip
        except Exception as err:
            raise RuntimeError(
                f"The Spark job of {self._what(plan)} failed over Spark Connect: {err}. {self._after_failure()}"
            ) from err
        finally:
            if spark is not None:
                spark.stop()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        self.log.info(
            "Spark job of batch %d: %d records read in %.1fs, %.1fs in all",
            plan.batch_id, result["records"], result["read_seconds"], result["total_seconds"],
        )  # fmt: skip
        return [ShardReport.from_dict(r) for r in result["reports"]]

    def _connect_session(self, session_cls: Any, url: str, plan: BatchPlan, artifacts: list[str]) -> Any:
        """A Spark Connect session with the job's code added as artifacts.

        With ``spark_connect_reuse_session`` the session id is derived from the stream and the
        consumer, and the session is not released when the run ends: the next batch of this
        consumer finds its artifacts and warm Python workers on the server (no worker start, and
        no upload: the artifacts' digest is kept in the session's conf). A session the server no
        longer accepts (expired, released, or holding other artifacts) is left to the server and
        this run uses a new one, released at its end.
        """
        if self.spark_connect_reuse_session:
            session_id = str(uuid.uuid5(_CONNECT_SESSION_NAMESPACE, f"{type(self).__name__}/{plan.stream_name}/{plan.consumer_name}"))
            spark = None
            try:
                spark = session_cls.builder.remote(_with_session_id(url, session_id)).getOrCreate()
                spark.release_session_on_close = False
                digest = _files_digest(artifacts)
                if spark.conf.get(_ARTIFACTS_CONF, None) != digest:  # not uploaded to this session yet
                    for artifact in artifacts:
                        spark.addArtifacts(artifact, pyfile=True)
                    spark.conf.set(_ARTIFACTS_CONF, digest)
                return spark
            except Exception as err:  # noqa: BLE001 - any refusal: fall back to a new session
                self.log.info("Spark Connect session %s not reusable (%s); starting a new one", session_id, err)
                if spark is not None:
                    # Close this client only: the server session may serve another run of the
                    # consumer (a window re-run) right now, so it is not released.
                    spark.release_session_on_close = False
                    spark.stop()
        spark = session_cls.builder.remote(url).getOrCreate()
        for artifact in artifacts:
            spark.addArtifacts(artifact, pyfile=True)
        return spark

    def _run_spark_submit(self, plan: BatchPlan, records_expected: bool) -> list[ShardReport]:
        with tempfile.TemporaryDirectory(prefix=f"kinesis-batch-{plan.batch_id}-") as tmp:
            plan_file = os.path.join(tmp, "plan.json")
            report_file = os.path.join(tmp, "report.json")
            with open(plan_file, "w", encoding="utf-8") as fh:
                json.dump(plan.to_dict(), fh)
            hook = self._spark_hook_for(plan, plan_file, report_file, _core_zip(tmp), records_expected)
            self._spark_hook = hook
            self.log.info("Submitting the Spark job of batch %d (%d shard ranges)", plan.batch_id, len(plan.ranges))
            try:
                hook.submit(application=spark_script_path(), preexec_fn=_die_with_parent)
            except Exception as err:
                raise RuntimeError(
                    f"The Spark job of {self._what(plan)} failed: {err} (spark connection {self.spark_conn_id!r}). "
                    f"{self._after_failure()}"
                ) from err
            finally:
                self._spark_hook = None
            if not os.path.exists(report_file):
                raise RuntimeError(f"The Spark job of batch {plan.batch_id} ended without a report; no checkpoint moved")
            with open(report_file, encoding="utf-8") as fh:
                result = json.load(fh)
        self.log.info(
            "Spark job of batch %d: %d records read in %.1fs, %.1fs in all",
            plan.batch_id, result["records"], result["read_seconds"], result["total_seconds"],
        )  # fmt: skip
        return [ShardReport.from_dict(r) for r in result["reports"]]

    @staticmethod
    def _what(plan: BatchPlan) -> str:
        if plan.mode == "window":
            return f"window [{format_timestamp(plan.window_start)}, {format_timestamp(plan.cutoff)})"  # type: ignore[arg-type]
        return f"batch {plan.batch_id}"

    def _after_failure(self) -> str:
        if self.uses_checkpoints:
            return "No checkpoint moved; the plan stays pending and the next attempt re-uses it."
        return "A re-run reads the same window and overwrites its output."

    def on_kill(self) -> None:
        if self._spark_hook is not None:
            self._spark_hook.on_kill()

    # -- helpers -------------------------------------------------------------------------------

    def _owner(self, context: Context) -> str:
        """A readable, unique writer id for the checkpoint store's fencing."""
        ti = context.get("ti") or context.get("task_instance")
        if ti is not None:
            base = f"{ti.dag_id}.{ti.task_id}.{ti.run_id}.try{ti.try_number}"
        else:
            base = f"{self.dag_id}.{self.task_id}" if self.has_dag() else self.task_id
        return re.sub(r"[#\s]", "_", f"{base}.{uuid.uuid4().hex[:8]}")

    def _summary(
        self, plan: BatchPlan, reports: list[ShardReport], checkpoints: dict[str, Checkpoint] | Any, status: str, reused: bool
    ) -> dict[str, Any]:
        shards = {
            r.shard_id: {
                "records": r.records,
                "bytes": r.bytes,
                "first": str(r.first) if r.first else None,
                "last": str(r.last) if r.last else None,
                "checkpoint": str(checkpoints[r.shard_id]) if r.shard_id in checkpoints else None,
                "stop_reason": r.stop_reason,
                "shard_end": r.shard_end,
                "quarantined": r.quarantined,
                "out_of_range": r.out_of_range,
            }
            for r in reports
        }
        quarantined = sum(r.quarantined for r in reports) if status == "committed" else 0
        records = sum(r.records for r in reports) if status == "committed" else 0
        return {
            "batch_id": plan.batch_id if status != "no_new_records" else None,
            "status": status,
            "stream_name": plan.stream_name,
            "consumer_name": plan.consumer_name,
            "records": records,
            "bytes": sum(r.bytes for r in reports) if status == "committed" else 0,
            "output_path": plan.output_location if records else None,
            "quarantined": quarantined,
            "quarantine_path": f"{plan.output_location}/_quarantine" if quarantined else None,
            "out_of_range": sum(r.out_of_range for r in reports) if status == "committed" else 0,
            "cutoff": format_timestamp(plan.cutoff),
            "reused_plan": reused,
            "shards": shards,
            "waiting_shards": dict(plan.waiting),
            "lost_shards": list(plan.lost_shards),
            "trim_gaps": dict(plan.trim_gaps),
        }


class KinesisWindowToSparkOperator(KinesisToSparkOperator):
    """Read a past time window ``[window_start, window_end)`` of a stream into Parquet (backfill).

    Window mode of :class:`KinesisToSparkOperator`, with all of its machinery (Spark job, transform,
    credentials, validation). Every shard that may have been open during the window is read,
    closed ones included, from an ``AT_TIMESTAMP window_start`` iterator to the first record
    arriving at or after ``window_end``. Output goes to ``{output_path}/window={label}`` (see
    ``core.window.window_label``), overwritten on re-run: the same window gives the same rows, so
    Airflow backfills and cleared task instances simply work. The incremental checkpoints are
    never read or moved.

    With few shards, each shard's window is cut into time slices read in parallel.

    .. seealso:: docs/backfill.md

    :param stream_name: the stream (templated).
    :param output_path: root of the output (templated).
    :param window_start: the window's start, inclusive (ISO 8601 or datetime, UTC). Default: the
        run's ``data_interval_start`` (templated).
    :param window_end: the window's end, exclusive. Default: the run's ``data_interval_end``
        (templated). Must not be in the future.
    :param time_slices: slices per shard (1..64); ``None`` derives them: one per ``slice_length``
        of window, no more than needed to give ``parallelism`` Spark tasks work.
    :param slice_length: the shortest slice worth a task when deriving (default 15 minutes).
    :param parallelism: Spark tasks to keep busy when deriving; default ``spark.default.parallelism``
        from ``spark_conf``, else the CPU count.
    :param consumer_name: only names the Spark application (default ``window``).
    :param allow_data_loss: read a window that starts before the trim horizon, reporting the gap;
        without it such a window fails without retry.
    :returns: (XCom) ``mode`` ``window``, ``status`` (``written`` or ``no_records``),
        ``stream_name``, ``window_start``, ``window_end``, ``records``, ``bytes``, ``output_path``,
        ``quarantined``, ``quarantine_path``, ``out_of_range``, ``time_slices``, ``shards`` (per
        shard ``records``, ``bytes``, ``slices``, ``quarantined``, ``out_of_range``), ``trim_gap``.
    :raises AirflowFailException: the window starts before the trim horizon (without
        ``allow_data_loss``).
    :raises ValueError: ``window_start >= window_end``, an end in the future, or other bad arguments.

    Other parameters are those of :class:`KinesisToSparkOperator`; its checkpoint-related ones
    (``initial_position``, ``initial_timestamp``, ``cutoff``, the caps, ``lease_seconds``) are
    checked but have no effect here, and ``checkpoint_table`` is not accepted.
    """

    template_fields: Sequence[str] = (*KinesisToSparkOperator.template_fields, "window_start", "window_end")
    uses_checkpoints = False

    def __init__(
        self,
        *,
        stream_name: str,
        output_path: str,
        window_start: str | datetime | None = "{{ data_interval_start }}",
        window_end: str | datetime | None = "{{ data_interval_end }}",
        time_slices: int | None = None,
        slice_length: timedelta = timedelta(minutes=15),
        parallelism: int | None = None,
        consumer_name: str = "window",
        **kwargs: Any,
    ) -> None:
        super().__init__(stream_name=stream_name, consumer_name=consumer_name, checkpoint_table="", output_path=output_path, **kwargs)
        self.window_start = window_start
        self.window_end = window_end
        self.time_slices = time_slices
        self.slice_length = slice_length
        self.parallelism = parallelism

    def _window(self) -> tuple[datetime, datetime]:
        bounds = []
        for name in ("window_start", "window_end"):
            value = getattr(self, name)
            if value in (None, "", "None"):
                raise ValueError(
                    f"{name} is not set and the run has no data interval: pass window_start and window_end "
                    "(ISO 8601, UTC), or run the DAG on a schedule / as a backfill"
                )
            try:
                bounds.append(parse_timestamp(value))
            except (TypeError, ValueError) as err:
                raise ValueError(f"{name}: {err}") from err
        if self.time_slices is not None and (isinstance(self.time_slices, bool) or not 1 <= int(self.time_slices) <= 64):
            raise ValueError(f"time_slices must be 1..64 or None; got {self.time_slices!r}")
        if not isinstance(self.slice_length, timedelta) or self.slice_length <= timedelta(0):
            raise ValueError(f"slice_length must be a positive timedelta; got {self.slice_length!r}")
        return bounds[0], bounds[1]

    def _run_batch(self, context: Context) -> dict[str, Any]:
        start, end = self._window()
        now = datetime.now(timezone.utc)
        validate_window(start, end, now=now)  # cheap checks before any call
        retention = float(self.kinesis_hook.describe_stream_summary(self.stream_name)["RetentionPeriodHours"])
        gap = validate_window(start, end, now=now, trim_horizon=now - timedelta(hours=retention), allow_data_loss=self.allow_data_loss)
        if gap:
            self.log.warning("Reading what exists of the window (allow_data_loss=True): %s", gap)
        shards = self.kinesis_hook.list_shards(self.stream_name, {"Type": "FROM_TIMESTAMP", "Timestamp": start})
        parallelism = self.parallelism or int((self.spark_conf or {}).get("spark.default.parallelism", os.cpu_count() or 2))
        slices = self.time_slices or derive_slices(start, end, len(shards), slice_length=self.slice_length, parallelism=parallelism)
        plan = plan_window(
            stream_name=self.stream_name, consumer_name=self.consumer_name, shards=shards, start=start, end=end,
            slices=int(slices), now=now, output_location=f"{self.output_path.rstrip('/')}/window={window_label(start, end)}",
        )  # fmt: skip
        self.log.info(
            "Window [%s, %s): %d shards x %d time slices, output %s",
            format_timestamp(start), format_timestamp(end), len(shards), slices, plan.output_location,
        )  # fmt: skip
        probes = self._probe(plan)
        found = any(r.records or r.quarantined for r in probes)
        reports = self._run_spark(plan, any(r.records for r in probes)) if found else probes
        validate_window_report(plan, reports)
        records = sum(r.records for r in reports)
        if not found:
            self.log.info("No records in the window: no Spark job, no files")
        summary = {
            "mode": "window",
            "status": "written" if found else "no_records",
            "stream_name": self.stream_name,
            "window_start": format_timestamp(start),
            "window_end": format_timestamp(end),
            "records": records,
            "bytes": sum(r.bytes for r in reports),
            "output_path": plan.output_location if records else None,
            "quarantined": sum(r.quarantined for r in reports),
            "quarantine_path": f"{plan.output_location}/_quarantine" if any(r.quarantined for r in reports) else None,
            "out_of_range": sum(r.out_of_range for r in reports),
            "time_slices": int(slices),
            "shards": window_summary(reports),
            "trim_gap": gap,
        }
        self.log.info("Window written: %d records from %d shards to %s", records, len(summary["shards"]), summary["output_path"])
        return summary
