"""A proxy in front of a Kinesis emulator that enforces the service's per-shard read limits.

The emulators serve as fast as they can; Amazon Kinesis Data Streams does not. This proxy
answers like the service (Kinesis API reference, GetRecords and GetShardIterator):

* **5 GetRecords calls per second per shard**: a sixth call within one second is answered with
  ``ProvisionedThroughputExceededException`` (HTTP 400);
* **2 MiB per second per shard**: every GetRecords response adds its data bytes to the shard's
  debt, as of the call's arrival; the debt drains at 2 MiB/s and a call arriving while the shard
  is in debt is throttled. So after a call that returned 10 MiB the next 5 seconds of calls are
  throttled, as the API reference says;
* **at most 10 MiB and 10,000 records per response**: a larger ``Limit`` is an
  ``InvalidArgumentException``; a response over 10 MiB is cut after the last record that fits
  (at least one), with a ``NextShardIterator`` just after it. The emulator is asked for pieces
  of about 10 MiB (never the whole ``Limit`` at once), so it serializes about what the service
  would serve;
* **5 GetShardIterator calls per second per shard**;
* **shard iterators expire 5 minutes** after they were issued: ``ExpiredIteratorException``;
* **records up to the stream's MaxRecordSizeInKiB** (1,024 until ``UpdateMaxRecordSize`` sets
  1,024..10,240; Kinesis API reference, UpdateMaxRecordSize and PutRecords): the proxy answers
  ``UpdateMaxRecordSize`` itself, adds ``MaxRecordSizeInKiB`` to ``DescribeStreamSummary``, and
  refuses a ``PutRecord`` / ``PutRecords`` record over it (``ValidationException``) and a
  ``PutRecords`` request over 10 MiB (``InvalidArgumentException``). The emulator must store
  what the stream allows (``make kinesalite`` lets kinesalite take records up to 10 MiB; moto
  refuses records over 1 MiB whatever the setting);
* **20 DescribeStreamSummary calls per second per account** (the proxy serves one account):
  a call arriving when 20 were admitted within the last second is answered with
  ``LimitExceededException`` (HTTP 400), as the service answers it (Kinesis API reference,
  DescribeStreamSummary). Every arrival counts in :attr:`ThrottlingProxy.stats`
  (``DescribeStreamSummary``, ``.throttled``, ``.max_per_second``: the most calls, admitted or
  not, that arrived within any one second);
* **SubscribeToShard** (enhanced fan-out), which no emulator serves, is answered by the proxy from
  the emulator's records with the one local SubscribeToShard, :class:`demo.subscribe.ShardSubscriptions`:
  an event stream botocore reads, paced to 2 MiB/s per consumer and shard (a budget of its own,
  apart from the polling consumers' 2 MiB/s), subscriptions that end after 5 minutes,
  ``ChildShards`` at a closed shard's end, one subscription per consumer and shard
  (``ResourceInUseException``), one call per second (``LimitExceededException``). The consumers
  themselves (``RegisterStreamConsumer``, ``DescribeStreamConsumer``, ...) are the emulator's.

Everything else passes through. Throttled calls are never forwarded (they cost nothing
upstream). Counts per operation and outcome are kept in :attr:`ThrottlingProxy.stats`.

:class:`ThrottlingProxy` serves from threads of the process that starts it (tests);
:class:`LimitsProxyProcess` runs it in a process of its own (``python -m
benchmarks.kinesis_limits``), as the service is elsewhere than its callers: ``make bench``
measures the operator in its own process, and a proxy there would take its CPU time under the
same interpreter lock.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from demo.proxy import ForwardingProxy
from demo.subscribe import CONSUMER_OPERATIONS, ShardSubscriptions, StreamConsumers, SubscribeLimits

__all__ = ["KinesisLimits", "LimitsProxyProcess", "ThrottlingProxy"]

MIB = 1024 * 1024

#: The path (GET) on which the proxy answers its own counts, for :class:`LimitsProxyProcess`.
STATE_PATH = "/_limits_proxy/state"

#: A stream's largest record, in KiB, until ``UpdateMaxRecordSize`` changes it, and the range that
#: call takes (Kinesis API reference, UpdateMaxRecordSize; DescribeStreamSummary reports it).
DEFAULT_MAX_RECORD_KIB = 1024
MAX_RECORD_KIB_RANGE = (1024, 10240)
#: A PutRecords request's data and partition keys at most (Kinesis API reference, PutRecords).
PUT_RECORDS_MAX_BYTES = 10 * MIB


def _behind(response: dict) -> None:
    """Mark an answer cut short of the emulator's tip as behind it (``MillisBehindLatest`` at
    least 1), as the service would: moto counts whole milliseconds between the last record
    returned and the shard's last, so records put within a millisecond of the tip read as 0."""
    response["MillisBehindLatest"] = max(1, int(response.get("MillisBehindLatest") or 0))


@dataclass(frozen=True)
class KinesisLimits:
    """The per-shard limits enforced (defaults: the service's, Kinesis API reference)."""

    get_records_per_second: int = 5
    read_bytes_per_second: float = 2 * MIB
    max_response_bytes: int = 10 * MIB
    max_limit: int = 10_000
    get_shard_iterator_per_second: int = 5
    iterator_ttl_seconds: float = 300.0
    #: ``False``: only the response caps (10 MiB, 10,000 records) and iterator expiry apply (and,
    #: for SubscribeToShard, subscription expiry and one subscription per consumer and shard:
    #: events are not paced, calls not limited to one a second).
    throttle: bool = True
    #: SubscribeToShard: pushed data bytes per second per (consumer, shard)
    subscribe_bytes_per_second: float = 2 * MIB
    #: SubscribeToShard: a subscription's event stream ends this long after it was accepted
    subscription_seconds: float = 300.0
    #: SubscribeToShard: a call while the consumer's subscription to the shard is open and younger
    #: than this is refused (``ResourceInUseException``); an older one is taken over. ``None``:
    #: an open subscription is never taken over.
    subscription_takeover_seconds: float | None = 5.0
    #: SubscribeToShard: one accepted call per this many seconds per (consumer, shard)
    subscribe_call_interval_seconds: float = 1.0
    #: SubscribeToShard: how often the emulator is polled while the subscriber is caught up
    subscribe_poll_seconds: float = 1.0
    #: SubscribeToShard: data bytes per event at most (an event holds at least one record)
    subscribe_event_bytes: int = 1 * MIB
    #: DescribeStreamSummary: admitted calls per second per account (the proxy's one account)
    describe_stream_summary_per_second: int = 20

    def subscribe_limits(self) -> SubscribeLimits:
        """The SubscribeToShard settings, for :class:`demo.subscribe.ShardSubscriptions`."""
        return SubscribeLimits(
            bytes_per_second=self.subscribe_bytes_per_second if self.throttle else None,
            subscription_seconds=self.subscription_seconds,
            takeover_seconds=self.subscription_takeover_seconds,
            call_interval_seconds=self.subscribe_call_interval_seconds if self.throttle else None,
            poll_seconds=self.subscribe_poll_seconds,
            event_bytes=self.subscribe_event_bytes,
        )


def _decoded_size(b64: str) -> int:
    """Bytes of base64 text once decoded, without decoding it."""
    return len(b64) * 3 // 4 - (2 if b64.endswith("==") else 1 if b64.endswith("=") else 0)


@dataclass
class _Shard:
    get_records: deque = field(default_factory=deque)
    get_shard_iterator: deque = field(default_factory=deque)
    debt: float = 0.0
    debt_at: float = 0.0


class ThrottlingProxy(ForwardingProxy):
    """Start with :meth:`start` (or ``with``); ``endpoint`` is its URL.

    :param upstream: the emulator's URL.
    :param limits: what to enforce.
    :param own_consumers: answer the stream-consumer calls itself (:class:`demo.subscribe.StreamConsumers`),
        for an emulator that has none (kinesalite); by default they pass through.
    """

    def __init__(self, upstream: str, limits: KinesisLimits | None = None, *, own_consumers: bool = False) -> None:
        super().__init__(upstream, keep_alive=True)
        self.limits = limits or KinesisLimits()
        self.shards: dict[tuple[str, str], _Shard] = {}
        #: shard iterator -> (stream, shard, monotonic time it was issued)
        self.iterators: dict[str, tuple[str, str, float]] = {}
        self.stats: Counter[str] = Counter()
        #: stream name -> MaxRecordSizeInKiB set by UpdateMaxRecordSize (else DEFAULT_MAX_RECORD_KIB)
        self.max_record_kib: dict[str, int] = {}
        #: DescribeStreamSummary: arrivals (admitted or not) and admitted calls of the last second
        #: (monotonic seconds), for the account's limit and ``DescribeStreamSummary.max_per_second``
        self._describe_arrivals: deque = deque()
        self._describe_admitted: deque = deque()
        #: stream -> [first GetRecords arrival, last GetRecords response] (monotonic seconds), of
        #: calls with ``Limit`` > 1: the operator's probes (``Limit`` 1, before Spark starts) are
        #: not part of the read.
        self.read_window: dict[str, list[float]] = {}
        #: (stream, shard) -> the largest record's data bytes seen in a GetRecords answer
        self._largest: dict[tuple[str, str], int] = {}
        #: SubscribeToShard; counts in :attr:`stats` as ``SubscribeToShard.<what>`` and
        #: ``SubscribeToShard.<what>:<stream>`` (subscriptions, events, records, bytes, and how
        #: calls and subscriptions ended: in_use, limit_exceeded, not_found, invalid, expired,
        #: shard_end, taken_over, closed_by_subscriber, ...; :mod:`demo.subscribe`)
        self.subscriptions = ShardSubscriptions(self, self.limits.subscribe_limits(), prefix="SubscribeToShard.",
                                                consumers=StreamConsumers(self) if own_consumers else None)  # fmt: skip

    def stop(self) -> None:
        self.subscriptions.close()
        super().stop()

    def reset_stats(self) -> None:
        with self.lock:
            self.stats.clear()
            self.read_window.clear()
            self._describe_arrivals.clear()

    def read_rate(self, stream: str) -> float:
        """Bytes per second served to ``stream``'s GetRecords with ``Limit`` > 1, from the first
        such call to the last response or, if later, to when the bytes served were paid for at
        the shard's ``read_bytes_per_second`` (the service's debt rule lets one response run
        ahead of the rate; the next call waits for it): at most the limit for a paced reader."""
        return _read_rate(self.stats, self.read_window, stream)

    def state(self) -> dict:
        """:attr:`stats` and :attr:`read_window` as JSON-able values (:data:`STATE_PATH`)."""
        with self.lock:
            return {"stats": dict(self.stats), "read_window": {k: list(v) for k, v in self.read_window.items()}}

    # -- accounting ------------------------------------------------------------------------------

    def _shard(self, stream: str, shard: str) -> _Shard:
        return self.shards.setdefault((stream, shard), _Shard())

    def _admit(self, state: _Shard, calls: deque, per_second: int, now: float, with_debt: bool) -> bool:
        """Whether a call arriving ``now`` is within the limits; records it if so."""
        if not self.limits.throttle:
            return True
        while calls and now - calls[0] >= 1.0:
            calls.popleft()
        if with_debt:
            state.debt = max(0.0, state.debt - (now - state.debt_at) * self.limits.read_bytes_per_second)
            state.debt_at = now
            if state.debt > 0:
                return False
        if len(calls) >= per_second:
            return False
        calls.append(now)
        return True

    def _remember(self, iterator: str | None, stream: str, shard: str) -> None:
        if iterator:
            with self.lock:
                self.iterators[iterator] = (stream, shard, time.monotonic())
                if len(self.iterators) > 100_000:  # forget the oldest (long expired) ones
                    for key in list(self.iterators)[:50_000]:
                        del self.iterators[key]

    # -- the proxy ---------------------------------------------------------------------------------

    def handle(self, request: BaseHTTPRequestHandler, body: bytes, target: str) -> None:
        operation = target.partition(".")[2]
        if not target and request.path == STATE_PATH:
            self.answer(request, 200, [("Content-Type", "application/json")], json.dumps(self.state()).encode())
        elif operation in ("UpdateMaxRecordSize", "PutRecord", "PutRecords"):
            self._record_size(request, body, operation)
        elif operation == "GetShardIterator":
            self._get_shard_iterator(request, body)
        elif operation == "GetRecords":
            self._get_records(request, body)
        elif operation == "SubscribeToShard":
            self.subscriptions.subscribe(request, body)
        elif operation in CONSUMER_OPERATIONS and self.subscriptions.consumers is not None:
            self.subscriptions.consumers.call(request, body, operation)
        elif operation == "DescribeStreamSummary":
            self._describe_stream_summary(request, body)
        else:
            self.answer(request, *self.forward(request, body))

    # -- record sizes (MaxRecordSizeInKiB) --------------------------------------------------------

    def forward(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """:meth:`ForwardingProxy.forward`; a DescribeStreamSummary answer gets the stream's
        ``MaxRecordSizeInKiB``, which the emulators do not report."""
        status, headers, payload = super().forward(request, body)
        if status == 200 and request.headers.get("X-Amz-Target", "").endswith(".DescribeStreamSummary"):
            answer = json.loads(payload)
            summary = answer.get("StreamDescriptionSummary", {})
            with self.lock:
                summary["MaxRecordSizeInKiB"] = self.max_record_kib.get(summary.get("StreamName", ""), DEFAULT_MAX_RECORD_KIB)
            payload = json.dumps(answer).encode()
        return status, headers, payload

    def max_record_bytes(self, stream: str) -> int:
        """The largest record ``stream`` takes (bytes of data)."""
        with self.lock:
            return self.max_record_kib.get(stream, DEFAULT_MAX_RECORD_KIB) * 1024

    def _record_size(self, request: BaseHTTPRequestHandler, body: bytes, operation: str) -> None:
        """``UpdateMaxRecordSize`` answered here (the stream must exist upstream); ``PutRecord`` and
        ``PutRecords`` checked against the stream's MaxRecordSizeInKiB, then forwarded."""
        args = json.loads(body or b"{}")
        stream = str(args.get("StreamName") or str(args.get("StreamARN") or "").rpartition("/")[2])
        if operation == "UpdateMaxRecordSize":
            kib = args.get("MaxRecordSizeInKiB")
            low, high = MAX_RECORD_KIB_RANGE
            if not isinstance(kib, int) or not low <= kib <= high:
                self.answer_error(request, 400, "ValidationException", f"1 validation error detected: Value '{kib}' at "
                                  f"'maxRecordSizeInKiB' failed to satisfy constraint: Member must have value between {low} and {high}")  # fmt: skip
                return
            status, headers, payload = self.call_upstream(
                "POST", "/", json.dumps({"StreamName": stream}).encode(),
                {**dict(request.headers.items()), "X-Amz-Target": "Kinesis_20131202.DescribeStreamSummary"},
            )  # fmt: skip
            if status != 200:
                self.answer(request, status, headers, payload)
                return
            with self.lock:
                self.max_record_kib[stream] = kib
                self.stats["UpdateMaxRecordSize"] += 1
            self.answer(request, 200, [("Content-Type", "application/x-amz-json-1.1")], b"{}")
            return
        entries = args.get("Records", []) if operation == "PutRecords" else [args]
        limit = self.max_record_bytes(stream)
        sizes = [_decoded_size(str(e.get("Data") or "")) for e in entries]
        for i, size in enumerate(sizes):
            if size > limit:
                where = f"records.{i + 1}.member.data" if operation == "PutRecords" else "data"
                self.answer_error(request, 400, "ValidationException", f"1 validation error detected: Value at '{where}' "
                                  f"failed to satisfy constraint: Member must have length less than or equal to {limit}")  # fmt: skip
                return
        total = sum(sizes) + sum(len(str(e.get("PartitionKey") or "").encode()) for e in entries)
        if operation == "PutRecords" and total > PUT_RECORDS_MAX_BYTES:
            self.answer_error(request, 400, "InvalidArgumentException",
                              f"Records size exceeds {PUT_RECORDS_MAX_BYTES // MIB} MiB limit: {total} bytes")  # fmt: skip
            return
        self.answer(request, *self.forward(request, body))

    def _throttled(self, request: BaseHTTPRequestHandler, operation: str, stream: str, shard: str) -> None:
        with self.lock:
            self.stats[f"{operation}.throttled"] += 1
            self.stats[f"{operation}.throttled:{stream}"] += 1
        self.answer_error(
            request, 400, "ProvisionedThroughputExceededException",
            f"Rate exceeded for shard {shard} in stream {stream} under account 000000000000.",
        )  # fmt: skip

    def _describe_stream_summary(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        """DescribeStreamSummary under the account's limit of 20 calls per second (Kinesis API
        reference): a call arriving when as many were admitted within the last second is refused
        with ``LimitExceededException``, as the service refuses it, and not forwarded."""
        now = time.monotonic()
        with self.lock:
            self.stats["DescribeStreamSummary"] += 1
            arrivals = self._describe_arrivals
            arrivals.append(now)
            while now - arrivals[0] >= 1.0:
                arrivals.popleft()
            self.stats["DescribeStreamSummary.max_per_second"] = max(self.stats["DescribeStreamSummary.max_per_second"],
                                                                      len(arrivals))  # fmt: skip
            admitted = self._admit(_Shard(), self._describe_admitted, self.limits.describe_stream_summary_per_second,
                                   now, with_debt=False)  # fmt: skip
            if not admitted:
                self.stats["DescribeStreamSummary.throttled"] += 1
        if not admitted:
            self.answer_error(request, 400, "LimitExceededException",
                              "Rate exceeded for DescribeStreamSummary under account 000000000000.")  # fmt: skip
            return
        self.answer(request, *self.forward(request, body))

    def _get_shard_iterator(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        args = json.loads(body or b"{}")
        stream, shard = args.get("StreamName", ""), args.get("ShardId", "")
        with self.lock:
            self.stats["GetShardIterator"] += 1
            state = self._shard(stream, shard)
            admitted = self._admit(state, state.get_shard_iterator, self.limits.get_shard_iterator_per_second,
                                   time.monotonic(), with_debt=False)  # fmt: skip
        if not admitted:
            self._throttled(request, "GetShardIterator", stream, shard)
            return
        status, headers, payload = self.forward(request, body)
        if status == 200:
            self._remember(json.loads(payload).get("ShardIterator"), stream, shard)
        self.answer(request, status, headers, payload)

    def _fetch(self, request: BaseHTTPRequestHandler, body: bytes, limit: int, stream: str, shard: str) -> tuple:
        """One GetRecords answer of at most ``limit`` records and 10 MiB, asked from the emulator in
        pieces of about 10 MiB, so the emulator serializes what the service would serve.

        Asked for ``Limit`` records, an emulator serializes them all (moto: the whole rest of the
        shard for ``Limit=10000``), which the service never does; left so, the cost of that work
        would fall on consumers asking for large ``Limit``. The size of a piece comes from the
        largest record seen on the shard (the first piece of a shard: 10 records, or one on a
        stream whose MaxRecordSizeInKiB is 10,240).

        :returns: ``(status, headers, payload, response, cut)``: ``payload`` is the emulator's
            own body when one piece answered the call uncut, else ``None`` (``response`` is then
            the assembled answer); ``cut`` tells whether records beyond the 10 MiB cap were dropped.
        """
        cap = self.limits.max_response_bytes
        iterator = json.loads(body or b"{}").get("ShardIterator", "")
        records: list[dict] = []
        total, pieces = 0, 0
        headers: list[tuple[str, str]] = []
        response: dict = {}
        while True:
            with self.lock:
                largest = self._largest.get((stream, shard))
            room = limit - len(records)
            # The first piece of a shard: 10 records, or as many of the stream's largest records as fit.
            first = max(1, min(10, cap // self.max_record_bytes(stream)))
            ask = min(room, first if largest is None else max(1, (cap - total) // largest))
            status, headers, payload = self.forward(
                request, json.dumps({"ShardIterator": iterator, "Limit": ask}).encode()
            )
            if status != 200:
                if pieces == 0:
                    return status, headers, payload, None, False
                raise RuntimeError(f"upstream GetRecords failed while assembling a response: {payload[:200]!r}")
            pieces += 1
            with self.lock:
                self.stats["GetRecords.upstream_pieces"] += 1
            response = json.loads(payload)
            got = response.get("Records", [])
            with self.lock:
                self.stats["GetRecords.upstream_records"] += len(got)
            sizes = [_decoded_size(r["Data"]) for r in got]
            if sizes:
                with self.lock:
                    self._largest[(stream, shard)] = max(largest or 0, *sizes)
            for record, size in zip(got, sizes, strict=True):
                if records and total + size > cap:
                    response["Records"] = records
                    _behind(response)
                    return status, headers, None, response, True
                records.append(record)
                total += size
            iterator = response.get("NextShardIterator")
            done = len(got) < ask or not iterator or len(records) >= limit or total >= cap
            if done or (self._largest[(stream, shard)] > cap - total):
                short = bool(iterator) and len(got) == ask and len(records) < limit  # stopped by size, not at the tip
                if pieces == 1 and not short:
                    return status, headers, payload, response, False
                if short:
                    _behind(response)
                response["Records"] = records
                return status, headers, None, response, False

    def _get_records(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        args = json.loads(body or b"{}")
        iterator = args.get("ShardIterator", "")
        limit = args.get("Limit", self.limits.max_limit)
        with self.lock:
            self.stats["GetRecords"] += 1
            known = self.iterators.get(iterator)
            if known is not None:
                self.stats[f"GetRecords:{known[0]}"] += 1
        if not 1 <= int(limit) <= self.limits.max_limit:
            with self.lock:
                self.stats["GetRecords.invalid_limit"] += 1
            self.answer_error(request, 400, "InvalidArgumentException",
                              f"Limit {limit} is not in 1..{self.limits.max_limit}")  # fmt: skip
            return
        if known is None:  # an iterator this proxy did not see issued: pass through
            with self.lock:
                self.stats["GetRecords.unknown_iterator"] += 1
            self.answer(request, *self.forward(request, body))
            return
        stream, shard, issued = known
        now = time.monotonic()
        if now - issued > self.limits.iterator_ttl_seconds:
            with self.lock:
                self.stats["GetRecords.expired"] += 1
                self.stats[f"GetRecords.expired:{stream}"] += 1
            self.answer_error(request, 400, "ExpiredIteratorException",
                              f"Iterator expired: issued {now - issued:.0f} s ago (shard iterators last 300 s)")  # fmt: skip
            return
        with self.lock:
            if int(limit) > 1:
                self.read_window.setdefault(stream, [now, now])
            state = self._shard(stream, shard)
            admitted = self._admit(state, state.get_records, self.limits.get_records_per_second, now, with_debt=True)
        if not admitted:
            self._throttled(request, "GetRecords", stream, shard)
            return
        status, headers, payload, response, cut = self._fetch(request, body, int(limit), stream, shard)
        if status != 200:
            self.answer(request, status, headers, payload)
            return
        records = response.get("Records", [])
        total = sum(_decoded_size(r["Data"]) for r in records)
        if cut:
            status2, _, more = self.call_upstream(
                "POST", "/", json.dumps({"StreamName": stream, "ShardId": shard, "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                                         "StartingSequenceNumber": records[-1]["SequenceNumber"]}).encode(),
                {"X-Amz-Target": "Kinesis_20131202.GetShardIterator", "Content-Type": "application/x-amz-json-1.1",
                 "Authorization": request.headers.get("Authorization", "")},
            )  # fmt: skip
            if status2 != 200:
                raise RuntimeError(f"upstream GetShardIterator failed while cutting a response: {more[:200]!r}")
            response["NextShardIterator"] = json.loads(more)["ShardIterator"]
            with self.lock:
                self.stats["GetRecords.cut_at_10MiB"] += 1
        if payload is None:
            payload = json.dumps(response).encode()
        with self.lock:
            self.stats["GetRecords.ok"] += 1
            self.stats["GetRecords.bytes"] += total
            self.stats["GetRecords.records"] += len(records)
            self.stats["GetRecords.largest_response_bytes"] = max(self.stats["GetRecords.largest_response_bytes"], total)
            # Charged to the call, from its arrival (the shard was out of debt then).
            state = self._shard(stream, shard)
            state.debt = max(0.0, state.debt - (now - state.debt_at) * self.limits.read_bytes_per_second) + total
            state.debt_at = now
            if int(limit) > 1:
                self.stats[f"bytes:{stream}"] += total
                # The read lasts until its bytes are paid for at the shard's rate: a reader that
                # stops at the response reaching the tip owes the pause after it all the same.
                repaid = now + state.debt / self.limits.read_bytes_per_second
                self.read_window[stream][1] = max(self.read_window[stream][1], time.monotonic(), repaid)
        self._remember(response.get("NextShardIterator"), stream, shard)
        self.answer(request, status, headers, payload)


def _read_rate(stats: Mapping[str, int], read_window: Mapping[str, list[float]], stream: str) -> float:
    """Bytes per second served to ``stream``'s GetRecords with ``Limit`` > 1 (see
    :meth:`ThrottlingProxy.read_rate`)."""
    first, last = read_window[stream]
    return stats.get(f"bytes:{stream}", 0) / max(1e-9, last - first)


class LimitsProxyProcess:
    """A :class:`ThrottlingProxy` in a process of its own; ``with`` starts and stops it.

    ``endpoint`` is its URL once started; :attr:`stats` and :meth:`read_rate` ask the process
    (``GET`` :data:`STATE_PATH`) each time, so they are current.

    :param upstream: the emulator's URL.
    :param limits: what to enforce (sent to the process as JSON).
    :raises RuntimeError: the process ended before it printed its endpoint.
    """

    def __init__(self, upstream: str, limits: KinesisLimits | None = None) -> None:
        self.upstream = upstream
        self.limits = limits or KinesisLimits()
        self.endpoint = ""
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> LimitsProxyProcess:
        root = Path(__file__).resolve().parent.parent
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.kinesis_limits", self.upstream, json.dumps(asdict(self.limits))],
            cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self._process.stdout is not None
        self.endpoint = self._process.stdout.readline().strip()
        if not self.endpoint.startswith("http://"):
            self.__exit__()
            raise RuntimeError(f"the limits proxy process ended before it served (exit code {self._process.returncode})")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is None:
            return
        assert self._process.stdin is not None
        self._process.stdin.close()  # the process stops at its standard input's end
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    @property
    def pid(self) -> int:
        """The proxy process's id (while started)."""
        assert self._process is not None, "not started"
        return self._process.pid

    def _state(self) -> dict:
        with urllib.request.urlopen(self.endpoint + STATE_PATH, timeout=30) as response:
            return json.loads(response.read())

    @property
    def stats(self) -> Counter[str]:
        """The proxy's counts now (:attr:`ThrottlingProxy.stats`)."""
        return Counter(self._state()["stats"])

    def read_rate(self, stream: str) -> float:
        """:meth:`ThrottlingProxy.read_rate`, of the proxy's counts now."""
        state = self._state()
        return _read_rate(state["stats"], state["read_window"], stream)


def _serve(argv: list[str]) -> None:
    """``python -m benchmarks.kinesis_limits UPSTREAM [LIMITS_JSON]``: serve until standard input ends."""
    limits = KinesisLimits(**json.loads(argv[1])) if len(argv) > 1 else KinesisLimits()
    with ThrottlingProxy(argv[0], limits) as proxy:
        print(proxy.endpoint, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    _serve(sys.argv[1:])
