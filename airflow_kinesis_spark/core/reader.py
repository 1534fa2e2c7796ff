"""Read one planned shard range: shard iterators, paging, backoff, stop rules.

KPL aggregates are split into their user records by :mod:`airflow_kinesis_spark.core.kpl`; the
records read come in :class:`~airflow_kinesis_spark.core.pages.Page` objects; enhanced fan-out
subscriptions are driven by :mod:`airflow_kinesis_spark.core.fanout`; many ranges are read at once
by :mod:`airflow_kinesis_spark.core.concurrent_read` and probed by :mod:`airflow_kinesis_spark.core.probes`.

This module is the only place where the stop rules live (DESIGN.md, batch protocol step 2).
A range is read from its start position until the first of:

* ``cutoff`` — the first Kinesis record whose ``ApproximateArrivalTimestamp`` is at or after the
  range's cutoff (that record is not read);
* ``caught_up`` — a ``GetRecords`` response with ``MillisBehindLatest`` 0 and fewer records than
  its call's ``Limit`` (none, or the last ones the shard has: the service documents 0 as "no new
  records to process at this moment"; kinesalite, which always answers 0, fills ``Limit`` when it
  has more); an enhanced fan-out event with no records and ``MillisBehindLatest`` 0;
* ``shard_end`` — ``NextShardIterator`` is null, or the shard's ``EndingSequenceNumber`` was read;
* ``max_records`` / ``max_bytes`` — the next Kinesis record would pass a cap. An aggregated
  record is never cut: all of its user records are in the range or none are. The first record
  of a range is always taken, so a range always moves forward.

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.fanout import subscribed_pages
from airflow_kinesis_spark.core.kpl import _user_records
from airflow_kinesis_spark.core.names import stream_params
from airflow_kinesis_spark.core.pages import Page, UserRecord, _Progress
from airflow_kinesis_spark.core.positions import ExtendedSequenceNumber, to_utc
from airflow_kinesis_spark.core.read_options import (
    GET_RECORDS_MAX_BYTES,
    GET_RECORDS_MAX_LIMIT,
    INITIAL_LIMIT,
    MIN_CALL_INTERVAL_S,
    PACING_MARGIN_S,
    READ_BYTES_PER_SECOND,
    TARGET_RESPONSE_BYTES,
    THROTTLING_ERRORS,
)
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport, StartPosition
from airflow_kinesis_spark.exceptions import CorruptAggregateError

if TYPE_CHECKING:  # the boto3 stubs (mypy-boto3-kinesis): annotations only
    from mypy_boto3_kinesis import KinesisClient

log = logging.getLogger(__name__)

__all__ = ["ShardReader"]

#: GetRecords' answer when the shard's read budget (2 MiB/s, 5 calls/s, shared by every polling
#: consumer of the shard) is spent (Kinesis API reference, GetRecords). Retried in step with the
#: budget, not with exponential backoff: see :meth:`ShardReader.throttle_delay`.
READ_BUDGET_ERROR = "ProvisionedThroughputExceededException"
#: The smallest share of a shard's read budget a reader paces itself to after throttling (1/8:
#: eight polling consumers of one shard), and what each GetRecords answered adds back to it.
MIN_READ_SHARE = 1 / 8
READ_SHARE_STEP = 0.1
#: Seconds between retries of a GetRecords call the read budget throttled, as a fraction of
#: ``min_call_interval`` (uniform in this range): short, so a throttled reader finds the budget
#: as soon as it is free again (a longer wait would leave it to whichever reader's pacing ends first).
BUDGET_RETRY_SPREAD = (0.5, 1.5)


class ShardReader:
    """Reads one :class:`ShardRange` with ``GetRecords``.

    Iterate :meth:`pages` for :class:`~airflow_kinesis_spark.core.pages.Page` objects (one per GetRecords response; iterating a page gives :class:`~airflow_kinesis_spark.core.pages.UserRecord` tuples);
    :attr:`report` is set when the iteration ends.

    :param client: a boto3 Kinesis client (or the probe pool's view of one,
        :func:`~airflow_kinesis_spark.core.pool.gated`); ``None``: a reader that only takes the
        responses it is given (:meth:`accept`; ``core.lag.count_reader``) and calls nothing.
    :param stream_name: the stream's name.
    :param shard_range: what to read.
    :param limit: ``Limit`` of each GetRecords call, 1..10,000.
    :param min_call_interval: seconds between two GetRecords calls on this shard (5 per second
        per shard is the service limit).
    :param read_bytes_per_second: the shard's read budget (2 MiB/s is the service limit): after
        a response of B bytes the next GetRecords waits until B / budget seconds after the call
        that returned it (plus ``PACING_MARGIN_S``), so a paced reader does not run into
        ``ProvisionedThroughputExceededException``. ``None``: no byte pacing (an emulator without limits).
    :param target_response_bytes: the adaptive ``Limit``: the first call asks for at most
        ``initial_limit`` records; later calls for about this many bytes per call,
        from the mean Kinesis record size seen so far (never more than ``limit`` records, and at
        most 10 MiB, the service's cap of one response).
    :param initial_limit: ``Limit`` of the first call, before any record size is known
        (default ``INITIAL_LIMIT``, 100).
    :param max_throttle_retries: retries of one call on a throttling error before giving up
        (but see ``max_budget_wait``).
    :param backoff_base: seconds; the n-th retry sleeps uniform(0, min(backoff_cap, base * 2**n)).
    :param backoff_cap: seconds.
    :param max_budget_wait: seconds one GetRecords call may keep being answered
        ``ProvisionedThroughputExceededException`` (the shard's read budget, shared by every
        polling consumer of the shard, is spent) before the read fails. Such a call is retried
        every ``min_call_interval`` or so (:data:`BUDGET_RETRY_SPREAD`), and the reader then paces
        itself to a share of the budget (:attr:`read_share`).
    :param sleep: injectable ``time.sleep``.
    :param consumer_arn: read with enhanced fan-out (``SubscribeToShard``) as this registered
        stream consumer instead of ``GetRecords``: events are pushed (2 MiB/s per shard for each
        consumer), the same stop rules hold, and a subscription that ends (after 5 minutes) or
        fails (an exception event: ``InternalFailureException``, or ``ResourceInUseException``
        when another subscription took the shard over) is renewed from just after the last
        Kinesis record read. ``ResourceInUseException`` (another subscription of this consumer to
        the shard is still open) and ``LimitExceededException`` on the call are retried with
        backoff; both count in the report's ``throttled_calls``.
    :param resume_iterator: a shard iterator pointing at the range's start (the
        ``Checkpoint.resume_iterator`` a previous read left, valid 5 minutes: Kinesis API
        reference, GetShardIterator), used by the first ``GetRecords`` call instead of one from
        ``GetShardIterator``. Polling only.

    A corrupt KPL aggregate does not stop the read: it is yielded as one record with
    ``quarantine_reason`` set and counted in the report's ``quarantined``.

    :raises botocore.exceptions.ClientError: when a throttling error persists or another error occurs.
    """

    #: Set by :func:`~airflow_kinesis_spark.core.probes.probe_reader`: the read only looks for a first record (logged as such).
    probe: bool = False

    def __init__(
        self,
        client: KinesisClient | None,
        stream_name: str,
        shard_range: ShardRange,
        *,
        limit: int = GET_RECORDS_MAX_LIMIT,
        min_call_interval: float = MIN_CALL_INTERVAL_S,
        read_bytes_per_second: float | None = READ_BYTES_PER_SECOND,
        target_response_bytes: int = TARGET_RESPONSE_BYTES,
        initial_limit: int = INITIAL_LIMIT,
        max_throttle_retries: int = 12,
        backoff_base: float = 0.25,
        backoff_cap: float = 10.0,
        max_budget_wait: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        consumer_arn: str | None = None,
        resume_iterator: str | None = None,
    ) -> None:
        if not 1 <= limit <= GET_RECORDS_MAX_LIMIT:
            raise ValueError(f"limit must be 1..{GET_RECORDS_MAX_LIMIT} (GetRecords Limit), got {limit}")
        self._client = client
        self.stream_name = stream_name
        self.range = shard_range
        self.consumer_arn = consumer_arn
        self.resume_iterator = resume_iterator
        #: When :attr:`next_iterator` was got (seconds since the epoch).
        self.next_iterator_at: float | None = None
        self.limit = limit
        self.min_call_interval = min_call_interval
        if read_bytes_per_second is not None and read_bytes_per_second <= 0:
            raise ValueError(f"read_bytes_per_second must be > 0 or None, got {read_bytes_per_second}")
        self.read_bytes_per_second = read_bytes_per_second
        self.target_response_bytes = max(1, min(int(target_response_bytes), GET_RECORDS_MAX_BYTES))
        self.initial_limit = max(1, int(initial_limit))
        self.last_response_bytes = 0
        self.max_throttle_retries = max_throttle_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_budget_wait = max_budget_wait
        #: The share of the shard's read budget the pacing aims at (:meth:`pause_after_response`):
        #: 1 until GetRecords is throttled (another consumer reads the shard too), then halved on
        #: each throttled call (to at least :data:`MIN_READ_SHARE`) and raised by
        #: :data:`READ_SHARE_STEP` on each answered one: additive increase, multiplicative
        #: decrease, as TCP shares a link, so polling consumers of one shard converge on equal shares.
        #: The response size the ``Limit`` aims at shrinks with it (:meth:`records_request`).
        self.read_share = 1.0
        self._sleep = sleep
        self._clock = clock
        self._ready_at: float | None = None
        self._sent_at = 0.0
        self.report: ShardReport | None = None
        self.next_iterator: str | None = None
        #: ``Limit`` of the GetRecords call whose response :meth:`accept` takes next (None: an event).
        self.asked_limit: int | None = None
        self._p = _Progress()
        self._cutoff = to_utc(shard_range.cutoff)
        self._ending = int(shard_range.ending_sequence_number) if shard_range.ending_sequence_number else None

    # -- the protocol, free of I/O: drivers (sync here, async in the triggers) call these ------

    @property
    def done(self) -> bool:
        """Whether a stop rule has held."""
        return self._p.stop_reason is not None

    def iterator_request(self) -> dict[str, Any]:
        """``GetShardIterator`` arguments: the range's start, or just after the last record read."""
        if self._p.last_kinesis_sequence is not None:
            start = StartPosition("AFTER_SEQUENCE_NUMBER", sequence_number=self._p.last_kinesis_sequence)
        else:
            start = self.range.start
        return {**stream_params(self.stream_name), "ShardId": self.range.shard_id, **start.iterator_kwargs()}

    def subscription_request(self) -> dict[str, Any]:
        """``SubscribeToShard`` arguments: the range's start, or just after the last record read
        (a renewed subscription)."""
        kwargs = self.iterator_request()
        position: dict[str, Any] = {"Type": kwargs["ShardIteratorType"]}
        if "StartingSequenceNumber" in kwargs:
            position["SequenceNumber"] = kwargs["StartingSequenceNumber"]
        if "Timestamp" in kwargs:
            position["Timestamp"] = kwargs["Timestamp"]
        return {"ConsumerARN": self.consumer_arn, "ShardId": self.range.shard_id, "StartingPosition": position}

    @staticmethod
    def event_response(event: Mapping[str, Any]) -> dict[str, Any]:
        """A ``SubscribeToShardEvent`` as the GetRecords response :meth:`accept` takes: its
        records, ``MillisBehindLatest``, and its continuation for ``NextShardIterator`` (none at
        the shard's end, where the event lists the child shards)."""
        return {"Records": event.get("Records", []), "MillisBehindLatest": event.get("MillisBehindLatest"),
                "NextShardIterator": event.get("ContinuationSequenceNumber")}  # fmt: skip

    def records_request(self, iterator: str) -> dict[str, Any]:
        """``GetRecords`` arguments.

        ``Limit`` adapts: once records were seen, it asks for about ``target_response_bytes``
        times :attr:`read_share` at their mean size; it never asks for more than the record cap
        leaves, nor more than ``limit``.
        """
        p = self._p
        limit = self.limit
        if p.kinesis_records:
            mean = max(1.0, p.kinesis_bytes / p.kinesis_records)
            # A reader that shares the shard asks for its share of the target: more, smaller
            # responses, over which the consumers' shares even out sooner.
            limit = max(1, min(limit, int(self.target_response_bytes * self.read_share / mean)))
        else:  # record size unknown yet: a first response of at most initial_limit records
            limit = min(limit, self.initial_limit)
        if self.range.max_records is not None:
            remaining = self.range.max_records - p.records
            if p.kinesis_records == 0 and self.range.start.skip_through_sub_sequence_number is not None:
                remaining += 1  # the first Kinesis record re-reads an aggregate that is partly committed
            limit = max(1, min(limit, remaining))
        p.calls += 1
        self.asked_limit = limit
        return {"ShardIterator": iterator, "Limit": limit}

    def pause_after_response(self) -> float:
        """Seconds between a GetRecords call and the next one: at least ``min_call_interval``,
        and the time the shard's read budget needs to pay for the response's bytes; both
        divided by :attr:`read_share`."""
        pause = self.min_call_interval
        if self.read_bytes_per_second:
            pause = max(pause, self.last_response_bytes / self.read_bytes_per_second)
        return pause / self.read_share

    def throttle_delay(self, error_code: str, attempt: int, operation: str = "", waited: float = 0.0) -> float | None:
        """Seconds to wait before retry ``attempt`` (0-based) of call ``operation`` (boto3's
        name, ``get_records``) that failed with ``error_code``, ``waited`` seconds after its first
        throttled attempt; ``None`` when the error is not a throttling error or retries are spent.

        GetRecords answered :data:`READ_BUDGET_ERROR`: the shard's read budget is spent, by this
        reader's last response or by other consumers of the shard. The retry comes about
        ``min_call_interval`` later (:data:`BUDGET_RETRY_SPREAD`), until ``max_budget_wait``
        seconds passed, and :attr:`read_share` is halved. Exponential backoff, growing to seconds,
        would leave the budget to whichever reader's pacing ends first: on a shared stream one
        consumer would read while the others wait. Every other throttling error: exponential
        backoff with full jitter, at most ``max_throttle_retries`` retries.
        """
        if error_code not in THROTTLING_ERRORS:
            return None
        if operation == "get_records" and error_code == READ_BUDGET_ERROR:
            if waited >= self.max_budget_wait:
                return None
            self._p.throttled += 1
            self.read_share = max(MIN_READ_SHARE, self.read_share / 2)
            return random.uniform(*BUDGET_RETRY_SPREAD) * max(self.min_call_interval, 0.01)
        if attempt >= self.max_throttle_retries:
            return None
        self._p.throttled += 1
        return random.uniform(0, min(self.backoff_cap, self.backoff_base * 2**attempt))

    def iterator_expired(self) -> None:
        """Count an ``ExpiredIteratorException``; the next :meth:`iterator_request` resumes
        after the last Kinesis record read."""
        self._p.expired += 1
        log.info("shard %s: shard iterator expired; renewing after %s", self.range.shard_id, self._p.last_kinesis_sequence)

    def start(self, iterator: str | None) -> None:
        """Take the iterator GetShardIterator returned (``None``: the shard has ended)."""
        self.next_iterator = iterator
        if iterator is None:
            self._p.stop_reason = "shard_end"

    def accept(self, response: Mapping[str, Any]) -> Page:
        """Apply the stop rules to one GetRecords response; return the user records it adds.

        Afterwards :attr:`done` tells whether to stop, else :attr:`next_iterator` is the next
        call's iterator.
        """
        rng = self.range
        if self.asked_limit is not None:  # a GetRecords call was answered
            self.read_share = min(1.0, self.read_share + READ_SHARE_STEP)
        self._p.millis_behind_latest = response.get("MillisBehindLatest")
        page = Page(rng.shard_id)
        records = response.get("Records", [])
        self.last_response_bytes = sum(len(r["Data"]) for r in records)
        self._p.response_bytes += self.last_response_bytes
        for record in records:
            if self._take(record, self._cutoff, self._ending, page):
                return page
        self.next_iterator = response.get("NextShardIterator")
        self.next_iterator_at = time.time()
        if self.next_iterator is None:
            self._p.stop_reason = "shard_end"
        elif response.get("MillisBehindLatest") == 0 and (
            not records or (self.asked_limit is not None and len(records) < self.asked_limit)
        ):
            # At the tip: a response short of its Limit at MillisBehindLatest 0 saves the call
            # that would come back empty (at 256 shards, a third of a no-data run's calls).
            # A closed shard gets no new records: its tip is its end (moto never ends a closed
            # shard's iterator chain; DESIGN.md, emulator quirks).
            self._p.stop_reason = "shard_end" if rng.ending_sequence_number else "caught_up"
        return page

    def finish(self) -> ShardReport:
        """The report of the range; call once the reading stopped."""
        p, rng = self._p, self.range
        self.report = ShardReport(
            shard_id=rng.shard_id,
            first=p.first,
            last=p.last,
            records=p.records,
            bytes=p.bytes,
            kinesis_records=p.kinesis_records,
            kinesis_bytes=p.kinesis_bytes,
            shard_end=p.stop_reason == "shard_end",
            stop_reason=p.stop_reason or "caught_up",
            millis_behind_latest=p.millis_behind_latest,
            get_records_calls=p.calls,
            throttled_calls=p.throttled,
            expired_iterators=p.expired,
            first_arrival=p.first_arrival,
            last_arrival=p.last_arrival,
            slice_index=rng.slice_index,
            quarantined=p.quarantined,
            out_of_range=p.out_of_range,
            read_started=p.read_started,
            read_ended=p.read_ended,
            response_bytes=p.response_bytes,
            **self._resume_fields(),
        )
        return self.report

    def _resume_fields(self) -> dict[str, Any]:
        """``next_iterator`` / ``next_iterator_at`` of the report: only for a polled read that
        stopped at the tip (``caught_up``), whose last iterator points just after what it read."""
        if self.consumer_arn or self._p.stop_reason != "caught_up" or not self.next_iterator:
            return {}
        return {"next_iterator": self.next_iterator, "next_iterator_at": self.next_iterator_at}

    # -- the synchronous driver ----------------------------------------------------------------

    @property
    def client(self) -> KinesisClient:
        """The Kinesis client the reader calls.

        :raises RuntimeError: the reader was made without one (it only takes the responses it is given).
        """
        if self._client is None:
            raise RuntimeError(f"the reader of shard {self.range.shard_id} was made without a Kinesis client: it only "
                               "takes the responses it is given (accept)")  # fmt: skip
        return self._client

    def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """Call Kinesis, retrying throttling errors (:meth:`throttle_delay`); :attr:`_sent_at`
        is the clock when the attempt that was answered was sent."""
        attempt, waited = 0, 0.0
        while True:
            try:
                self._sent_at = self._clock()
                return getattr(self.client, operation)(**kwargs)
            except self.client.exceptions.ClientError as err:
                code = err.response.get("Error", {}).get("Code", "")
                delay = self.throttle_delay(code, attempt, operation, waited)
                if delay is None:
                    raise
                log.info("shard %s: %s on %s, retry %d in %.2fs", self.range.shard_id, code, operation, attempt + 1, delay)
                self._sleep(delay)
                attempt, waited = attempt + 1, waited + delay

    def pages(self) -> Iterator[Page]:
        """Yield the user records of the range, one :class:`~airflow_kinesis_spark.core.pages.Page` per GetRecords response (or,
        with ``consumer_arn``, per SubscribeToShard event) that added any."""
        started = time.monotonic()
        self._p.read_started = time.time()
        if self.consumer_arn:
            yield from subscribed_pages(self)
        else:
            yield from self._polled_pages()
        self._p.read_ended = time.time()
        report = self.finish()
        p = self._p
        # DEBUG: the task log's line per shard range is the protocol's, from the reports
        # (core.summaries.log_outcome); a batch's probes are summed up by core.probes.log_probes.
        if self.probe:
            log.debug("shard %s: probe from %s found %s", self.range.shard_id, self.range.start,
                      f"a record ({report.first})" if report.first else f"nothing to read ({report.stop_reason})")  # fmt: skip
            return
        log.debug(
            "shard %s: read %d records (%d Kinesis records, %d bytes) from %s, stop=%s, %s=%d, "
            "throttled=%d, expired=%d, %.2fs",
            self.range.shard_id, p.records, p.kinesis_records, p.kinesis_bytes, self.range.start, report.stop_reason,
            "events" if self.consumer_arn else "calls", p.calls, p.throttled, p.expired, time.monotonic() - started,
        )  # fmt: skip

    def _polled_pages(self) -> Iterator[Page]:
        """The GetRecords driver. With :attr:`resume_iterator` the first call is ``GetRecords``
        with it; when the service refuses it (expired, or not an iterator it issued:
        ``ExpiredIteratorException``, ``InvalidArgumentException``) the read starts over with
        ``GetShardIterator`` at the range's start."""
        resumed = self.resume_iterator
        if resumed:
            self.start(resumed)
        else:
            self.start(self._call("get_shard_iterator", **self.iterator_request()).get("ShardIterator"))
        while not self.done:
            if self._ready_at is not None:
                wait = self._ready_at - self._clock()
                if wait > 0:
                    self._sleep(wait)
            try:
                iterator = self.next_iterator
                assert iterator is not None, "a range that is not done has a next shard iterator (start, accept)"
                response = self._call("get_records", **self.records_request(iterator))
            except self.client.exceptions.ExpiredIteratorException as err:
                if resumed is not None:
                    resumed = None
                    self._resume_refused(err)
                else:
                    self.iterator_expired()
                    self._ready_at = self._clock() + self.min_call_interval
                self.start(self._call("get_shard_iterator", **self.iterator_request()).get("ShardIterator"))
                continue
            except self.client.exceptions.ClientError as err:
                if resumed is None or err.response.get("Error", {}).get("Code") != "InvalidArgumentException":
                    self._ready_at = self._clock() + self.min_call_interval
                    raise
                resumed = None
                self._resume_refused(err)
                self.start(self._call("get_shard_iterator", **self.iterator_request()).get("ShardIterator"))
                continue
            except BaseException:
                self._ready_at = self._clock() + self.min_call_interval
                raise
            resumed = None
            page = self.accept(response)
            # The service charges a response's bytes to the call that returned them ("after a
            # 10 MiB response, the next 5 seconds of calls are throttled"): the pause runs from
            # when the answered call was sent (plus a margin for the request's own travel), so the
            # time the response takes to come back and be processed overlaps it.
            pause = self.pause_after_response()
            self._ready_at = self._sent_at + pause + (PACING_MARGIN_S if pause > 0 else 0.0)
            if page:
                yield page

    def _resume_refused(self, err: Exception) -> None:
        """The first ``GetRecords`` on :attr:`resume_iterator` was refused: it read nothing (not
        counted as a response); the read starts over from ``GetShardIterator``."""
        self._p.calls -= 1
        log.info("shard %s: the stored shard iterator was refused (%s); starting from %s",
                 self.range.shard_id, type(err).__name__, self.range.start_checkpoint)  # fmt: skip

    def _take(self, record: Mapping[str, Any], cutoff: datetime, ending: int | None, page: Page) -> bool:
        """Apply the stop rules to one Kinesis record; add its user records to ``page``.

        :returns: whether reading stops (the record is then not taken unless it ends the shard).
        """
        p, rng = self._p, self.range
        sequence_number = record["SequenceNumber"]
        arrival = to_utc(record["ApproximateArrivalTimestamp"])
        if arrival >= cutoff:
            p.stop_reason = "cutoff"
            return True
        if ending is not None and int(sequence_number) > ending:
            # Past a closed shard's EndingSequenceNumber (only an emulator writes there).
            p.stop_reason = "shard_end"
            return True
        data: bytes = record["Data"]
        try:
            users = _user_records(data, record["PartitionKey"])
        except CorruptAggregateError as err:
            reason = err.fields.get("reason", "corrupt")
            # DEBUG: the task log's warning counts them per shard (core.summaries.log_outcome); the
            # quarantine output holds each one with its sequence number and reason.
            log.debug("shard %s, sequence number %s: %s; quarantined", rng.shard_id, sequence_number, err)
            page.add_quarantined(sequence_number, record["PartitionKey"], arrival, data, reason)
            p.quarantined += 1
            p.kinesis_records += 1
            p.kinesis_bytes += len(data)
            p.last_kinesis_sequence = sequence_number
            p.first = p.first or ExtendedSequenceNumber(sequence_number)
            p.last = ExtendedSequenceNumber(sequence_number)
            if ending is not None and int(sequence_number) == ending:
                p.stop_reason = "shard_end"
                return True
            return False
        subs = users.sub_sequence_numbers
        skip = rng.start.skip_through_sub_sequence_number
        start = 0
        if skip is not None and rng.start.sequence_number == sequence_number:
            # sub-sequence numbers are 0, 1, 2, ... (their list positions); a plain record has none
            start = len(subs) if subs[0] is None else min(len(subs), skip + 1)
        count = len(subs) - start
        size = sum(map(len, users.datas[start:] if start else users.datas))
        if p.records > 0:
            if rng.max_records is not None and p.records + count > rng.max_records:
                p.stop_reason = "max_records"
                return True
            if rng.max_bytes is not None and p.kinesis_bytes + len(data) > rng.max_bytes:
                p.stop_reason = "max_bytes"
                return True
        if rng.starting_hash_key is not None and count and subs[0] is not None:
            low, high = int(rng.starting_hash_key), int(rng.ending_hash_key or rng.starting_hash_key)
            kept = users if not start else users._replace(**{name: getattr(users, name)[start:] for name in users._fields[:6]})
            p.out_of_range += kept.out_of_range(low, high)
        page.add(sequence_number, arrival, users, start)
        if count:
            if p.first is None:
                p.first = ExtendedSequenceNumber(sequence_number, subs[start])
            p.last = ExtendedSequenceNumber(sequence_number, subs[-1])
            p.first_arrival = p.first_arrival or arrival
            p.last_arrival = arrival
        p.records += count
        p.bytes += size
        p.kinesis_records += 1
        p.kinesis_bytes += len(data)
        p.last_kinesis_sequence = sequence_number
        if ending is not None and int(sequence_number) == ending:
            p.stop_reason = "shard_end"
            return True
        if rng.max_records is not None and p.records >= rng.max_records:
            p.stop_reason = "max_records"
            return True
        if rng.max_bytes is not None and p.kinesis_bytes >= rng.max_bytes:
            p.stop_reason = "max_bytes"
            return True
        return False

    def read_all(self) -> tuple[list[UserRecord], ShardReport]:
        """Read the whole range into memory (tests and small ranges)."""
        out = [r for page in self.pages() for r in page]
        assert self.report is not None
        return out, self.report
