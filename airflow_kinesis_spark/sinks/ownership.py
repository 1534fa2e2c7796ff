"""Who an output root belongs to: one (stream, consumer), unless the DAG author declares it shared.

The first run that plans a batch (or a window) into an ``output_path`` records its owner in
``{output_path}/_kinesis_spark_output.json`` (a ``_`` file: Spark, Hive, Athena, Trino and the
table formats' readers skip it)::

    {"stream": "orders", "consumer": "lake", "format": "iceberg", "shared": false,
     "table": "lake.orders", "created_at": "2026-11-27T10:00:00.000Z"}

Every later run reads it before anything is read from Kinesis, and a run of another stream or
consumer, another output format, or with ``shared_output`` set differently fails
(:class:`~airflow_kinesis_spark.exceptions.OutputOwnedError`). With ``shared_output=True`` on every
task that writes the root, the record says ``"shared": true`` (no stream or consumer), and each
(stream, consumer) writes under its own folder :func:`consumer_root`, so no two consumers' batch
folders, committed records or file names can collide.

The record is created with an exclusive create on a local file system; on S3 it is written and
read back (S3 has no create-if-absent through ``pyarrow.fs``), so two consumers whose *first*
batches start within the same moment may both pass this check. For tables, the table's own
commit history is checked as well (``IcebergSink``: snapshot summaries; ``DeltaSink``: the
transaction of the consumer), which closes that window at the table commit.

No Airflow import.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.exceptions import OutputOwnedError
from airflow_kinesis_spark.sinks.files import filesystem, read_text, write_text

log = logging.getLogger(__name__)

__all__ = ["OWNER_FILE", "OutputOwner", "consumer_root", "owner_location", "claim_output", "read_owner"]

#: The owner record's file name in an output root.
OWNER_FILE = "_kinesis_spark_output.json"


@dataclass(frozen=True)
class OutputOwner:
    """What an output root records of its owner.

    :param stream: the stream's name (an ARN is recorded as its name: both share checkpoints).
    :param consumer: the consumer (application) name; ``""`` for a shared root.
    :param format: ``parquet``, ``iceberg`` or ``delta``.
    :param shared: the root is shared by several (stream, consumer) pairs, each in :func:`consumer_root`.
    :param table: the Iceberg table identifier (``""`` for the other formats).
    """

    stream: str
    consumer: str
    format: str
    shared: bool = False
    table: str = ""

    def describe(self) -> str:
        if self.shared:
            return f"shared {self.format} output" + (f" of table {self.table}" if self.table else "")
        return f"stream {self.stream!r}, consumer {self.consumer!r}, format {self.format}" + (
            f", table {self.table}" if self.table else ""
        )


def consumer_root(output_path: str, stream_name: str, consumer_name: str, shared: bool) -> str:
    """Where a (stream, consumer)'s batches go under ``output_path``: the root itself, or for a
    shared root ``{output_path}/stream={stream}/consumer={consumer}`` (readers that discover
    Hive-style partitions get ``stream`` and ``consumer`` columns)."""
    root = output_path.rstrip("/")
    if not shared:
        return root
    return f"{root}/stream={stream_name_of(stream_name)}/consumer={consumer_name}"


def owner_location(output_path: str) -> str:
    """``{output_path}/_kinesis_spark_output.json``."""
    return f"{output_path.rstrip('/')}/{OWNER_FILE}"


def read_owner(output_path: str, storage_options: Mapping[str, str] | None = None) -> OutputOwner | None:
    """The root's owner record, or ``None`` when the root has none.

    :raises OutputOwnedError: the record is not the JSON this module writes (naming the file).
    """
    text = read_text(owner_location(output_path), storage_options)
    if text is None:
        return None
    try:
        data = json.loads(text)
        return OutputOwner(stream=str(data["stream"]), consumer=str(data["consumer"]), format=str(data["format"]),
                           shared=bool(data.get("shared", False)), table=str(data.get("table") or ""))  # fmt: skip
    except (ValueError, KeyError, TypeError) as err:
        raise OutputOwnedError(
            f"{owner_location(output_path)} is not an owner record of airflow-kinesis-spark ({err}). Nothing was read or "
            "written. Restore it, or write to another output_path.",
            output=output_path, owner=None, wanted=None,
        ) from err


def _create(location: str, text: str, storage_options: Mapping[str, str] | None) -> bool:
    """Create the file ``location`` unless it exists; whether this call created it (exclusive on a
    local file system; on S3 a plain PUT, checked by the caller's read-back)."""
    from pyarrow import fs

    filesys, path = filesystem(location, storage_options)
    if isinstance(filesys, fs.LocalFileSystem):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        return True
    write_text(location, text, storage_options)
    return True


def claim_output(
    output_path: str, wanted: OutputOwner, storage_options: Mapping[str, str] | None = None, *, record: bool = True
) -> OutputOwner | None:
    """Check that ``output_path`` is ``wanted``'s, recording it as such when it has no owner yet.

    :param wanted: this task's (stream, consumer, format, shared, table).
    :param record: write the owner record when there is none (else only compare).
    :returns: the owner record now in the root (``None``: none, and ``record`` is off).
    :raises OutputOwnedError: the root records another owner; the message names both and the
        ways out (another ``output_path``; ``shared_output=True`` on every task that writes it,
        for a root that is new; or the owner's own stream and consumer names).
    """
    wanted = OutputOwner(stream_name_of(wanted.stream) if not wanted.shared else "", "" if wanted.shared else wanted.consumer,
                         wanted.format, wanted.shared, wanted.table)  # fmt: skip
    try:
        found = read_owner(output_path, storage_options)
        if found is None and not record:
            return None
        if found is None:
            text = json.dumps({**asdict(wanted), "created_at": format_timestamp(datetime.now(timezone.utc))}, sort_keys=True)
            if _create(owner_location(output_path), text + "\n", storage_options):
                log.info("output %s: recorded its owner (%s) in %s", output_path, wanted.describe(), OWNER_FILE)
            found = read_owner(output_path, storage_options)  # read back: another first writer may have won
    except ValueError as err:  # a scheme the worker's file system library does not read
        raise ValueError(f"output_path {output_path!r}: the Airflow worker reads and writes the output root too (its owner "
                         f"record, committed records, table commits) and handles local paths, file:// and s3:// (s3a://, "
                         f"s3n://) only ({err}). Nothing was read or written.") from err  # fmt: skip
    except OSError as err:
        raise OSError(f"Cannot read or write the owner record {owner_location(output_path)} of output_path {output_path!r}: "
                      f"{err}. Nothing was read or written. Check output_path, and that the connection's credentials "
                      "(or storage_options) may read and write it.") from err  # fmt: skip
    assert found is not None
    if found == wanted:
        return found
    what = f"Output {output_path} belongs to {found.describe()} (recorded in {owner_location(output_path)})"
    if found.shared != wanted.shared:
        fix = (
            "Set OutputSettings(shared_output=True) on every task that writes it (each (stream, consumer) then writes under "
            f"{consumer_root(output_path, '<stream>', '<consumer>', True)}), or give this task another output_path."
            if found.shared
            else "A root written by one consumer cannot become shared: give this task another output_path."
        )
    elif found.format != wanted.format or found.table != wanted.table:
        fix = "Give this task another output_path: one root holds one output format (and one Iceberg table)."
    else:
        fix = (
            f"Two consumers writing one root would overwrite each other's batches. Give this task another output_path, "
            f"or, if this task is meant to continue {found.consumer!r}'s output, its stream and consumer names."
        )
    raise OutputOwnedError(
        f"{what}; this task is {wanted.describe()}. Nothing was read or written. {fix}",
        output=output_path, owner=asdict(found), wanted=asdict(wanted),
    )  # fmt: skip


def owner_of(stream_name: str, consumer_name: str, output_format: str, shared: bool, table: str | None) -> OutputOwner:
    """The owner record a task of (stream, consumer) writes."""
    return OutputOwner(stream_name_of(stream_name), consumer_name, output_format, shared, table or "")
