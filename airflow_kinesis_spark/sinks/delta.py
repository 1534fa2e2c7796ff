"""Delta Lake tables, committed with ``deltalake`` (delta-rs) on the worker: one commit per batch.

- **Table.** At ``output_path`` (local, ``s3://``). Created by the first batch's commit with the
  schema of its files, partitioned by the DAG author's columns (default ``arrival_date``, the UTC
  date of ``approximate_arrival_timestamp``, which the job adds to every row).
- **Files.** Spark writes Parquet under ``{output_path}/batch_id=N``, one partition per file;
  the partition columns stay in the files too (as Delta's IcebergCompat writers keep them), and
  each file's add action carries its partition values, size and column statistics (from the
  Parquet footer).
- **Exactly once.** The commit of batch N carries the transaction identifier
  ``txn(appId = airflow-kinesis-spark:{stream}:{consumer}, version = N)`` and, in its commit
  info, the batch id and the plan's creation time. Before committing,
  ``DeltaTable.transaction_version(appId)`` is read: ``>= N`` and the batch's own commit in the
  table's recent history means the batch is in the table (a re-run after a crash between the
  table commit and the checkpoint commit, or after an ambiguous commit) and nothing is added;
  ``>= N`` without it means the table outran the checkpoint store (reset checkpoints): the commit
  fails (``TableCommitError``) rather than skip or duplicate rows. Concurrent writers conflict through delta-rs's commit
  protocol; on S3 that needs a locking provider or conditional writes in ``storage_options``
  (delta-rs: ``AWS_S3_LOCKING_PROVIDER=dynamodb`` with ``DELTA_DYNAMO_TABLE_NAME``, or
  ``aws_conditional_put``), as the library documents.
- **Windows.** One commit replaces the window's rows of this stream: it removes the table's files
  that lie wholly inside the window (by their ``approximate_arrival_timestamp`` statistics) and
  adds the window's files; when files straddle the window's bounds, delta-rs's predicate
  overwrite rewrites them and writes the window's rows instead (read into the worker's memory).
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.exceptions import TableCommitError
from airflow_kinesis_spark.sinks import BatchMark, OutputSpec, PartitionField, Sink, TableCommit, plan_marker
from airflow_kinesis_spark.sinks.conflicts import retry_on_conflict
from airflow_kinesis_spark.sinks.files import DataFile, filesystem, list_data_files, read_schema, table_uri

if TYPE_CHECKING:
    from airflow_kinesis_spark.core.planner import BatchPlan
    from airflow_kinesis_spark.core.ranges import ShardReport

log = logging.getLogger(__name__)

__all__ = ["DeltaSink", "app_id", "DEFAULT_PARTITION", "ARRIVAL_DATE"]

#: The column the job adds for the default partitioning: the UTC date of arrival.
ARRIVAL_DATE = "arrival_date"
DEFAULT_PARTITION = (ARRIVAL_DATE,)

_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

#: Commits of the table's history searched for a batch's own commit when its transaction says the
#: batch is in the table (a re-run comes soon after the table commit it repeats).
HISTORY_DEPTH = 200
#: The commit info key holding the plan's creation time (``airflow_kinesis_spark.sinks.plan_marker``).
PLAN_KEY = "kinesis-spark.plan-created-at"


class _TableExists(Exception):
    """A concurrent writer created the table first."""


def app_id(stream_name: str, consumer_name: str) -> str:
    """The Delta transaction's application id of a (stream, consumer)."""
    return f"airflow-kinesis-spark:{stream_name}:{consumer_name}"


class DeltaSink(Sink):
    """Batches as Delta commits (module doc).

    :param location: the table's URI (the operator's ``output_path``).
    :param partition_by: partition column names (after the transform; ``arrival_date`` is added
        by the job when the transform does not make it). Empty: unpartitioned.
    :param storage_options: delta-rs storage options (credentials, endpoint, locking provider).
    :param max_records_per_file: Spark's ``maxRecordsPerFile`` (0: no cap).
    :param target_file_size: target bytes per data file (0: none; see ``OutputSpec``).
    """

    format = "delta"
    library = "delta-rs"

    def __init__(
        self, location: str, *, partition_by: Sequence[str] = DEFAULT_PARTITION,
        storage_options: Mapping[str, str] | None = None, max_records_per_file: int = 0, target_file_size: int = 0,
    ) -> None:  # fmt: skip
        self.location = location.rstrip("/")
        self.uri = table_uri(self.location)
        for name in partition_by:
            if not name.isidentifier():
                raise ValueError(f"partition_by: Delta partitions by column names; got {name!r}")
        self.partition_by = tuple(partition_by)
        self.storage_options = dict(storage_options or {})
        self.max_records_per_file = max_records_per_file
        self.target_file_size = target_file_size

    @property
    def table(self) -> str:
        return self.uri

    def output_spec(self) -> OutputSpec:
        derived = ((ARRIVAL_DATE, "date", "approximate_arrival_timestamp"),) if ARRIVAL_DATE in self.partition_by else ()
        partition = tuple(PartitionField("identity", name, f"_p{i}") for i, name in enumerate(self.partition_by))
        return OutputSpec("delta", partition, self.max_records_per_file, derived, self.target_file_size, self.records_spec())

    def stored_bytes_per_row(self) -> float | None:
        """From the files of the table's latest commit that added rows (their add actions'
        ``size`` and ``numRecords``; the table's log, no data file read)."""
        import pyarrow as pa

        table = self.load()
        if table is None:
            return None
        files = pa.table(table.get_add_actions(flatten=True)).select(["size_bytes", "num_records", "modification_time"]).to_pylist()
        files = [f for f in files if f["num_records"]]
        if not files:
            return None
        latest = max(f["modification_time"] for f in files)
        recent = [f for f in files if f["modification_time"] == latest] or files
        return sum(f["size_bytes"] for f in recent) / sum(f["num_records"] for f in recent)

    def load(self) -> Any:
        """The ``DeltaTable``, or ``None`` when there is no table at the location yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri, storage_options=dict(self.storage_options) if self.storage_options else None)
        except TableNotFoundError:
            return None

    def table_schema(self) -> Any:
        import pyarrow as pa

        table = self.load()
        return pa.schema(table.schema().to_arrow()) if table is not None else None

    def latest_batch(self, stream_name: str, consumer_name: str, committed_batch_id: int) -> BatchMark | None:
        """The version of (stream, consumer)'s transaction (``DeltaTable.transaction_version``),
        with its plan's creation time from the commit that set it (searched in the last
        :data:`HISTORY_DEPTH` commits; ``None`` when older)."""
        table = self.load()
        if table is None:
            return None
        done = table.transaction_version(app_id(stream_name_of(stream_name), consumer_name))
        if done is None:
            return None
        plan = None
        for commit in self._commit_infos(table.version()):
            if (commit.get("kinesis-spark.stream"), commit.get("kinesis-spark.consumer"), commit.get("kinesis-spark.batch-id")) == (
                    stream_name_of(stream_name), consumer_name, str(done)):  # fmt: skip
                plan = commit.get(PLAN_KEY)
                break
        return BatchMark(int(done), plan, f"Delta transaction {app_id(stream_name_of(stream_name), consumer_name)} at {done}")

    def commit_batch(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> TableCommit:
        """Commit batch ``plan``'s files with its transaction identifier, unless the table has it.
        A commit that conflicts with a concurrent writer's is retried on the reloaded table
        (after the same check), at once, up to :data:`~airflow_kinesis_spark.sinks.conflicts.COMMIT_ATTEMPTS` times (tenacity).

        :raises TableCommitError: no data file, a file outside the table, or a schema mismatch.
        :raises deltalake.exceptions.CommitFailedError: still conflicting after the last attempt.
        """
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError

        app = app_id(stream_name_of(plan.stream_name), plan.consumer_name)

        def attempt() -> TableCommit:
            table = self.load()
            if table is not None:
                done = table.transaction_version(app)
                if done is not None and done >= plan.batch_id:
                    version = self._batch_version(table, plan, done)
                    log.info("table %s: batch %d is in the table already (version %d, transaction %s at %d); nothing added",
                             self.uri, plan.batch_id, version, app, done)  # fmt: skip
                    return TableCommit("delta", self.uri, version=version, already_committed=True)
            properties = CommitProperties(
                app_transactions=[Transaction(app, plan.batch_id)],
                custom_metadata={"kinesis-spark.stream": stream_name_of(plan.stream_name), "kinesis-spark.consumer": plan.consumer_name,
                                 "kinesis-spark.batch-id": str(plan.batch_id), PLAN_KEY: plan_marker(plan)},  # fmt: skip
            )
            return self._commit(table, plan, properties, removes=[])

        # at once, each attempt on the reloaded table, which is checked for the batch first
        return retry_on_conflict(attempt, (CommitFailedError, _TableExists), f"table {self.uri}: commit", logger=log)

    def _batch_version(self, table: Any, plan: Any, done: int) -> int:
        """The version whose commit added batch ``plan`` (its own plan), from the commit info of
        the table's last :data:`HISTORY_DEPTH` commits.

        The log's ``{version:020}.json`` files are read directly, newest first (delta-rs's
        ``history()`` did not return on moto's S3: its listing of the log never ended).

        :raises TableCommitError: not found: the table's transaction is at ``done`` from another
            checkpoint history.
        """
        for commit in self._commit_infos(table.version()):
            if (commit.get("kinesis-spark.stream") == stream_name_of(plan.stream_name) and commit.get("kinesis-spark.consumer") == plan.consumer_name
                    and commit.get("kinesis-spark.batch-id") == str(plan.batch_id) and commit.get(PLAN_KEY) == plan_marker(plan)):
                return int(commit["version"])
        raise TableCommitError(
            f"Delta table {self.uri} records transaction {app_id(stream_name_of(plan.stream_name), plan.consumer_name)} at version {done} "
            f">= batch {plan.batch_id}, but none of its last {HISTORY_DEPTH} commits is this batch's plan: the table is ahead "
            "of the checkpoint store (its checkpoints were reset or the checkpoint table re-created). Nothing was committed. "
            "Write to a new table, or use a new consumer name for the new checkpoint history."
        )

    def _commit_infos(self, latest: int) -> Any:
        """``commitInfo`` of versions ``latest``, ``latest - 1``, ... (at most :data:`HISTORY_DEPTH`),
        each with its ``version``; versions whose log file is gone (log retention) end the walk."""
        from airflow_kinesis_spark.sinks.files import read_text

        for version in range(latest, max(-1, latest - HISTORY_DEPTH), -1):
            text = read_text(f"{self.uri}/_delta_log/{version:020d}.json", self.storage_options)
            if text is None:
                return
            for line in text.splitlines():
                action = json.loads(line) if line.strip() else {}
                if "commitInfo" in action:
                    yield {**action["commitInfo"], "version": version}

    def commit_window(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> TableCommit:
        """Replace the window's rows of this stream with the window's files, in one commit.

        When every earlier file with rows of the window lies wholly inside it (windows written by
        window runs, day-aligned windows over day-partitioned batches), the commit removes those
        files and adds Spark's. Otherwise delta-rs replaces the rows matching the window
        (``write_deltalake(mode="overwrite", predicate=...)``: it rewrites the straddling files and
        writes the window's rows, which are read into the worker's memory for it).
        """
        from deltalake import CommitProperties

        table = self.load()
        start, end = plan.window  # ValueError for an incremental plan
        label = f"{start.isoformat()}/{end.isoformat()}"
        properties = CommitProperties(custom_metadata={"kinesis-spark.stream": stream_name_of(plan.stream_name),
                                                       "kinesis-spark.consumer": plan.consumer_name, "kinesis-spark.window": label})  # fmt: skip
        removes, straddling = ([], []) if table is None else self._window_files(table, plan)
        if not straddling:
            return self._commit(table, plan, properties, removes=removes)
        return self._replace_rows(table, plan, properties, straddling)

    def _replace_rows(self, table: Any, plan: BatchPlan, properties: Any, straddling: list[str]) -> TableCommit:
        import pyarrow.dataset as ds
        from deltalake import write_deltalake

        from airflow_kinesis_spark.sinks.files import filesystem

        files = list_data_files(plan.output_location, self.storage_options)
        if not files:
            raise TableCommitError(f"window {plan.output_location} holds no data file; nothing committed")
        self._check_schema(table, read_schema(files[0].uri, self.storage_options), plan)
        filesys, _ = filesystem(files[0].uri, self.storage_options)
        rows = ds.dataset([filesystem(f.uri, self.storage_options)[1] for f in files], filesystem=filesys, format="parquet")
        stream = stream_name_of(plan.stream_name).replace("'", "''")
        start, end = plan.window
        predicate = (f"approximate_arrival_timestamp >= '{start.isoformat()}' AND "
                     f"approximate_arrival_timestamp < '{end.isoformat()}' AND stream_name = '{stream}'")  # fmt: skip
        log.info("table %s: %d files straddle the window's bounds (e.g. %s): replacing its rows with delta-rs's "
                 "predicate overwrite", self.uri, len(straddling), straddling[0])  # fmt: skip
        write_deltalake(table, rows.to_table(), mode="overwrite", predicate=predicate, commit_properties=properties)
        table.update_incremental()
        return TableCommit("delta", self.uri, version=table.version(), files=len(files))

    def _window_files(self, table: Any, plan: Any) -> tuple[list[Any], list[str]]:
        """``(remove actions of the files wholly inside the window, paths of files straddling it)``."""
        import pyarrow as pa
        from deltalake.transaction import RemoveAction

        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        start, end = plan.window
        removes, straddling = [], []
        now = int(datetime.now(timezone.utc).timestamp() * 1000)
        for a in actions:
            if a.get("min.stream_name") is not None and not (a["min.stream_name"] == a["max.stream_name"] == stream_name_of(plan.stream_name)):
                continue
            low, high = a.get("min.approximate_arrival_timestamp"), a.get("max.approximate_arrival_timestamp")
            if low is None or high is None:
                straddling.append(a["path"])
            elif start <= low and high < end:
                partition = {k.removeprefix("partition."): _partition_text(v) for k, v in a.items() if k.startswith("partition.")}
                removes.append(RemoveAction(a["path"], True, now, a["size_bytes"], partition))
            elif low < end and high >= start:
                straddling.append(a["path"])
        return removes, straddling

    def compact(self, start: Any, end: Any, *, target_size: int | None = None) -> dict[str, Any]:
        """Compact the Delta table's small files (delta-rs ``optimize.compact``): with the default
        ``arrival_date`` partitioning, only the partitions of the days ``[start, end)`` touches;
        otherwise the whole table.

        Cost: every compacted byte is read and written once on the worker; the replaced files stay
        until ``vacuum`` after the table's retention period.

        :param target_size: the files' target size in bytes (delta-rs default: 100 MiB, or the
            table's ``delta.targetFileSize``).
        :returns: ``table``, ``files_before``/``files_after`` (delta-rs's ``numFilesRemoved`` /
            ``numFilesAdded``), ``version``.
        """
        from datetime import timedelta

        table = self.load()
        if table is None:
            raise TableCommitError(f"Delta table {self.uri} does not exist: nothing to compact")
        filters = None
        if ARRIVAL_DATE in table.metadata().partition_columns:
            days, day = [], start.date()
            while datetime.combine(day, datetime.min.time(), tzinfo=timezone.utc) < end:
                days.append(day.isoformat())
                day += timedelta(days=1)
            filters = [(ARRIVAL_DATE, "in", days)]
        metrics = table.optimize.compact(partition_filters=filters, target_size=target_size)
        log.info("table %s: compaction removed %s files and added %s (version %d)", self.uri, metrics.get("numFilesRemoved"),
                 metrics.get("numFilesAdded"), table.version())  # fmt: skip
        return {"table": self.uri, "files_before": metrics.get("numFilesRemoved"), "files_after": metrics.get("numFilesAdded"),
                "version": table.version()}  # fmt: skip

    def _commit(self, table: Any, plan: Any, properties: Any, *, removes: list[Any]) -> TableCommit:
        from deltalake.exceptions import DeltaError, SchemaMismatchError
        from deltalake.transaction import create_table_with_add_actions

        files = list_data_files(plan.output_location, self.storage_options)
        if not files:
            raise TableCommitError(f"batch {plan.batch_id}: {plan.output_location} holds no data file to add to table "
                                   f"{self.uri}; nothing committed")  # fmt: skip
        prefix = table_uri(plan.output_location)
        if not prefix.startswith(self.uri + "/"):
            raise TableCommitError(f"{plan.output_location} is not inside Delta table {self.uri}: a Delta table's files "
                                   "live under its location")  # fmt: skip
        relative = prefix[len(self.uri) + 1 :]
        spec = self.output_spec()
        schema = read_schema(files[0].uri, self.storage_options)
        missing = [name for name in self.partition_by if name not in schema.names]
        if missing:
            raise TableCommitError(f"partition_by names {missing}, which the batch's files lack (columns: {schema.names})")
        adds = [self._add_action(f, relative, spec, schema) for f in files]
        try:
            if table is None:
                log.info("creating Delta table %s partitioned by %s", self.uri, list(self.partition_by))
                try:
                    create_table_with_add_actions(self.uri, _delta_schema(schema), adds, mode="error",
                                                  partition_by=list(self.partition_by) or None,
                                                  storage_options=dict(self.storage_options) if self.storage_options else None,
                                                  commit_properties=properties)  # fmt: skip
                except DeltaError as err:
                    if self.load() is not None:  # created by a concurrent writer meanwhile
                        raise _TableExists(str(err)) from err
                    raise
                table = self.load()
            else:
                self._check_schema(table, schema, plan)
                table.create_write_transaction([*removes, *adds], mode="append", schema=table.schema(),
                                               partition_by=table.metadata().partition_columns, commit_properties=properties)  # fmt: skip
                table.update_incremental()
        except SchemaMismatchError as err:
            raise TableCommitError(f"the batch's files do not fit Delta table {self.uri} ({err}). Nothing was committed. "
                                   "Evolve the table's schema first, or write to a new table.") from err  # fmt: skip
        log.info("table %s: version %d adds %d files%s", self.uri, table.version(), len(adds),
                 f", removes {len(removes)}" if removes else "")  # fmt: skip
        return TableCommit("delta", self.uri, version=table.version(), files=len(adds))

    def _check_schema(self, table: Any, schema: Any, plan: Any) -> None:
        """Check the batch's columns against the table's before its commit (delta-rs's append of
        add actions does not: a new column would be committed and stay invisible to readers).

        With ``schema_evolution="add_columns"``, new columns are added to the table as nullable
        columns first (``DeltaTable.alter.add_columns``: a schema commit of its own, just before
        the batch's; if the batch's commit then fails, the table keeps the new columns, empty).

        :raises TableCommitError: a column's type differs, or a new column without
            ``schema_evolution="add_columns"``; naming each column. Nothing committed.
        """
        import pyarrow as pa
        from deltalake import CommitProperties, Field

        what = f"batch {plan.batch_id}" if plan.mode == "incremental" else "the window"
        added = self.columns_to_add(pa.schema(table.schema().to_arrow()), schema, what)
        if not added:
            return
        names = [f"{f.name} {f.type}" for f in added]
        table.alter.add_columns([Field.from_arrow(f) for f in added],
                                commit_properties=CommitProperties(custom_metadata={
                                    "kinesis-spark.stream": stream_name_of(plan.stream_name),
                                    "kinesis-spark.consumer": plan.consumer_name, "kinesis-spark.schema-evolution": "add_columns"}))  # fmt: skip
        table.update_incremental()
        log.warning("table %s: added nullable columns %s for %s (schema_evolution='add_columns'), version %d",
                    self.uri, names, what, table.version())  # fmt: skip

    def _add_action(self, file: DataFile, relative: str, spec: OutputSpec, schema: Any) -> Any:
        from deltalake.transaction import AddAction

        dirs = dict(part.split("=", 1) for part in posixpath.dirname(file.path).split("/") if "=" in part)
        values = {}
        for f in spec.partition:
            raw = dirs.get(f.name)
            values[f.source] = None if raw is None or raw == _HIVE_NULL else unquote(raw)
        return AddAction(f"{relative}/{file.path}", file.size, values, file.mtime_ms, True, json.dumps(self._stats(file, schema)))

    def _stats(self, file: DataFile, schema: Any) -> dict[str, Any]:
        """Delta's per-file statistics (``numRecords``, ``minValues``, ``maxValues``, ``nullCount``)
        from the Parquet footer; columns without statistics are left out."""
        import pyarrow.parquet as pq

        filesys, path = filesystem(file.uri, self.storage_options)
        with filesys.open_input_file(path) as src:
            meta = pq.ParquetFile(src).metadata
        low: dict[str, Any] = {}
        high: dict[str, Any] = {}
        nulls: dict[str, int] = {}
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            for c in range(group.num_columns):
                column = group.column(c)
                name = column.path_in_schema
                stats = column.statistics
                if "." in name or stats is None:
                    continue
                nulls[name] = nulls.get(name, 0) + (stats.null_count or 0)
                if not stats.has_min_max or isinstance(stats.min, bytes):
                    continue
                low[name] = stats.min if name not in low else min(low[name], stats.min)
                high[name] = stats.max if name not in high else max(high[name], stats.max)
        return {"numRecords": meta.num_rows, "minValues": {k: _json_value(v) for k, v in low.items()},
                "maxValues": {k: _json_value(v) for k, v in high.items()}, "nullCount": nulls}  # fmt: skip


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if isinstance(value, date):
        return value.isoformat()
    return value


def _partition_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    return str(value)


def _delta_schema(schema: Any) -> Any:
    from deltalake import Schema

    return Schema.from_arrow(schema)

