"""Probes: which planned ranges have a record to read, at most one Kinesis record each.

Before a batch starts its job (and for a window or a lag measurement) every range is probed
(:func:`probe_ranges`) with a reader capped at one record
(:func:`probe_reader`, :func:`probe_range`): a probe that finds nothing is the full
report of an empty range, and a batch whose probes find nothing needs no Spark job. The probes run
in threads over one shared client, with no more of its calls in flight than it pools connections.
:func:`log_probes` sums them up in one log line.

No Airflow import.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.pool import CallGate, CallsStopped, gated, pool_threads
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport
from airflow_kinesis_spark.core.reader import ShardReader

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

# The reader's logger, as before the probes left core.reader: a logging configuration that
# selects the probes' line by its logger's name keeps working.
log = logging.getLogger(ShardReader.__module__)

__all__ = ["RESUME_ITERATOR_SECONDS", "probe_reader", "probe_range", "probe_ranges", "log_probes"]


def probe_reader(
    client: KinesisClient | None, stream_name: str, shard_range: ShardRange, *, resume_iterator: str | None = None,
    **reader_kwargs: Any,
) -> ShardReader:  # fmt: skip
    """A reader of the range's first user record (record cap 1; ``Limit`` 1, or 2 when the range
    starts by re-reading an aggregate whose first user records are committed: that aggregate
    usually holds none left, and the second Kinesis record then comes with the same call
    instead of one more call ``min_call_interval`` later).

    The stop rules are those of a full read, so a report with ``records == 0`` is the full
    report of an empty range (cutoff, caught up or shard end), and the batch needs no Spark job;
    otherwise the report's ``first`` and ``first_arrival`` tell the oldest unconsumed record.
    An aggregated first record is read whole. ``resume_iterator``, and a ``client`` of ``None``
    (the async probes, ``core.aio``, make the calls and hand the reader the responses): see
    :class:`ShardReader`.
    """
    # Every field of the range is kept (slice index, hash key range, ...): only the record cap changes.
    capped = replace(shard_range, max_records=1)
    limit = 2 if shard_range.start.skip_through_sub_sequence_number is not None else 1
    reader = ShardReader(client, stream_name, capped, limit=limit, resume_iterator=resume_iterator, **reader_kwargs)
    reader.probe = True
    return reader


def probe_range(client: KinesisClient, stream_name: str, shard_range: ShardRange, **reader_kwargs: Any) -> ShardReport:
    """Read at most one Kinesis record of a range (see :func:`probe_reader`) with a boto3 client, or
    one caller's view of a shared one (``core.pool.gated``), as :class:`ShardReader` takes."""
    return probe_reader(client, stream_name, shard_range, **reader_kwargs).read_all()[1]


#: Probe threads per connection the Kinesis client pools (:func:`probe_ranges`): a probe that
#: re-reads a KPL aggregate waits ``min_call_interval`` (0.2 s) between its two ``GetRecords``
#: calls on one shard, holding no connection meanwhile; other probes use the connections then.
PROBE_THREADS_PER_CONNECTION = 8



#: Seconds a checkpoint's ``resume_iterator`` is used for after its read got it: shard iterators
#: expire 5 minutes after they are returned (Kinesis API reference, GetShardIterator); the
#: minute's margin covers the time between the service issuing it and the read noting it.
RESUME_ITERATOR_SECONDS = 240.0


def probe_ranges(
    client: KinesisClient, stream_name: str, ranges: Sequence[ShardRange], *, until_record: bool = False,
    reuse_iterators: bool = False, **reader_kwargs: Any,
) -> list[ShardReport]:  # fmt: skip
    """Probe every range (see :func:`probe_reader`) in parallel
    threads; reports in ``ranges``' order.

    The threads share ``client``, and at most as many of its calls are in flight at once as it
    pools HTTP connections (botocore's ``max_pool_connections``, default 10), so no connection is
    opened and discarded ("Connection pool is full") however many shards the stream has. There
    are :data:`PROBE_THREADS_PER_CONNECTION` times as many threads (at most one per range): a
    probe paced between two calls on its shard (``min_call_interval``) leaves the connections to
    the others.

    :param until_record: stop at the first probe that finds a user record: a batch's job reads
        every planned range once any range has a record, so the other probes would tell nothing
        more (each costs ``GetShardIterator`` and ``GetRecords``). Ranges whose probe had not
        started by then are not probed and have no report: the list then holds fewer reports
        than ``ranges`` (still in their order). A probe that finds only quarantined records does
        not stop the others. Without a user record in any range every range is probed.
    :param reuse_iterators: a range whose starting checkpoint holds a ``resume_iterator`` got less
        than :data:`RESUME_ITERATOR_SECONDS` ago (the last batch read the shard to its tip) is
        probed with one ``GetRecords`` on it instead of ``GetShardIterator`` + ``GetRecords``;
        a refused iterator falls back to both. The checkpoint store holds these iterators, so a
        probe on one is a hint: the caller decides what may follow from it (``core.protocol``
        commits nothing on such probes alone).
    """
    if not ranges:
        return []
    now = time.time()
    found = threading.Event()

    connections = pool_threads(client, len(ranges))
    gate = CallGate(connections, found)

    def probe(rng: ShardRange) -> ShardReport | None:
        try:
            # probe_range is looked up on this module at each call, so a wrapper set there takes
            # effect (a test counts the probes in flight that way).
            resume = rng.start_checkpoint.resume_iterator_for(now, RESUME_ITERATOR_SECONDS) if reuse_iterators else None
            report = probe_range(gated(client, gate), stream_name, rng, resume_iterator=resume, **reader_kwargs)
        except CallsStopped:
            return None
        if until_record and report.records:
            found.set()
        return report

    with ThreadPoolExecutor(max_workers=min(len(ranges), connections * PROBE_THREADS_PER_CONNECTION)) as pool:
        return [r for r in pool.map(probe, ranges) if r is not None]


#: Shard ids a log line lists before it says how many more there are.
LOGGED_SHARD_IDS = 5


def _shard_list(shard_ids: Sequence[str]) -> str:
    """``a, b, c`` (at most :data:`LOGGED_SHARD_IDS`, then ``and N more``), for log lines."""
    ids = list(dict.fromkeys(shard_ids))
    more = len(ids) - LOGGED_SHARD_IDS
    return ", ".join(ids[:LOGGED_SHARD_IDS]) + (f" and {more} more" if more > 0 else "")


def log_probes(reports: Sequence[ShardReport], planned: int | None = None) -> None:
    """One INFO line for a batch's or a window's probes (:func:`probe_ranges`; logged by
    ``core.protocol``): which ranges have a record to read and which have none, with the rule that
    ended each empty probe (``cutoff``, ``caught_up``, ``shard_end``). A probe reads at most one
    Kinesis record; it is not the batch's read.

    :param planned: the number of planned ranges, when the probes stopped at the first record
        (``probe_ranges(until_record=True)``): the line then says how many were not probed.
    """
    found = [r.shard_id for r in reports if r.records or r.quarantined]
    empty: dict[str, list[str]] = {}
    for r in reports:
        if not (r.records or r.quarantined):
            empty.setdefault(r.stop_reason, []).append(r.shard_id)
    nothing = "; ".join(f"{reason}: {_shard_list(ids)}" for reason, ids in sorted(empty.items()))
    skipped = (planned or 0) - len(reports)
    log.info(
        "Probed %d%s shard ranges (a first record each, GetRecords Limit 1): records to read in %d%s, nothing to read in %d%s%s",
        len(reports), f" of {planned}" if skipped > 0 else "", len(found), f" ({_shard_list(found)})" if found else "",
        len(reports) - len(found), f" ({nothing})" if nothing else "",
        f"; {skipped} not probed (a record was found: the job reads every range)" if skipped > 0 else "",
    )  # fmt: skip
