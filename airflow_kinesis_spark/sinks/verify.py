"""The commit's check of a job's report against the output the job actually published (BOUND).

A report is stored in the checkpoint table, which is untrusted state: a job's credentials (table
write for an hour) are enough to record a forged one, e.g. ``records=1`` and ``last`` = the
shard's newest record, which would commit the checkpoint past records never written. So before
the table commit and the checkpoint commit, the worker reads the batch's data files (the ones the
table commit adds, or the Parquet committed record lists) and compares, per shard, the number of
rows and the newest extended sequence number (sequence number, sub-sequence number) with the
report. The files are read as a stream of record batches, three columns only (``shard_id``,
``sequence_number``, ``sub_sequence_number``): memory grows with the number of shards, not rows.

A batch with a transform is checked only for having data files: a transform's rows need not be
one per record (filters, aggregations), nor keep the key columns. Dead letters are checked
whatever the transform: the quarantine output (written raw, before any transform) must hold each
shard's reported corrupt records and dead letters.

No Airflow import.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_kinesis_spark.exceptions import ReportValidationError
from airflow_kinesis_spark.sinks.files import filesystem, list_data_files

log = logging.getLogger(__name__)

__all__ = ["written_by_shard", "check_written"]

#: Columns the check reads (the job's output schema, ``core.schema.OUTPUT_COLUMNS``).
KEY_COLUMNS = ("shard_id", "sequence_number", "sub_sequence_number")
#: Sequence numbers are decimal strings of up to 128 bits (39 digits; Kinesis's have 56 so far):
#: left-padded to this width, their text order is their numeric order.
SEQUENCE_WIDTH = 64


def _order_key(batch: Any) -> Any:
    """Per row, a string whose text order is the extended sequence number's order:
    ``{sequence number padded}:{sub-sequence number + 1 padded}`` (a plain record's null sub
    sorts before an aggregate's 0)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    seq = pc.utf8_lpad(batch.column("sequence_number"), SEQUENCE_WIDTH, "0")
    sub = pc.cast(pc.add(pc.fill_null(pc.cast(batch.column("sub_sequence_number"), pa.int64()), -1), 1), pa.string())
    return pc.binary_join_element_wise(seq, pc.utf8_lpad(sub, 12, "0"), ":")


def written_by_shard(location: str, storage_options: Mapping[str, str] | None = None) -> dict[str, tuple[int, str | None]] | None:
    """Per shard of the data files under ``location``: ``(rows, newest extended sequence number
    as "seq" or "seq/sub")``; ``None`` when the files lack the key columns.

    :raises ReportValidationError: no data file under ``location``.
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    files = list_data_files(location, storage_options)
    if not files:
        return {}
    filesys, _ = filesystem(files[0].uri, storage_options)
    dataset = ds.dataset([filesystem(f.uri, storage_options)[1] for f in files], filesystem=filesys, format="parquet")
    if any(name not in dataset.schema.names for name in KEY_COLUMNS):
        return None
    found: dict[str, tuple[int, str]] = {}
    for batch in dataset.to_batches(columns=list(KEY_COLUMNS), batch_size=64 * 1024):
        if batch.num_rows == 0:
            continue
        table = pa.table({"shard_id": batch.column("shard_id"), "key": _order_key(batch)})
        for row in table.group_by("shard_id").aggregate([("key", "count"), ("key", "max")]).to_pylist():
            rows, newest = found.get(row["shard_id"], (0, ""))
            found[row["shard_id"]] = (rows + row["key_count"], max(newest, row["key_max"]))
    return {shard: (rows, _extended(key)) for shard, (rows, key) in found.items()}


def _extended(key: str) -> str:
    """``"{seq}"`` or ``"{seq}/{sub}"`` from :func:`_order_key`'s text."""
    seq, sub = key.split(":")
    seq, sub_plus_one = seq.lstrip("0") or "0", int(sub)
    return seq if sub_plus_one == 0 else f"{seq}/{sub_plus_one - 1}"


def _key(text: str | None) -> tuple[int, int] | None:
    """``"seq"`` / ``"seq/sub"`` as ``ExtendedSequenceNumber.key``."""
    if text is None:
        return None
    seq, _, sub = text.partition("/")
    return int(seq), int(sub) if sub else -1


def check_written(plan: Any, reports: Sequence[Any], storage_options: Mapping[str, str] | None = None) -> None:
    """Compare batch ``plan``'s reports with the files published at ``plan.output_location``.

    :raises ReportValidationError: the files' rows or newest record of a shard differ from its
        report (or a batch with records has no data file); naming each shard. Nothing committed.
    """
    records = sum(r.records for r in reports)
    if not records:
        return
    transform = (plan.task_settings or {}).get("transform")
    what = f"batch {plan.batch_id} of stream {plan.stream_name!r}, consumer {plan.consumer_name!r}"
    # With a transform only the files' existence is checked: no need to scan their rows.
    written = written_by_shard(plan.output_location, storage_options) if not transform else (
        None if list_data_files(plan.output_location, storage_options) else {})  # fmt: skip
    if written == {}:
        raise ReportValidationError(
            f"The report of {what} counts {records} records, but {plan.output_location} holds no data file. Nothing was "
            "committed. The output was removed after the job wrote it, or the report is not this job's: check who can "
            "write the checkpoint table and the output (docs/security.md); discard the pending batch to plan it anew.",
            batch_id=plan.batch_id,
        )  # fmt: skip
    # A dead letter is a skipped record unless the quarantine output holds it: checked whatever
    # the transform (the job writes dead letters raw, before any transform).
    problems = _dead_letter_problems(plan, reports, storage_options)
    if transform or written is None:
        _raise_if(problems, what, plan)
        log.info("%s: the report is checked for data files and dead letters only (%s)", what,
                 "a transform" if transform else "no key columns")  # fmt: skip
        return
    for shard in sorted({r.shard_id for r in reports} | set(written)):
        shard_reports = [r for r in reports if r.shard_id == shard]
        # Dead letters (records that did not decode) are read records kept in the quarantine
        # output, not in the files' rows.
        reported = sum(r.records - r.dead_letters for r in shard_reports)
        last = max((r.last for r in shard_reports if r.records and r.last is not None), key=lambda p: p.key, default=None)
        rows, newest = written.get(shard, (0, None))
        # A report's last covers corrupt records and dead letters it quarantined (not in the files):
        # then the files' newest record may be earlier than it, never later.
        quarantined = any(r.quarantined or r.dead_letters for r in shard_reports)
        newest_key, last_key = _key(newest), (last.key if last is not None else None)
        same_last = newest_key == last_key or (quarantined and newest_key is not None and last_key is not None and newest_key <= last_key)
        if rows != reported or (reported and not same_last):
            problems.append(f"shard {shard}: the report says {reported} records up to {last}, the files hold {rows} up to "
                            f"{newest}")  # fmt: skip
    _raise_if(problems, what, plan)
    log.info("%s: report checked against the %d shards' rows in the published files", what, len(written))


def _dead_letter_problems(plan: Any, reports: Sequence[Any], storage_options: Mapping[str, str] | None) -> list[str]:
    """Per shard with dead letters: the quarantine output holds its reported corrupt records and
    dead letters (``[]``: it does, or no dead letter was reported)."""
    if not any(r.dead_letters for r in reports):
        return []
    kept = written_by_shard(f"{plan.output_location}/_quarantine", storage_options) or {}
    problems = []
    for shard in sorted({r.shard_id for r in reports if r.dead_letters}):
        expected = sum(r.quarantined + r.dead_letters for r in reports if r.shard_id == shard)
        held = kept.get(shard, (0, None))[0]
        if held != expected:
            problems.append(f"shard {shard}: the report says {expected} quarantined records and dead letters, the "
                            f"quarantine output holds {held}")  # fmt: skip
    return problems


def _raise_if(problems: list[str], what: str, plan: Any) -> None:
    """:raises ReportValidationError: naming ``problems`` (at most five shards), when there are any."""
    if problems:
        raise ReportValidationError(
            f"The report of {what} does not match the output published at {plan.output_location}: {'; '.join(problems[:5])}"
            f"{f'; and {len(problems) - 5} more shards' if len(problems) > 5 else ''}. Nothing was committed: committing it "
            "would move checkpoints past records that were not written. The report is not this job's, or the output was "
            "changed after the job: check who can write the checkpoint table and the output (docs/security.md); discard "
            "the pending batch to plan it anew.",
            batch_id=plan.batch_id, problems=problems,
        )  # fmt: skip
