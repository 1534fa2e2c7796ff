"""Parquet directories, made honest for readers that do not ask DynamoDB.

A batch's folder ``{output_path}/batch_id=N`` may hold a pending or failed batch's files (the
job published them; the checkpoints did not advance yet, and a re-run overwrites them). Spark
writes no ``_SUCCESS`` there (``mapreduce.fileoutputcommitter.marksuccessfuljobs=false``). Only
after the checkpoint commit does the batch get:

- its **committed record** ``{output_path}/_committed/batch_id=N/manifest``: the batch's data
  files, one URI per line. This is Hive's ``SymlinkTextInputFormat`` layout, so an Athena/Trino
  table over ``{output_path}/_committed/`` reads committed batches only (docs/output.md has the
  DDL), and Spark or pyarrow read the listed files;
- a ``_SUCCESS`` marker in the batch folder;
- beside the manifest, ``_batch.json``: the stream, consumer, batch id, plan creation time and
  checkpoint table of the batch (a ``_`` file: Hive's and Athena's symlink readers skip it).
  Before planning, a run checks the root holds no committed record of a batch its checkpoint
  store has not committed (``Sink.check_position``): a re-created checkpoint table or a second
  checkpoint history writing the same root fails before any Spark job, and the job itself never
  replaces a batch folder that has a committed record (``job.batch.refuse_committed``).

A crash between the checkpoint commit and these writes is repaired by the next run, before it
plans (:meth:`ParquetSink.repair`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.core.locations import COMMITTED_DIR, committed_record_location
from airflow_kinesis_spark.sinks import BatchMark, Sink, TableCommit, plan_marker
from airflow_kinesis_spark.sinks.files import exists, list_data_files, read_schema, read_text, write_text

if TYPE_CHECKING:
    from airflow_kinesis_spark.core.head import Head
    from airflow_kinesis_spark.core.planner import BatchPlan
    from airflow_kinesis_spark.core.ranges import ShardReport
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

log = logging.getLogger(__name__)

__all__ = ["ParquetSink", "COMMITTED_DIR", "committed_record_location", "committed_files", "batch_record_location"]

def batch_record_location(output_root: str, batch_id: int) -> str:
    """``{output_root}/_committed/batch_id={batch_id}/_batch.json``: which batch the record is."""
    return f"{output_root.rstrip('/')}/{COMMITTED_DIR}/batch_id={batch_id}/_batch.json"


def committed_files(output_root: str, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """Every data file of every committed batch under ``output_root``, from the committed records
    (what a reader without DynamoDB reads; docs/output.md)."""
    from pyarrow import fs

    from airflow_kinesis_spark.sinks.files import filesystem

    filesys, root = filesystem(f"{output_root.rstrip('/')}/{COMMITTED_DIR}", storage_options)
    if filesys.get_file_info(root).type == fs.FileType.NotFound:
        return []
    files: list[str] = []
    for item in sorted(filesys.get_file_info(fs.FileSelector(root, recursive=True)), key=lambda i: i.path):
        if item.type == fs.FileType.File and item.base_name == "manifest":
            with filesys.open_input_stream(item.path) as src:
                files += [line for line in src.read().decode().splitlines() if line]
    return files


def batch_schema_record(data_file: str, records: Mapping[str, Any] | None, storage_options: Mapping[str, str] | None) -> dict[str, Any]:
    """What a Parquet batch's record says of its schema (Parquet folders have no table schema):
    ``schema`` (``[[column, Arrow type], ...]`` of ``data_file``, the batch's first data file),
    ``record_format``, and with a schema registry ``schema_versions`` (version number -> version
    id the plan decoded with)."""
    schema = read_schema(data_file, storage_options)
    about: dict[str, Any] = {"schema": [[f.name, str(f.type)] for f in schema], "record_format": (records or {}).get("format", "raw")}
    if records and records.get("versions"):
        about["schema_versions"] = {str(v["number"]): vid for vid, v in sorted(records["versions"].items(), key=lambda kv: kv[1]["number"])}
    return about


class ParquetSink(Sink):
    """``{output_path}/batch_id=N`` folders with committed records (module doc).

    :param output_root: the operator's ``output_path``.
    :param storage_options: credentials and endpoint for an ``s3://`` root (:mod:`~airflow_kinesis_spark.sinks.files`).
    """

    format = "parquet"

    def __init__(self, output_root: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.output_root = output_root.rstrip("/")
        self.storage_options = dict(storage_options or {})

    @property
    def table(self) -> str:
        return self.output_root

    def after_checkpoint_commit(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> None:
        """Write batch ``plan``'s committed record and ``_SUCCESS`` (a batch with records only)."""
        if not sum(r.records for r in reports) or not plan.output_location.startswith(self.output_root + "/"):
            return
        files = list_data_files(plan.output_location, self.storage_options)
        if not files:
            # The checkpoints are committed: failing here would fail every later run too (repair).
            log.error(
                "batch %d is committed with %d records but %s holds no data file: the output was removed after the job "
                "wrote it (or the job wrote elsewhere). No committed record is written for it; re-run the batch's time "
                "range with KinesisWindowToSparkOperator to restore its rows.",
                plan.batch_id, sum(r.records for r in reports), plan.output_location,
            )  # fmt: skip
            return
        listing = "".join(f"{plan.output_location}/{f.path}\n" for f in files)
        about = {"stream": stream_name_of(plan.stream_name), "consumer": plan.consumer_name, "batch_id": plan.batch_id,
                 "plan_created_at": plan_marker(plan), "checkpoint_table": plan.checkpoint_table, "files": len(files),
                 **batch_schema_record(files[0].uri, (plan.output or {}).get("records"), self.storage_options)}  # fmt: skip
        write_text(batch_record_location(self.output_root, plan.batch_id), json.dumps(about, sort_keys=True) + "\n", self.storage_options)
        write_text(committed_record_location(self.output_root, plan.batch_id), listing, self.storage_options)
        write_text(f"{plan.output_location}/_SUCCESS", "", self.storage_options)
        log.info("batch %d: committed record written (%d data files) at %s", plan.batch_id, len(files),
                 committed_record_location(self.output_root, plan.batch_id))  # fmt: skip

    def repair(self, store: DynamoDBCheckpointStore, head: Head) -> None:
        """Write the committed record of the last committed batch when a crash after its
        checkpoint commit left it unwritten (one existence check per run; none after a batch
        committed without a job's report: it had no records, so it has no committed record)."""
        batch_id = head.committed_batch_id
        if not batch_id or head.committed_report_owner is None:
            return
        if exists(committed_record_location(self.output_root, batch_id), self.storage_options):
            return
        plan = store.committed_plan(head)
        reports = store.committed_report(head) or []
        if plan is None or plan.batch_id != batch_id or not sum(r.records for r in reports):
            return
        log.warning("batch %d is committed but its committed record is missing (a crash after the checkpoint commit): "
                    "writing it now", batch_id)  # fmt: skip
        self.after_checkpoint_commit(plan, reports)

    def latest_batch(self, stream_name: str, consumer_name: str, committed_batch_id: int) -> BatchMark | None:
        """A committed record of batch ``committed_batch_id + 1`` (the root is ahead), else the
        committed batch's own record (with its plan's creation time, when it says)."""
        for batch_id in (committed_batch_id + 1, committed_batch_id):
            if batch_id < 1 or not exists(committed_record_location(self.output_root, batch_id), self.storage_options):
                continue
            text = read_text(batch_record_location(self.output_root, batch_id), self.storage_options)
            try:
                about = json.loads(text) if text else {}
            except ValueError:
                about = {}
            if about and (about.get("stream"), about.get("consumer")) != (stream_name_of(stream_name), consumer_name):
                about = {}  # not this consumer's record: the owner record decides whose root it is
            return BatchMark(batch_id, about.get("plan_created_at"), f"committed record {committed_record_location(self.output_root, batch_id)}")
        return None

    def commit_batch(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> TableCommit | None:
        """Nothing to make visible before the checkpoints advance: the committed record follows them."""
        return TableCommit(format="parquet", table=self.output_root)
