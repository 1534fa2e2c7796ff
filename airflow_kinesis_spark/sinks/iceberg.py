"""Apache Iceberg tables, committed with ``pyiceberg`` on the worker: one snapshot per batch.

- **Table.** Identified by ``namespace.table`` in a pyiceberg catalog (``type`` ``glue``,
  ``sql`` (SQLite file or PostgreSQL), ``rest``, ...: pyiceberg's catalog properties). Created
  on the first batch with the schema of the batch's files (the output columns plus the
  transform's) at ``location`` (the operator's ``output_path``), partitioned by the DAG
  author's fields (default ``day(approximate_arrival_timestamp)``).
- **Files.** Spark writes Parquet, one partition per file, keeping the source column in the file:
  ``add_files`` derives each file's partition from the source column's statistics (a hidden
  ``_p{i}`` column carries the directory name; Spark's ``partitionBy`` on the source column
  itself would move it out of the file).
- **Exactly once.** The snapshot that adds batch N records ``kinesis-spark.stream``,
  ``kinesis-spark.consumer``, ``kinesis-spark.batch-id`` and the plan's creation time
  (``kinesis-spark.plan-created-at``) in its summary (as Flink's Iceberg committer records its
  checkpoint id). Before adding, the table's snapshots are searched; the batch's own plan already
  there adds nothing (a re-run after a crash between the table commit and the checkpoint commit,
  or after an ambiguous table commit). A batch id of this stream and consumer at or beyond N from
  *another* plan means the table outran the checkpoint store (its checkpoints were reset or
  re-created): the commit fails (``TableCommitError``) rather than skip or duplicate rows. A conflicting concurrent commit
  (``CommitFailedException``) is retried on the refreshed table, after the same search.
- **Windows.** One transaction deletes the window's rows of this stream
  (``approximate_arrival_timestamp`` in ``[start, end)``; copy-on-write for files that straddle
  the window) and adds the window's files: a re-run leaves identical rows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.exceptions import TableCommitError
from airflow_kinesis_spark.sinks import BatchMark, OutputSpec, PartitionField, Sink, TableCommit, parse_partition_field, plan_marker
from airflow_kinesis_spark.sinks.conflicts import retry_on_conflict
from airflow_kinesis_spark.sinks.files import list_data_files, pyiceberg_io_properties, read_schema, table_uri

if TYPE_CHECKING:
    from airflow_kinesis_spark.core.planner import BatchPlan
    from airflow_kinesis_spark.core.ranges import ShardReport

log = logging.getLogger(__name__)

__all__ = ["IcebergSink", "SUMMARY_STREAM", "SUMMARY_CONSUMER", "SUMMARY_BATCH", "SUMMARY_WINDOW", "DEFAULT_PARTITION"]

SUMMARY_STREAM = "kinesis-spark.stream"
SUMMARY_CONSUMER = "kinesis-spark.consumer"
SUMMARY_BATCH = "kinesis-spark.batch-id"
SUMMARY_WINDOW = "kinesis-spark.window"
SUMMARY_PLAN = "kinesis-spark.plan-created-at"

#: The default partition spec: a day of arrival per partition.
DEFAULT_PARTITION = ("day(approximate_arrival_timestamp)",)

#: Seconds before the second attempt of a table commit that conflicted with another writer's
#: (:data:`~airflow_kinesis_spark.sinks.conflicts.COMMIT_ATTEMPTS` in all); one more of them before
#: each later one. pyiceberg's own retries of a snapshot commit (table property
#: ``commit.retry.num-retries``) happen inside each attempt.
COMMIT_PAUSE = 0.05



# pyiceberg's predicates are pydantic models: their constructor takes the column's name and the
# value positionally (pyiceberg's documented use), while their typed fields (``term``, ``value``)
# are what a type checker sees; the two calls below are where that difference is accepted.


def _names_glue_client(props: Mapping[str, str]) -> bool:
    """Whether pyiceberg's catalog properties say how to build the Glue client themselves:
    credentials, a profile, or a catalog id (which pyiceberg registers on a client it builds)."""
    own = ("glue.access-key-id", "client.access-key-id", "glue.profile-name", "client.profile-name", "glue.id")
    return any(props.get(key) for key in own)


def _arrival_between(start: Any, end: Any) -> Any:
    """``start <= approximate_arrival_timestamp < end`` (aware datetimes) as a pyiceberg row filter."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    column = "approximate_arrival_timestamp"
    return And(GreaterThanOrEqual(column, start.isoformat()), LessThan(column, end.isoformat()))  # type: ignore[call-arg,arg-type]


def _equal_to(column: str, value: str) -> Any:
    """``column = value`` as a pyiceberg row filter."""
    from pyiceberg.expressions import EqualTo

    return EqualTo(column, value)  # type: ignore[call-arg,arg-type]

class IcebergSink(Sink):
    """Batches as Iceberg snapshots (module doc).

    :param table: ``namespace.table`` (the namespace is created if missing).
    :param catalog_properties: pyiceberg catalog properties (``type``, ``uri``, ``warehouse``, ...);
        ``name`` is the catalog's name (default ``default``).
    :param location: the table's location when it is created: the operator's ``output_path``,
        where Spark writes the batches' files.
    :param partition_by: partition fields, ``transform(column)`` or a column name (identity);
        transforms ``year``, ``month``, ``day``, ``hour``, ``identity``.
    :param storage_options: credentials and endpoint for ``s3://`` files (delta-rs key names).
    :param max_records_per_file: Spark's ``maxRecordsPerFile`` for the batch's files (0: no cap).
    :param target_file_size: target bytes per data file (0: none; see ``OutputSpec``).
    :raises ValueError: a malformed table identifier or partition field.
    """

    format = "iceberg"
    library = "pyiceberg"

    def __init__(
        self, table: str, catalog_properties: Mapping[str, str], location: str, *,
        partition_by: Sequence[str] = DEFAULT_PARTITION, storage_options: Mapping[str, str] | None = None,
        max_records_per_file: int = 0, target_file_size: int = 0,
    ) -> None:  # fmt: skip
        if not table or "." not in table.strip(".") or any(not part for part in table.split(".")):
            raise ValueError(f"table must be 'namespace.table' (an Iceberg identifier); got {table!r}")
        self.identifier = table
        self.catalog_properties = dict(catalog_properties)
        self.location = location.rstrip("/")
        self.partition = tuple(
            PartitionField(transform, source, f"_p{i}") for i, (transform, source) in enumerate(map(parse_partition_field, partition_by))
        )  # fmt: skip
        if any(f.transform == "date" for f in self.partition):
            raise ValueError("partition_by: Iceberg has no 'date' transform; use day(column)")
        self.storage_options = dict(storage_options or {})
        self.max_records_per_file = max_records_per_file
        self.target_file_size = target_file_size
        self._catalog: Any = None

    @property
    def table(self) -> str:
        return self.identifier

    def output_spec(self) -> OutputSpec:
        return OutputSpec("iceberg", self.partition, self.max_records_per_file, target_file_size=self.target_file_size,
                          records=self.records_spec())

    def stored_bytes_per_row(self) -> float | None:
        """From the latest snapshot that added rows: its summary's ``added-files-size`` /
        ``added-records`` (no manifest is read)."""
        table = self.load()
        for snapshot in reversed(table.metadata.snapshots if table is not None else []):
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            size, rows = int(summary.get("added-files-size") or 0), int(summary.get("added-records") or 0)
            if size and rows:
                return size / rows
        return None

    def catalog(self) -> Any:
        """The pyiceberg catalog (loaded once). A Glue catalog whose properties name no credentials
        (``glue.access-key-id``, ``client.access-key-id``, ``glue.profile-name``,
        ``client.profile-name``) and no ``glue.id`` uses the Glue client of :attr:`glue_client`
        when there is one (the operators': their connection's credentials, endpoint, ``verify``
        and ``botocore_config``), through ``GlueCatalog``'s ``client`` argument."""
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            props = {**pyiceberg_io_properties(self.storage_options), **self.catalog_properties}
            name = props.pop("name", "default")
            if props.get("type") == "glue" and self.glue_client is not None and not _names_glue_client(props):
                from pyiceberg.catalog.glue import GlueCatalog

                self._catalog = GlueCatalog(name, client=self.glue_client(), **props)
            else:
                self._catalog = load_catalog(name, **props)
        return self._catalog

    def load(self) -> Any:
        """The table, or ``None`` when it does not exist yet."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog().load_table(self.identifier)
        except NoSuchTableError:
            return None

    # -- batches ---------------------------------------------------------------------------

    def commit_batch(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> TableCommit:
        """Add batch ``plan``'s files in one snapshot, unless the table holds the batch already.

        :raises TableCommitError: no data file, or the files do not fit the table (schema).
        :raises pyiceberg.exceptions.CommitFailedException: still conflicting after
            :data:`~airflow_kinesis_spark.sinks.conflicts.COMMIT_ATTEMPTS` attempts (with tenacity, :data:`COMMIT_PAUSE` seconds times the
            failed attempt's number apart; each on the reloaded table, searched for the batch first).
        """
        properties = {SUMMARY_STREAM: stream_name_of(plan.stream_name), SUMMARY_CONSUMER: plan.consumer_name, SUMMARY_BATCH: str(plan.batch_id),
                      SUMMARY_PLAN: plan_marker(plan)}  # fmt: skip
        return self._commit(plan, properties, lambda table: self._batch_snapshot(table, plan))

    def table_schema(self) -> Any:
        table = self.load()
        return table.schema().as_arrow() if table is not None else None

    def latest_batch(self, stream_name: str, consumer_name: str, committed_batch_id: int) -> BatchMark | None:
        """The newest batch of (stream, consumer) in the table's snapshot summaries.

        :raises OutputOwnedError: the table holds batches of another (stream, consumer) and this
            task does not declare the output shared (``shared_output``).
        """
        from airflow_kinesis_spark.exceptions import OutputOwnedError

        table = self.load()
        if table is None:
            return None
        latest: BatchMark | None = None
        others: set[tuple[str, str]] = set()
        for snapshot in table.metadata.snapshots:
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            stream, consumer, batch = summary.get(SUMMARY_STREAM), summary.get(SUMMARY_CONSUMER), summary.get(SUMMARY_BATCH)
            if stream is None or batch is None or not batch.isdigit():
                continue
            if (stream, consumer) != (stream_name_of(stream_name), consumer_name):
                others.add((stream, consumer or ""))
            elif latest is None or int(batch) > latest.batch_id:
                latest = BatchMark(int(batch), summary.get(SUMMARY_PLAN), f"snapshot {snapshot.snapshot_id}")
        if others and not self.shared_output:
            names = ", ".join(f"stream {s!r} consumer {c!r}" for s, c in sorted(others))
            raise OutputOwnedError(
                f"Iceberg table {self.identifier} holds batches of {names}; this task is stream {stream_name_of(stream_name)!r}, "
                f"consumer {consumer_name!r}. Nothing was read or written. Two consumers that each ingest a stream into one "
                "table would each add every record: write to another table, or, if the table is meant to hold several "
                "consumers' batches, set shared_output=True on each of their tasks.",
                output=self.identifier, owner=sorted(others), wanted=[stream_name_of(stream_name), consumer_name],
            )  # fmt: skip
        return latest

    def _batch_snapshot(self, table: Any, plan: Any) -> Any:
        """The snapshot of ``table`` that added batch ``plan`` (its own plan), else ``None``.

        :raises TableCommitError: the table holds batch ``plan.batch_id`` or a later one of this
            stream and consumer from another plan (the checkpoint store was reset or re-created).
        """
        later = None
        for snapshot in reversed(table.metadata.snapshots):
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            if summary.get(SUMMARY_STREAM) != stream_name_of(plan.stream_name) or summary.get(SUMMARY_CONSUMER) != plan.consumer_name:
                continue
            batch = summary.get(SUMMARY_BATCH)
            if batch == str(plan.batch_id) and summary.get(SUMMARY_PLAN) == plan_marker(plan):
                return snapshot
            if batch is not None and batch.isdigit() and int(batch) >= plan.batch_id and later is None:
                later = (batch, snapshot.snapshot_id)
        if later is not None:
            raise TableCommitError(
                f"table {self.identifier} already holds batch {later[0]} of stream {stream_name_of(plan.stream_name)!r}, consumer "
                f"{plan.consumer_name!r} (snapshot {later[1]}) from another plan than batch {plan.batch_id}'s: the table is "
                "ahead of the checkpoint store (its checkpoints were reset or the checkpoint table re-created). Nothing was "
                "committed. Write to a new table, or use a new consumer name for the new checkpoint history."
            )
        return None

    # -- windows ---------------------------------------------------------------------------

    def commit_window(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> TableCommit:
        """Replace the window's rows of this stream with the window's files, in one snapshot.

        When every file with rows of the window lies wholly inside it (by pyiceberg's own metrics
        evaluation: no file that may hold the window's rows may also hold rows outside it, e.g.
        files of earlier window runs, or day-aligned windows over day-partitioned batches), one
        ``overwrite`` snapshot removes those files and adds the window's. Otherwise (files
        straddle the window's bounds and must be rewritten, copy-on-write) one transaction holds
        pyiceberg's delete snapshot and the append snapshot: one catalog commit, so readers of
        the table's current snapshot never see the window's rows missing, but the table's
        history shows the two. The commit's summary records stream, consumer and window.
        """
        from pyiceberg.expressions import And
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        start, end = plan.window  # ValueError for an incremental plan
        label = f"{format_timestamp(start)}/{format_timestamp(end)}"
        properties = {SUMMARY_STREAM: stream_name_of(plan.stream_name), SUMMARY_CONSUMER: plan.consumer_name, SUMMARY_WINDOW: label}

        def replace(tx: Any, table: Any, uris: list[str]) -> bool:
            names = {f.name for f in table.schema().fields}
            if "approximate_arrival_timestamp" not in names:
                raise TableCommitError(f"table {self.identifier} has no approximate_arrival_timestamp column: a window "
                                       "cannot replace its rows (keep the column in the transform's output)")  # fmt: skip
            where = _arrival_between(*plan.window)
            if "stream_name" in names:
                where = And(where, _equal_to("stream_name", stream_name_of(plan.stream_name)))
            maybe = [t.file for t in table.scan(row_filter=where).plan_files()]
            straddling = [f.file_path for f in maybe if not self._wholly_inside(table.schema(), f, plan)]
            if straddling:
                log.info("table %s: %d files straddle the window's bounds (e.g. %s): the window's commit rewrites them (a "
                         "delete snapshot, then the append, in one transaction)", self.identifier, len(straddling), straddling[0])  # fmt: skip
                tx.delete(where, snapshot_properties=properties)
                return False
            with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
                for data_file in maybe:
                    overwrite.delete_data_file(data_file)
                for uri in uris:
                    overwrite.append_data_file(parquet_file_to_data_file(table.io, tx.table_metadata, uri))
            return True

        return self._commit(plan, properties, lambda table: None, before_add=replace)

    @staticmethod
    def _wholly_inside(schema: Any, data_file: Any, plan: Any) -> bool:
        """Whether every row of ``data_file`` arrived in the window and is of its stream, by the
        file's column bounds (``approximate_arrival_timestamp`` in ``[start, end)``; ``stream_name``
        lower = upper = the stream: full bounds, see ``_create_with``). No bounds: not known inside."""
        from pyiceberg.conversions import from_bytes

        def bounds(name: str) -> tuple[Any, Any] | None:
            try:
                field = schema.find_field(name)
            except ValueError:
                return None
            low, high = (data_file.lower_bounds or {}).get(field.field_id), (data_file.upper_bounds or {}).get(field.field_id)
            if low is None or high is None:
                return None
            return from_bytes(field.field_type, low), from_bytes(field.field_type, high)

        arrival = bounds("approximate_arrival_timestamp")
        if arrival is None:
            return False
        start, end = (int(t.timestamp() * 1_000_000) for t in plan.window)
        if not (start <= arrival[0] and arrival[1] < end):
            return False
        try:
            schema.find_field("stream_name")
        except ValueError:
            return True  # the table holds no stream column: one stream's rows
        stream = bounds("stream_name")
        return stream is not None and stream[0] == stream[1] == stream_name_of(plan.stream_name)

    def compact(self, start: Any, end: Any, *, target_size: int | None = None) -> dict[str, Any]:
        """Rewrite the rows with ``approximate_arrival_timestamp`` in ``[start, end)`` into as few
        files as the table's ``write.target-file-size-bytes`` allows: one overwrite snapshot
        (copy-on-write, pyiceberg), retried on a conflicting commit.

        Cost: the window's rows are read into the worker's memory (Arrow) and written once; choose
        windows of a day or less. Older snapshots keep the replaced files until they are expired.

        :returns: ``table``, ``files_before``, ``files_after``, ``rows``, ``snapshot_id`` (``None``
            when there was nothing to compact: at most one file).
        :raises pyiceberg.exceptions.CommitFailedException: still conflicting after
            :data:`~airflow_kinesis_spark.sinks.conflicts.COMMIT_ATTEMPTS` attempts (retried at once, on the reloaded table).
        """
        if target_size is not None:
            raise ValueError("Iceberg compaction writes files of the table's write.target-file-size-bytes: set that "
                             "table property instead of target_size")  # fmt: skip
        from pyiceberg.exceptions import CommitFailedException

        where = _arrival_between(start, end)

        def attempt() -> dict[str, Any]:
            table = self.load()
            if table is None:
                raise TableCommitError(f"Iceberg table {self.identifier} does not exist: nothing to compact")
            before = len(list(table.scan(row_filter=where).plan_files()))
            if before <= 1:
                return {"table": self.identifier, "files_before": before, "files_after": before, "rows": None, "snapshot_id": None}
            rows = table.scan(row_filter=where).to_arrow()
            table.overwrite(rows, overwrite_filter=where, snapshot_properties={"kinesis-spark.compaction": f"{start.isoformat()}/{end.isoformat()}"})
            table = table.refresh()
            after = len(list(table.scan(row_filter=where).plan_files()))
            log.info("table %s: compacted %d rows of [%s, %s) from %d files into %d (snapshot %d)", self.identifier, rows.num_rows,
                     start.isoformat(), end.isoformat(), before, after, table.current_snapshot().snapshot_id)  # fmt: skip
            return {"table": self.identifier, "files_before": before, "files_after": after, "rows": rows.num_rows,
                    "snapshot_id": table.current_snapshot().snapshot_id}  # fmt: skip

        return retry_on_conflict(attempt, (CommitFailedException,), f"table {self.identifier}: compaction", logger=log)

    # -- the commit ------------------------------------------------------------------------

    def _commit(self, plan: Any, properties: dict[str, str], committed: Any, before_add: Any = None) -> TableCommit:
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError

        files = list_data_files(plan.output_location, self.storage_options)
        if not files:
            raise TableCommitError(f"batch {plan.batch_id}: {plan.output_location} holds no data file to add to table "
                                   f"{self.identifier}; nothing committed")  # fmt: skip
        uris = [f.uri for f in files]
        schema = read_schema(files[0].uri, self.storage_options)  # once: every attempt adds the same files

        def attempt() -> TableCommit:
            table = self.load()
            if table is None:
                snapshot = self._create_with(files, uris, properties)
            else:
                found = committed(table)
                if found is not None:
                    log.info("table %s: batch %d is in snapshot %d already; nothing added", self.identifier,
                             plan.batch_id, found.snapshot_id)  # fmt: skip
                    return TableCommit("iceberg", self.identifier, snapshot_id=found.snapshot_id, already_committed=True)
                snapshot = self._add(table, uris, properties, before_add, schema, plan)
            log.info("table %s: snapshot %d adds %d files of %s", self.identifier, snapshot.snapshot_id, len(files),
                     f"batch {plan.batch_id}" if SUMMARY_BATCH in properties else f"window {properties.get(SUMMARY_WINDOW)}")  # fmt: skip
            return TableCommit("iceberg", self.identifier, snapshot_id=snapshot.snapshot_id, files=len(files))

        # each attempt reloads the table and searches it for the batch first
        return retry_on_conflict(attempt, (CommitFailedException, TableAlreadyExistsError), f"table {self.identifier}: commit",
                                 logger=log, pause=COMMIT_PAUSE)  # fmt: skip

    def _check_schema(self, tx: Any, table: Any, schema: Any, plan: Any) -> None:
        """Check the batch's columns against the table's, as ``DeltaSink._check_schema`` does; with
        ``schema_evolution="add_columns"`` new columns are added as optional (nullable) columns in
        the batch's own transaction (pyiceberg's ``update_schema().union_by_name``).

        :raises TableCommitError: a changed type, or new columns without ``add_columns``.
        """
        import pyarrow as pa

        what = f"batch {plan.batch_id}" if plan.mode == "incremental" else "the window"
        added = self.columns_to_add(table.schema().as_arrow(), schema, what)
        if not added:
            return
        names = [f"{f.name} {f.type}" for f in added]
        with tx.update_schema() as update:
            update.union_by_name(pa.schema(added))
        log.warning("table %s: adding optional columns %s with %s (schema_evolution='add_columns')", self.identifier, names, what)

    def _add(self, table: Any, uris: list[str], properties: dict[str, str], before_add: Any, schema: Any, plan: Any) -> Any:
        try:
            with table.transaction() as tx:
                self._check_schema(tx, table, schema, plan)
                if before_add is None or not before_add(tx, table, uris):  # True: it added the files itself
                    tx.add_files(uris, snapshot_properties=properties)
        except (ValueError, TypeError) as err:
            raise TableCommitError(
                f"the batch's files do not fit table {self.identifier} ({err}). Nothing was committed. If the "
                "transform's columns changed, evolve the table's schema first (ALTER TABLE ... ADD COLUMN) or write to a "
                "new table."
            ) from err
        return table.refresh().current_snapshot()

    def _create_with(self, files: Sequence[Any], uris: list[str], properties: dict[str, str]) -> Any:
        """Create the table from the first file's schema, partition it, and add ``uris``: one
        atomic catalog commit (a concurrent creator makes it raise ``TableAlreadyExistsError``)."""
        from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform, MonthTransform, YearTransform

        transforms = {"identity": IdentityTransform, "year": YearTransform, "month": MonthTransform, "day": DayTransform,
                      "hour": HourTransform}  # fmt: skip
        schema = read_schema(files[0].uri, self.storage_options)
        missing = [f.source for f in self.partition if f.source not in schema.names]
        if missing:
            raise TableCommitError(f"partition_by names {missing}, which the batch's files lack (columns: {schema.names})")
        namespace = self.identifier.rsplit(".", 1)[0]
        self.catalog().create_namespace_if_not_exists(namespace)
        log.info("creating Iceberg table %s at %s, partitioned by %s", self.identifier, self.location,
                 [f"{f.transform}({f.source})" for f in self.partition])  # fmt: skip
        # Full bounds of stream_name (not truncated to 16 characters): a window's commit can then tell
        # a file of one stream from one that may hold others (commit_window).
        tx = self.catalog().create_table_transaction(self.identifier, schema=schema, location=table_uri(self.location),
                                                     properties={"write.metadata.metrics.column.stream_name": "full"})  # fmt: skip
        with tx.update_spec() as spec:
            for f in self.partition:
                spec.add_field(f.source, transforms[f.transform](), f.source if f.transform == "identity" else f"{f.source}_{f.transform}")
        tx.add_files(uris, snapshot_properties=properties)
        tx.commit_transaction()
        return self.catalog().load_table(self.identifier).current_snapshot()

