"""Output forms: where a batch's rows go and how they become visible (the protocol's *sink*).

Spark always writes a batch's Parquet files into the batch's output location (staged, then
published by a rename; ``core.job``). What makes them *visible* to readers is the sink's commit,
made on the Airflow side (the operator or the commit task) between the job's report and the
checkpoint commit, so a crash between the two rolls forward:

``parquet``
    Today's layout, ``{output_path}/batch_id=N``. After the checkpoint commit the batch gets its
    committed record, ``{output_path}/_committed/batch_id=N/manifest`` (one data-file URI per
    line: the layout of Hive's ``SymlinkTextInputFormat``, which Athena, Trino and Hive read),
    and a ``_SUCCESS`` marker. A batch folder without them is not committed: readers that do
    not ask DynamoDB follow the records (:mod:`~airflow_kinesis_spark.sinks.parquet`).
``iceberg``
    An Apache Iceberg table in a catalog (Glue, SQL, REST: any ``pyiceberg`` catalog). One
    snapshot per batch adds the batch's files; its summary records stream, consumer and batch id,
    and a batch already in the table is never added again (:mod:`~airflow_kinesis_spark.sinks.iceberg`).
``delta``
    A Delta Lake table at ``output_path``. One commit per batch carries the transaction
    identifier (``txn``: app id from stream and consumer, version = batch id), so a retried
    commit adds nothing (:mod:`~airflow_kinesis_spark.sinks.delta`).

The Spark side needs no table format jar: the job writes plain Parquet, one file per table
partition (:class:`OutputSpec`, stored in the plan), and the table commit uses ``pyiceberg`` or
``deltalake`` on the worker.

No Airflow import: the protocol (``core``) and the commit task use this package.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_glue import GlueClient
    from airflow_kinesis_spark.core.head import Head
    from airflow_kinesis_spark.core.planner import BatchPlan
    from airflow_kinesis_spark.core.ranges import ShardReport
    from airflow_kinesis_spark.core.records import RecordSettings
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

__all__ = [
    "OUTPUT_FORMATS",
    "PARTITION_TRANSFORMS",
    "PartitionField",
    "OutputSpec",
    "Sink",
    "parse_partition_field",
    "TableCommit",
    "plan_marker",
    "BatchMark",
]

#: The ``output_format`` values.
OUTPUT_FORMATS = ("parquet", "iceberg", "delta")

#: Partition transforms the job can compute (Iceberg's names; ``date`` is a ``DATE`` column for
#: Delta). ``bucket``/``truncate`` are not among them: Spark has no built-in Iceberg bucket hash.
PARTITION_TRANSFORMS = ("identity", "year", "month", "day", "hour", "date")

_FIELD = re.compile(r"^\s*(?:(?P<transform>[a-z]+)\s*\(\s*(?P<source>[A-Za-z_][A-Za-z0-9_]*)\s*\)|(?P<column>[A-Za-z_][A-Za-z0-9_]*))\s*$")


@dataclass(frozen=True)
class PartitionField:
    """One partition field: ``transform(source)`` written to a column ``name`` by the job.

    :param transform: one of :data:`PARTITION_TRANSFORMS`.
    :param source: the output column it is computed from (after the transform).
    :param name: the column the job partitions its files by (Spark's ``partitionBy`` moves it into
        the directory name). For Iceberg a hidden ``_p{i}`` (the source column stays in the file,
        where Iceberg reads the partition value from its statistics); for Delta the table's
        partition column itself.
    """

    transform: str
    source: str
    name: str

    def to_list(self) -> list[str]:
        return [self.transform, self.source, self.name]


def parse_partition_field(text: str) -> tuple[str, str]:
    """``"day(approximate_arrival_timestamp)"`` -> ``("day", "approximate_arrival_timestamp")``;
    a bare column name is ``identity``.

    :raises ValueError: an unknown transform or a malformed field (naming the ones supported).
    """
    match = _FIELD.match(text or "")
    if not match:
        raise ValueError(f"partition field {text!r}: expected a column name or transform(column), "
                         f"transform one of {', '.join(PARTITION_TRANSFORMS)}")  # fmt: skip
    if match["column"]:
        return "identity", match["column"]
    if match["transform"] not in PARTITION_TRANSFORMS:
        raise ValueError(f"partition field {text!r}: transform {match['transform']!r} is not supported; use one of "
                         f"{', '.join(PARTITION_TRANSFORMS)} (bucket and truncate need Iceberg's own writer)")  # fmt: skip
    return match["transform"], match["source"]


@dataclass(frozen=True)
class OutputSpec:
    """What the Spark job needs to know to write files for a sink; stored in the batch's plan.

    :param format: one of :data:`OUTPUT_FORMATS`.
    :param partition: the fields the job partitions files by (one file holds one partition).
    :param max_records_per_file: Spark's ``maxRecordsPerFile`` (0: no cap); a batch writes one
        file per (Spark task, partition value) unless this cap splits it.
    :param derived: ``(name, transform, source)`` columns the job adds to every row when the
        transform did not make them (Delta's default ``arrival_date``).
    :param target_file_size: the DAG author's target size of a data file (bytes; 0: none). At
        planning, the sink turns it into ``max_records_per_file`` from the stored bytes per row of
        the table's latest commit (:meth:`Sink.planned_output_spec`); Spark's writer has no byte
        target of its own.
    :param records: how the job decodes the records (``core.records.RecordSettings.to_dict``; at
        planning with the registry's ``versions``); ``None``: ``raw``, the records' bytes.
    """

    format: str = "parquet"
    partition: tuple[PartitionField, ...] = ()
    max_records_per_file: int = 0
    derived: tuple[tuple[str, str, str], ...] = ()
    target_file_size: int = 0
    records: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.format not in OUTPUT_FORMATS:
            raise ValueError(f"the output format must be one of {', '.join(OUTPUT_FORMATS)}; got {self.format!r}")
        for transform in [f.transform for f in self.partition] + [d[1] for d in self.derived]:
            if transform not in PARTITION_TRANSFORMS:
                raise ValueError(f"partition transform {transform!r} is not one of {', '.join(PARTITION_TRANSFORMS)}")
        if isinstance(self.max_records_per_file, bool) or not isinstance(self.max_records_per_file, int) or self.max_records_per_file < 0:
            raise ValueError(f"max_records_per_file must be an integer >= 0 (0: no cap); got {self.max_records_per_file!r}")

    def to_dict(self) -> dict[str, Any]:
        data = {"format": self.format, "partition": [f.to_list() for f in self.partition],
                "max_records_per_file": self.max_records_per_file, "derived": [list(d) for d in self.derived],
                "target_file_size": self.target_file_size}  # fmt: skip
        if self.records:  # raw plans keep the shape of earlier versions' (what pending plans are compared on)
            data["records"] = dict(self.records)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> OutputSpec:
        """The spec stored in a plan (``None``: plans of earlier versions, Parquet)."""
        if not data:
            return cls()
        return cls(
            format=data.get("format", "parquet"),
            partition=tuple(PartitionField(*f) for f in data.get("partition", ())),
            max_records_per_file=int(data.get("max_records_per_file", 0)),
            derived=tuple(tuple(d) for d in data.get("derived", ())),
            target_file_size=int(data.get("target_file_size", 0)),
            records=data.get("records"),
        )

    def settings(self) -> dict[str, Any]:
        """What the DAG author set (without the cap a byte target derives at planning): what a
        pending plan is compared on."""
        from airflow_kinesis_spark.core.planner import output_settings

        return output_settings(self.to_dict())


def plan_marker(plan: Any) -> str:
    """What identifies one plan of a batch in a table's commit metadata: its creation time (ISO
    8601, ms). A re-run of the batch re-uses the plan, so it matches; a batch of the same id
    planned after the checkpoints were reset does not."""
    from airflow_kinesis_spark.core.positions import format_timestamp

    return format_timestamp(plan.created_at)


@dataclass(frozen=True)
class TableCommit:
    """The outcome of a sink's commit of one batch (or window), for the summary, XCom and assets.

    :param format: the output format.
    :param table: the table's identifier (Iceberg ``namespace.table``, Delta table URI; Parquet:
        the output root).
    :param snapshot_id: Iceberg: the snapshot holding the batch.
    :param version: Delta: the table version holding the batch.
    :param files: data files the commit added (0 when the batch was in the table already).
    :param already_committed: the batch was in the table already (a re-run): nothing added.
    :param seconds: how long the table commit took (the protocol measures it).
    """

    format: str
    table: str
    snapshot_id: int | None = None
    version: int | None = None
    files: int = 0
    already_committed: bool = False
    seconds: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "table": self.table, "snapshot_id": self.snapshot_id, "version": self.version,
                "files": self.files, "already_committed": self.already_committed, "seconds": self.seconds,
                **dict(self.extra)}  # fmt: skip


@dataclass(frozen=True)
class BatchMark:
    """The newest batch of one (stream, consumer) an output holds (:meth:`Sink.latest_batch`).

    :param batch_id: its batch id.
    :param plan_created_at: the plan's creation time (:func:`plan_marker`), ``None`` when the
        output does not say.
    :param where: what holds it, for messages (a snapshot, a version, a committed record).
    """

    batch_id: int
    plan_created_at: str | None
    where: str


class Sink:
    """What the protocol asks of an output form (the base is the no-op of plain Parquet without
    committed records, used by protocol tests).

    Every method is idempotent: the protocol calls them again when it rolls a batch forward.

    ``output_path`` is the root the DAG author named (its owner record lives there,
    :mod:`~airflow_kinesis_spark.sinks.ownership`); ``batch_root`` is where this (stream,
    consumer)'s batches go: the root itself, or its :func:`~airflow_kinesis_spark.sinks.ownership.consumer_root`
    when ``shared_output`` is set. :func:`~airflow_kinesis_spark.sinks.build.build_sink` sets all three; the base's are empty (no
    owner record, protocol tests).
    """

    format = "parquet"
    #: The library that reads and commits the table in the worker (``delta-rs``, ``pyiceberg``;
    #: ``None``: this package's own file access), for :func:`~airflow_kinesis_spark.sinks.files.check_library_trust`.
    library: str | None = None
    output_path = ""
    batch_root = ""
    shared_output = False
    schema_evolution = "none"
    storage_options: Mapping[str, str] | None = None
    #: How the job decodes records (``core.records.RecordSettings``; ``None``: raw).
    record_settings: RecordSettings | None = None
    #: A function returning a boto3 Glue client (the operators' connection), for a schema in AWS
    #: Glue Schema Registry (called at planning) and an Iceberg Glue catalog (``IcebergSink.catalog``).
    glue_client: Callable[[], GlueClient] | None = None

    def owner(self, stream_name: str, consumer_name: str) -> Any:
        """The owner record this sink's task writes in ``output_path``."""
        from airflow_kinesis_spark.sinks.ownership import owner_of

        return owner_of(stream_name, consumer_name, self.format, self.shared_output, self.table if self.format == "iceberg" else None)

    def check_output(self, stream_name: str, consumer_name: str, store: DynamoDBCheckpointStore, head: Head,
                     pending: BatchPlan | None) -> None:  # fmt: skip
        """Before a run plans or re-uses a batch (nothing read yet): the output is this task's
        (:func:`~airflow_kinesis_spark.sinks.ownership.claim_output`), and holds no batch of this
        stream and consumer that the checkpoint store has not committed (:meth:`check_position`).

        A table library that cannot be given the storage options' CA bundle is checked first
        (:func:`~airflow_kinesis_spark.sinks.files.check_library_trust`).

        :raises OutputTrustError: the table library would not trust the output's S3 endpoint.
        :raises OutputOwnedError: the output belongs to another stream, consumer or format.
        :raises OutputAheadError: the output is ahead of the checkpoint store.
        """
        if self.library and self.output_path:
            from airflow_kinesis_spark.sinks.files import check_library_trust

            check_library_trust(self.output_path, self.storage_options, self.library)
        self.claim(stream_name, consumer_name, record=False)
        self.check_position(stream_name, consumer_name, store, head, pending)

    def claim(self, stream_name: str, consumer_name: str, *, record: bool = True) -> None:
        """The output is (stream, consumer)'s; with ``record``, an output without an owner record
        gets one (the protocol records it when a batch or window with records is about to be
        written: a run that finds nothing writes no file).

        :raises OutputOwnedError: it belongs to another stream, consumer or format.
        """
        if self.output_path:
            from airflow_kinesis_spark.sinks.ownership import claim_output

            claim_output(self.output_path, self.owner(stream_name, consumer_name), self.storage_options, record=record)

    def table_schema(self) -> Any:
        """The table's schema as a ``pyarrow.Schema`` (``None``: no table yet, or no table format)."""
        return None

    def check_schema(self, transform: str | None) -> None:
        """Before planning: without a transform the job's columns are known (the output schema,
        ``core.schema.OUTPUT_COLUMNS``, the decoded columns of an inline record schema, and the
        derived columns of :meth:`output_spec`), so a table that would refuse them is found before
        any Spark job, as the table commit would find it. With a transform the columns are known
        only once Spark ran it, and with a schema registry only once a plan holds its versions
        (read at planning, when there are records: not on every run): the table commit checks them.

        :raises TableCommitError: naming the columns (the same rules as the table commit,
            ``schema_evolution`` included).
        """
        registry = self.record_settings is not None and self.record_settings.registry
        table = self.table_schema() if not transform and not registry else None
        if table is None:
            return
        self.columns_to_add(table, self.batch_schema(self.output_spec()), "the batches (no transform)", planning=True)

    def batch_schema(self, spec: OutputSpec) -> Any:
        """The columns a batch of ``spec`` writes without a transform (``pyarrow.Schema``): the
        metadata columns (``core.schema.OUTPUT_COLUMNS``; ``data`` only for raw records or with
        ``keep_raw_data``), the decoded columns (``core.records.decoded_schema``), the derived ones.

        :raises ValueError: the record schema does not convert (naming the field).
        """
        import pyarrow as pa

        from airflow_kinesis_spark.core.record_schemas import spark_compatible
        from airflow_kinesis_spark.core.records import decoded_schema
        from airflow_kinesis_spark.core.schema import arrow_schema

        batch = arrow_schema()
        records = spec.records
        decoded = decoded_schema(records) if records else None
        if records and decoded is not None:
            if not records.get("keep_raw_data"):
                batch = batch.remove(batch.get_field_index("data"))
            for f in decoded:
                batch = batch.append(pa.field(f.name, spark_compatible(f.type)))
        derived = {"date": pa.date32()}
        for name, kind, _ in spec.derived:
            batch = batch.append(pa.field(name, derived.get(kind, pa.string())))
        return batch

    def records_spec(self) -> dict[str, Any] | None:
        """The record settings as an ``OutputSpec.records`` (``None``: raw)."""
        settings = self.record_settings
        return settings.to_dict() if settings is not None and settings.typed else None

    def columns_to_add(self, table_schema: Any, batch_schema: Any, what: str, *, planning: bool = False) -> list[Any]:
        """The batch's columns the table lacks, to add with ``schema_evolution="add_columns"``
        (``core.schema.schema_changes``; partition folder columns ignored): one rule for the
        table commit of both formats and the check before planning.

        :param what: the batch or window, for messages.
        :returns: the fields to add (nullable), ``[]`` when the columns fit.
        :raises TableCommitError: a column's type differs, or new columns without
            ``add_columns``; naming each column. Nothing committed.
        """
        from airflow_kinesis_spark.core.schema import schema_changes
        from airflow_kinesis_spark.exceptions import TableCommitError

        added, changed = schema_changes(table_schema, batch_schema, ignore=tuple(f.name for f in self.output_spec().partition))
        outcome = "Nothing was read or written." if planning else "Nothing was committed (the batch stays pending)."
        if changed:
            raise TableCommitError(
                f"{what}'s columns do not fit table {self.table}: {'; '.join(changed)}. {outcome} A column's type cannot change "
                "in place: cast it in the transform, or write to a new table (docs/output.md, schema changes).",
                table=self.table, changed=changed,
            )  # fmt: skip
        names = [f"{f.name} {f.type}" for f in added]
        if added and self.schema_evolution != "add_columns":
            raise TableCommitError(
                f"{what} has columns table {self.table} does not hold: {', '.join(names)}. {outcome} Set "
                "OutputSettings(schema_evolution='add_columns') to add them as nullable columns with the batch's commit, add them yourself "
                "(ALTER TABLE ... ADD COLUMN), or drop them in the transform.",
                table=self.table, added=names,
            )  # fmt: skip
        import pyarrow as pa

        return [pa.field(f.name, f.type, nullable=True) for f in added]

    def check_written(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> None:
        """Before the table and checkpoint commits of a batch with records: its reports agree with
        the files published at its output location (:func:`~airflow_kinesis_spark.sinks.verify.check_written`);
        the base (protocol tests without output) checks nothing.

        :raises ReportValidationError: they do not; nothing committed.
        """
        if not self.output_path:
            return
        from airflow_kinesis_spark.sinks.verify import check_written

        check_written(plan, reports, self.storage_options)

    def latest_batch(self, stream_name: str, consumer_name: str, committed_batch_id: int) -> BatchMark | None:
        """The newest batch of (stream, consumer) the output holds, as far as it tells at a small
        cost (at least: any batch above ``committed_batch_id``); ``None``: none found."""
        return None

    def check_position(self, stream_name: str, consumer_name: str, store: DynamoDBCheckpointStore, head: Head,
                       pending: BatchPlan | None) -> None:  # fmt: skip
        """The output holds no batch of (stream, consumer) beyond the store's committed one,
        except the pending batch's own (a crash between the table commit and the checkpoint
        commit: it rolls forward), and its batch at the committed id is the committed plan's.

        :raises OutputAheadError: naming the output, what it holds and the ways out.
        """
        from airflow_kinesis_spark.exceptions import OutputAheadError

        committed = head.committed_batch_id
        mark = self.latest_batch(stream_name, consumer_name, committed)
        if mark is None or mark.batch_id < committed:
            return
        if mark.batch_id == committed:
            if not mark.plan_created_at or head.committed_plan_created_at == mark.plan_created_at:
                return
            if head.committed_plan_created_at is None:  # a rewind, or a head of an earlier version: read the plan
                plan = store.committed_plan(head)
                if plan is None or plan.mode != "incremental" or plan_marker(plan) == mark.plan_created_at:
                    return
        elif pending is not None and mark.batch_id == pending.batch_id and mark.plan_created_at == plan_marker(pending):
            return
        table = getattr(store, "table_name", "?")
        planned = f", planned {mark.plan_created_at}" if mark.plan_created_at else ""
        raise OutputAheadError(
            f"Output {self.table or self.output_path} already holds batch {mark.batch_id} of stream {stream_name!r}, consumer "
            f"{consumer_name!r} ({mark.where}{planned}), but checkpoint table {table!r} has committed batch {committed} "
            f"{'from another plan' if mark.batch_id == committed else ''}: the output is ahead of the checkpoint store (the "
            "checkpoint table was re-created, reset or restored, or another checkpoint table writes this output). Nothing "
            "was read, written or deleted. Ways out: point checkpoint_table back at the table that committed these batches "
            "(a deleted one can be restored from its DynamoDB point-in-time recovery backup); or write this consumer's new "
            f"history to a new output_path{' or table' if self.format != 'parquet' else ''}. Do not reuse the output with a new "
            "checkpoint history: it would read the same records again.",
            output=self.table or self.output_path, batch_id=mark.batch_id, committed_batch_id=committed,
            plan_created_at=mark.plan_created_at,
        )  # fmt: skip

    def output_spec(self) -> OutputSpec:
        """What the job writes (stored in each plan)."""
        return OutputSpec(self.format, records=self.records_spec())

    def stored_bytes_per_row(self) -> float | None:
        """Bytes per row of the table's latest commit (``None``: no table or no rows yet)."""
        return None

    def planned_output_spec(self) -> OutputSpec:
        """:meth:`output_spec` for a new plan: a ``target_file_size`` becomes ``max_records_per_file``
        (target / the latest commit's stored bytes per row, at least 1); the first batch of a new
        table has no estimate and no cap."""
        from dataclasses import replace

        spec = self.output_spec()
        if self.record_settings is not None and self.record_settings.registry:
            from airflow_kinesis_spark.core.records import decoded_schema, resolve_registry

            if self.glue_client is None:
                raise ValueError("schema_registry needs a Glue client: the operator's aws_conn_id provides it")
            resolved = resolve_registry(self.glue_client(), self.record_settings)
            decoded_schema(resolved)  # versions that type a field differently: TableCommitError now, not in the job
            spec = replace(spec, records=resolved)
        if not spec.target_file_size or spec.max_records_per_file:
            return spec
        per_row = self.stored_bytes_per_row()
        return spec if not per_row else replace(spec, max_records_per_file=max(1, int(spec.target_file_size / per_row)))

    @property
    def table(self) -> str:
        """The table's identifier (for summaries, assets and lineage)."""
        return ""

    def commit_batch(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> TableCommit | None:
        """Make batch ``plan`` visible in the table before its checkpoints advance; a batch already
        in the table adds nothing. Called only for batches with records."""
        return None

    def after_checkpoint_commit(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> None:
        """After the checkpoints advanced (Parquet: write the committed record)."""

    def sweep_staging(self, plan: BatchPlan) -> list[str]:
        """After batch ``plan``'s checkpoint commit: remove the staging folders of this batch and of
        earlier ones under ``{batch_root}/_staging/`` (killed or superseded drivers'; a committed
        batch is proof no driver of them can still publish). One listing of ``_staging``; window
        staging folders and later batches' stay (:func:`~airflow_kinesis_spark.sinks.leftovers.sweep_staging`).

        Best effort: the checkpoints are committed, so a failure is logged, never raised.

        :returns: the removed folders.
        """
        import logging

        from airflow_kinesis_spark.sinks.leftovers import sweep_staging

        root = self.batch_root or plan.output_location.rstrip("/").rpartition("/")[0]
        if getattr(plan, "mode", "incremental") != "incremental" or not root:
            return []
        try:
            return sweep_staging(root, plan.batch_id, self.storage_options)
        except Exception as err:  # noqa: BLE001 - leftovers only cost storage; `kinesis-spark leftovers` finds them later
            logging.getLogger(__name__).warning("batch %d: could not remove the staging folders of committed batches under "
                                                "%s/_staging: %s", plan.batch_id, root, err)  # fmt: skip
            return []

    def repair(self, store: DynamoDBCheckpointStore, head: Head) -> None:
        """Before a run plans: finish what a crash after the last checkpoint commit left undone."""

    def commit_window(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> TableCommit | None:
        """Replace the window's rows in the table with the window's files, atomically."""
        return None

    def compact(self, start: Any, end: Any, *, target_size: int | None = None) -> dict[str, Any]:
        """Rewrite the small files holding rows that arrived in ``[start, end)`` (tables only).

        :param target_size: target bytes per file (Delta's ``optimize.compact``); Iceberg uses its
            table's ``write.target-file-size-bytes`` and refuses another value.
        :raises ValueError: this output form has no table to compact.
        """
        raise ValueError(f"a {self.format!r} output has no table to compact: compaction is for 'iceberg' and 'delta' outputs")

