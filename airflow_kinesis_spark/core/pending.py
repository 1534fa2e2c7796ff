"""A pending plan checked against what this task would plan, before an incremental run re-uses it.

A batch's plan is persisted before its job runs and stays pending until it is committed; a later
run re-uses it rather than plan anew (``core.protocol.prepare_incremental``). The checkpoint table
is state anyone with write access to it can change, and a DAG's settings change, so a stored plan
is re-used only when it is this task's:

* :func:`check_pending_plan` compares it with the task's settings and the committed checkpoints
  (:func:`pending_plan_differences`: one line per difference, naming the task's argument that
  sets the item);
* :func:`check_pending_against_stream` checks what needs the stream: the ranges' shards and
  their parents, recorded trim gaps, an enhanced fan-out consumer's ARN.

Either raises :class:`~airflow_kinesis_spark.exceptions.PendingPlanMismatchError` with the fix
(put the argument back, or drop the pending batch: :func:`discard_pending_command`). ``settings``
is the task's ``core.protocol.IncrementalSettings`` (this module does not import the protocol:
the protocol imports it). Whether the pending batch's start positions fell behind the trim
horizon is the protocol's to decide (it may discard the batch).

No Airflow import.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.lag import find_trim_gaps
from airflow_kinesis_spark.core.locations import _is_table, batch_output_location, planned_output_location
from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.core.planner import BatchPlan, initial_checkpoint, output_settings
from airflow_kinesis_spark.core.positions import Sentinel, format_timestamp
from airflow_kinesis_spark.core.ranges import StartPosition
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.exceptions import PendingPlanMismatchError

if TYPE_CHECKING:
    from airflow_kinesis_spark.core.head import Head
    from airflow_kinesis_spark.core.protocol import IncrementalSettings
    from mypy_boto3_kinesis import KinesisClient
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
    from airflow_kinesis_spark.sinks import Sink

__all__ = [
    "check_pending_plan",
    "check_pending_against_stream",
    "pending_plan_differences",
    "discard_pending_command",
]


def _output_spec(sink: Sink | None, *, planning: bool = False) -> dict[str, Any] | None:
    """The sink's ``OutputSpec`` as stored in a plan (``planning``: with the cap a byte target
    derives); else the DAG author's settings, what a pending plan is compared on."""
    if sink is None:
        return None
    return sink.planned_output_spec().to_dict() if planning else sink.output_spec().settings()


#: The task's arguments that set each compared item of a pending plan: what to put back when it
#: differs. Items not listed (batch id, mode, stream, consumer, checkpoint table, checkpoints and
#: start positions) follow from the checkpoint table itself: no argument of the task explains a
#: difference there, someone else wrote the table.
_SET_BY = {
    "output location": "output_path",
    "output format": "output_settings.format",
    "partitioning": "output_settings.partition_by",
    "max records per file": "output_settings.max_records_per_file",
    "target file size": "output_settings.target_file_size",
    "derived columns": "output_settings.format, output_settings.partition_by",
    "consumer type": "consumer_type",
    "transform": "transform",
    "max records per shard": "max_records_per_shard",
    "max bytes per shard": "max_bytes_per_shard",
    "initial position": "initial_position, initial_timestamp",
    "output records": "record_settings",
}
#: Keys of a stored output spec (``OutputSpec.to_dict``) and how differences in them are named.
_OUTPUT_ITEMS = {"format": "output format", "partition": "partitioning", "max_records_per_file": "max records per file",
                 "target_file_size": "target file size", "derived": "derived columns"}  # fmt: skip


def _task_settings(settings: IncrementalSettings) -> dict[str, Any]:
    """What a plan records of the task's settings that its ranges do not show (``BatchPlan.task_settings``)."""
    return {"transform": settings.transform or None}


def _initial_position(settings: IncrementalSettings) -> str:
    """The task's initial position as compared with a plan's: ``AT_TIMESTAMP`` with its time."""
    if settings.initial_position == "AT_TIMESTAMP" and settings.initial_timestamp is not None:
        return f"AT_TIMESTAMP {format_timestamp(settings.initial_timestamp)}"
    return settings.initial_position


def _planned_initial_position(plan: BatchPlan) -> str | None:
    """The initial position a first batch (no checkpoint yet) was planned with, read from its
    ranges' starts: ``TRIM_HORIZON``, ``LATEST`` (``AT_TIMESTAMP`` of the planning time, see
    ``planner.initial_checkpoint``) or ``AT_TIMESTAMP <time>``; ``None`` when the plan does not
    show one (a later batch: its never-seen shards may be children, which start at ``TRIM_HORIZON``)."""
    starts = {r.start_checkpoint for r in plan.ranges if r.shard_id not in plan.trim_gaps}
    if plan.checkpoints or len(starts) != 1:
        return None
    (start,) = starts
    if start.sentinel is Sentinel.TRIM_HORIZON:
        return "TRIM_HORIZON"
    if start.sentinel is Sentinel.AT_TIMESTAMP and start.timestamp is not None:
        return "LATEST" if start.timestamp == plan.created_at else f"AT_TIMESTAMP {format_timestamp(start.timestamp)}"
    return None


def _caps(plan: BatchPlan, name: str) -> Any:
    """A cap of the plan's ranges (``max_records`` or ``max_bytes``): one value, or the sorted
    values when the ranges disagree (no task plans that)."""
    values = {getattr(r, name) for r in plan.ranges}
    return next(iter(values)) if len(values) == 1 else sorted(values, key=str)


def _differences(plan: BatchPlan, head: Head, store: DynamoDBCheckpointStore, settings: IncrementalSettings) -> list[tuple[str, str]]:
    """``(item, line)`` per difference of :func:`pending_plan_differences`."""
    pending_batch_id = head.pending_batch_id
    expected: dict[str, Any] = {
        "batch id": pending_batch_id,
        "mode": "incremental",
        "stream": stream_name_of(settings.stream_name),  # a stream's name and its ARN share checkpoints
        "consumer": settings.consumer_name,
        "checkpoint table": store.table_name,
        "output location": planned_output_location(settings.output_root, replace(plan, batch_id=pending_batch_id or 0),
                                                   settings.sink),
        "consumer type": settings.consumer_type,
    }
    if _is_table(settings.sink) and plan.output_location == batch_output_location(settings.output_root, plan.batch_id):
        expected["output location"] = plan.output_location  # a table's plan made before plan ids named folders
    stored: dict[str, Any] = {
        "batch id": plan.batch_id,
        "mode": plan.mode,
        "stream": stream_name_of(plan.stream_name),
        "consumer": plan.consumer_name,
        "checkpoint table": plan.checkpoint_table or store.table_name,  # plans of earlier versions do not name it
        "output location": plan.output_location,
        "consumer type": "efo" if plan.consumer_arn else "polling",
    }
    want_output, have_output = _output_spec(settings.sink), (output_settings(plan.output) if plan.output else None)
    if want_output is None or have_output is None:  # protocol tests, and plans of earlier versions: Parquet
        expected["output format"] = (want_output or {}).get("format", "parquet")
        stored["output format"] = (have_output or {}).get("format", "parquet")
    else:
        for key in [*_OUTPUT_ITEMS, *sorted(set(want_output) | set(have_output) - set(_OUTPUT_ITEMS))]:
            item = _OUTPUT_ITEMS.get(key, f"output {key}")
            expected[item], stored[item] = want_output.get(key), have_output.get(key)
    if plan.task_settings is not None:  # plans of earlier versions did not record them
        expected["transform"], stored["transform"] = _task_settings(settings)["transform"], plan.task_settings.get("transform")
    if plan.ranges:
        expected["max records per shard"], stored["max records per shard"] = settings.max_records_per_shard, _caps(plan, "max_records")
        expected["max bytes per shard"], stored["max bytes per shard"] = settings.max_bytes_per_shard, _caps(plan, "max_bytes")
    if (planned_initial := _planned_initial_position(plan)) is not None:
        expected["initial position"], stored["initial position"] = _initial_position(settings), planned_initial
    found = [
        (k, f"{k}: the plan has {stored[k]!r}, this task has {v!r}" + (f" (set by {_SET_BY[k]})" if k in _SET_BY else ""))
        for k, v in expected.items() if stored[k] != v
    ]  # fmt: skip
    if any(k not in _SET_BY for k, _ in found):
        return found  # not this consumer's plan: its start positions say nothing more
    if pending_batch_id is not None and pending_batch_id != head.committed_batch_id + 1:
        found.append(("pending batch id", f"batch id: pending batch {pending_batch_id} does not follow committed batch "
                      f"{head.committed_batch_id}"))  # fmt: skip
    # a persisted plan holds no stored shard iterators (BatchPlan.without_resume_iterators): the rest must match
    committed = {k: v.without_resume_iterator().to_dict() for k, v in store.committed_checkpoints(head).items()}
    if {k: v.without_resume_iterator().to_dict() for k, v in plan.checkpoints.items()} != committed:
        found.append(("checkpoints", "checkpoints: the plan starts from checkpoints other than the committed ones"))
    initial = initial_checkpoint(settings.initial_position, now=plan.created_at, initial_timestamp=settings.initial_timestamp)
    initial_changed = any(k == "initial position" for k, _ in found)
    for rng in plan.ranges:
        known = plan.checkpoints.get(rng.shard_id)
        start = rng.start_checkpoint
        if rng.shard_id in plan.trim_gaps:
            # a recorded trim gap: only with allow_data_loss, from the oldest record kept (the gap's
            # reality is checked against the stream by check_pending_against_stream)
            allowed = settings.allow_data_loss and start.sentinel is Sentinel.TRIM_HORIZON
            why = "over a recorded trim gap, which this task does not allow (allow_data_loss=False)" if not settings.allow_data_loss \
                else "over a recorded trim gap, but not from TRIM_HORIZON"  # fmt: skip
        elif known is None:
            # a never-seen shard: the oldest record kept (a child of read parents), or the task's
            # initial position (a changed initial_position is reported as such above)
            allowed = start.sentinel is Sentinel.TRIM_HORIZON or start == initial or initial_changed
            why = f"for a shard without a checkpoint, neither TRIM_HORIZON nor the task's initial position ({initial})"
        else:
            allowed, why = start == known, f"not after its committed checkpoint {known}"
        if not allowed or rng.start != StartPosition.after(start):
            found.append((f"shard {rng.shard_id}", f"shard {rng.shard_id}: the range starts at {rng.start}, {why}"))
    return found


def check_pending_against_stream(kinesis: KinesisClient, plan: BatchPlan, head: Head, store: DynamoDBCheckpointStore, settings: IncrementalSettings, now: datetime) -> None:
    """What a pending plan's check needs the stream for (after :func:`check_pending_plan`): every
    range's shard is a shard of the stream whose parents are at ``SHARD_END`` in the committed
    checkpoints (ORDER); a recorded trim gap is real (the shard's committed checkpoint is behind
    the trim horizon now); an enhanced fan-out consumer ARN is the one ``DescribeStreamConsumer``
    gives for this stream and consumer name. One ``ListShards`` (and the probes and the
    ``DescribeStreamConsumer`` call where the plan needs them); only for a re-used plan.

    :raises PendingPlanMismatchError: naming each difference (someone else wrote the table).
    """
    from airflow_kinesis_spark.core.consumers import stream_consumer_arn
    from airflow_kinesis_spark.core.shards import ShardLineage

    found: list[tuple[str, str]] = []
    committed = store.committed_checkpoints(head)
    lineage = ShardLineage(list_shards(kinesis, settings.stream_name))
    for rng in plan.ranges:
        shard = lineage.shards.get(rng.shard_id)
        if shard is None:
            found.append((f"shard {rng.shard_id}", f"shard {rng.shard_id}: not a shard of stream {stream_name_of(settings.stream_name)!r}"))
        elif not lineage.parents_finished(shard, committed):
            found.append((f"shard {rng.shard_id}", f"shard {rng.shard_id}: planned before its parents {', '.join(shard.parents)} "
                          "reached SHARD_END"))  # fmt: skip
    gapped = [replace(r, start_checkpoint=committed[r.shard_id], start=StartPosition.after(committed[r.shard_id]))
              for r in plan.ranges if r.shard_id in plan.trim_gaps and r.shard_id in committed]  # fmt: skip
    if gapped:
        real = find_trim_gaps(kinesis, plan.stream_name, gapped, now, min_call_interval=settings.min_call_interval,
                              budget=settings.summary_budget)  # fmt: skip
        found += [(f"shard {r.shard_id}", f"shard {r.shard_id}: the plan records a trim gap, but its committed checkpoint "
                   f"{r.start_checkpoint} is not behind the stream's trim horizon") for r in gapped if r.shard_id not in real]  # fmt: skip
    if plan.consumer_arn:
        arn = stream_consumer_arn(kinesis, settings.stream_name, settings.consumer_name, budget=settings.summary_budget)
        if plan.consumer_arn != arn:
            found.append(("consumer ARN", f"consumer ARN: the plan has {plan.consumer_arn!r}, stream consumer "
                          f"{settings.consumer_name!r} of this stream is {arn!r}"))  # fmt: skip
    if found:
        _raise_mismatch(found, head, store, settings)


def pending_plan_differences(plan: BatchPlan, head: Head, store: DynamoDBCheckpointStore, settings: IncrementalSettings) -> list[str]:
    """How a pending plan read from the checkpoint table differs from what this task would plan:
    one line per difference, ``"<item>: the plan has <a>, this task has <b> (set by <argument>)"``
    (``(set by ...)`` only where an argument of the task sets the item); ``[]`` when it is this
    task's plan. See :func:`check_pending_plan`."""
    return [line for _, line in _differences(plan, head, store, settings)]


def discard_pending_command(stream: str, consumer: str, table: str) -> str:
    """The ``kinesis-spark discard-pending`` command line (its dry run) for one consumer."""
    return f"kinesis-spark discard-pending {stream} -c {consumer} -t {table} --dry-run"


def check_pending_plan(plan: BatchPlan, head: Head, store: DynamoDBCheckpointStore, settings: IncrementalSettings) -> None:
    """Check a pending plan read from the checkpoint table against what this task would plan.

    The table is state anyone with write access to it can change, and a DAG's settings change, so
    a stored plan is re-used only when it is this task's (:func:`pending_plan_differences`): the
    pending batch id, mode ``incremental``, the stream, the consumer, the checkpoint table, the
    output location (derived from the task's output root and the batch id, never taken from the
    plan), the output spec (format, partitioning, file sizes), the consumer type, the transform,
    the caps per shard, a first batch's initial position, and start positions that follow from
    the committed checkpoints (each range starts after the shard's committed checkpoint, or, for
    a shard without one or with a recorded trim gap, at a sentinel).

    :param head: the store's head item the plan was read through.
    :raises PendingPlanMismatchError: naming each difference, the task's argument that sets it,
        and the fix: put the argument back (the pending batch then finishes as planned), or drop
        the pending batch (``kinesis-spark discard-pending`` with this consumer's stream, consumer
        and table, or ``KinesisDiscardPendingBatchOperator``; the committed checkpoints stay);
        nothing read or written. Fields: ``batch_id``, ``differences`` (the lines), ``arguments``
        (the task's arguments that set them), ``discard_command``.
    """
    found = _differences(plan, head, store, settings)
    if not found:
        return
    _raise_mismatch(found, head, store, settings)


def _raise_mismatch(found: list[tuple[str, str]], head: Head, store: DynamoDBCheckpointStore, settings: IncrementalSettings) -> None:
    """Raise :class:`PendingPlanMismatchError` for ``found`` (see :func:`check_pending_plan`)."""
    arguments = sorted({a.strip() for k, _ in found if k in _SET_BY for a in _SET_BY[k].split(",")})
    foreign = any(k not in _SET_BY for k, _ in found)
    stream = stream_name_of(settings.stream_name)
    command = discard_pending_command(settings.stream_name, settings.consumer_name, store.table_name)
    what = (
        f"The pending plan of batch {head.pending_batch_id} of stream {stream!r}, consumer {settings.consumer_name!r} in "
        f"checkpoint table {store.table_name!r} is not what this task would plan: {'; '.join(line for _, line in found)}. "
        "Nothing was read or written."
    )  # fmt: skip
    drop = (
        "drop the pending batch; the committed checkpoints stay and the next run plans the batch anew from them: run "
        f"`{command}` to see it, then again with --yes instead of --dry-run (add --output-path with the output root "
        "the plan was made with to delete what the batch wrote there), or run KinesisDiscardPendingBatchOperator"
    )
    if foreign:
        fix = (
            " No argument of this task sets some of these: someone else wrote the checkpoint table. Check who can write "
            f"it (docs/security.md), then {drop}."
        )
    else:
        named = ", ".join(arguments)
        fix = (
            f" To keep the new {named}, {drop}. To finish the pending batch as planned instead, put {named} back. If "
            f"nobody changed {named}, someone else wrote the checkpoint table: check who can write it (docs/security.md)."
        )
    raise PendingPlanMismatchError(
        what + fix, batch_id=head.pending_batch_id, differences=[line for _, line in found], arguments=arguments,
        discard_command=command,
    )  # fmt: skip
