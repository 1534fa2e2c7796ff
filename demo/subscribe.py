"""A local ``SubscribeToShard`` (enhanced fan-out) in front of a Kinesis emulator: the one server
the tests, the demos and the benchmark's limits proxy use.

No emulator serves ``SubscribeToShard`` to botocore (moto and kinesalite have no such operation).
:class:`ShardSubscriptions` answers it inside a :class:`~demo.proxy.ForwardingProxy` from the
emulator's own records, read with its own ``GetShardIterator`` / ``GetRecords`` calls, as the
Kinesis API reference describes the operation (SubscribeToShard, SubscribeToShardEvent). Two
proxies use it: :class:`FanOutProxy` here (everything else passes through), and
``benchmarks.kinesis_limits.ThrottlingProxy`` (which also enforces the polling limits).
Stream consumers themselves (``RegisterStreamConsumer``, ``DescribeStreamConsumer``, ...) are the
emulator's (moto's), passed through; for an emulator without them (kinesalite), the proxy keeps
its own (:class:`StreamConsumers`, ``own_consumers=True``).

* The request is checked first, and refused with an HTTP 400 JSON error as the service refuses
  it: a ``StartingPosition`` without its ``SequenceNumber`` / ``Timestamp``, or of an unknown
  type: ``InvalidArgumentException``; a consumer the emulator does not know
  (``DescribeStreamConsumer``) or a shard its stream does not have: ``ResourceNotFoundException``
  (the emulator's own error); a consumer that is not ``ACTIVE``: ``ResourceInUseException``.
* **One subscription per consumer and shard.** A call while the consumer's subscription to the
  shard is open and younger than ``takeover_seconds`` (the service's 5 s) is refused with
  ``ResourceInUseException``. A call after that takes the subscription over: the old one
  receives a ``ResourceInUseException`` exception event and ends, as the service documents it.
  With ``takeover_seconds=None`` an open subscription is never taken over. A subscription is
  closed as soon as its subscriber closes the connection.
* **One call per second per consumer and shard**: a call within ``call_interval_seconds`` of the
  last accepted one is refused with ``LimitExceededException`` (an open subscription's
  ``ResourceInUseException`` comes first).
* The answer is HTTP 200, ``application/vnd.amazon.eventstream``, ``Connection: close``, sent
  with chunked transfer encoding, one event-stream message per chunk, written as it is produced
  (botocore reads a chunked body chunk by chunk; it needs no HTTP/2). An ``initial-response``
  event comes first, at once; then ``SubscribeToShardEvent`` events with ``Records`` (as
  GetRecords returns them), ``MillisBehindLatest`` and ``ContinuationSequenceNumber`` (the last
  record pushed, or, before any, the position the subscription started at; resubscribe with
  ``AFTER_SEQUENCE_NUMBER`` and it). While the subscriber is caught up the emulator is polled
  every ``poll_seconds`` and an event without records is pushed each time (progress).
* **2 MiB/s per consumer and shard**: an event of B data bytes leaves a debt of B that drains at
  ``bytes_per_second``; the next event waits until the debt is paid. The debt belongs to the
  (consumer, shard), so a new subscription does not start afresh. Events carry at most
  ``event_bytes`` of data (at least one record) and ``records_per_event`` records.
* **Subscriptions end** ``subscription_seconds`` after they were accepted (the service's 5
  minutes; shortened in tests): the event stream ends cleanly (the last chunk), and the last
  event's ``ContinuationSequenceNumber`` is where to resubscribe. A subscription taken over ends
  with a ``ResourceInUseException`` exception event; one that fails upstream, or is open when the
  proxy stops, with ``InternalFailureException``.
* **One read of the emulator for every consumer**: what the emulator's ``GetRecords`` returned
  for a shard is kept (up to ``shared_bytes`` per shard, while a subscription to the shard is
  open) and pushed from there to the other consumers' subscriptions that reach it, as the
  service stores a shard once for all its consumers; each record's JSON in an event is written
  once too. The events are the same (the same records,
  paced per consumer; ``MillisBehindLatest`` from the shard's newest record seen at the last
  read); the emulator, one process, no longer serializes every byte once per consumer. Only
  records known to follow a position exactly (Positions, below) are pushed from there.
* **A closed shard's end**: once every record up to the shard's ``EndingSequenceNumber`` was
  pushed, a last event carries ``ChildShards`` (``ShardId``, ``ParentShards``, ``HashKeyRange``)
  and no ``ContinuationSequenceNumber``, and the stream ends. The ``EndingSequenceNumber`` is the
  one the subscription first saw in ``ListShards``: moto keeps writing to a split parent and moves
  its ending along; records past it are not pushed by that subscription.

Positions: moto's shard iterators carry the sequence number they continue after, which gives the
exact continuation of a subscription that has pushed nothing yet (``LATEST``, ``AT_TIMESTAMP``,
an empty shard). With another emulator it falls back to just before the starting sequence number
(``AT_SEQUENCE_NUMBER``), the sequence number itself (``AFTER_SEQUENCE_NUMBER``), or just before
the shard's first one (otherwise: a resubscription then may repeat records, never lose any).

Counts (``proxy.stats``, a :class:`collections.Counter`), each also per stream as
``<name>:<stream>``: ``calls``, ``subscriptions``, ``events``, ``records``, ``bytes`` (data bytes
pushed), ``refused`` (any refused call) and why: ``in_use``, ``limit_exceeded``, ``not_found``,
``invalid``, ``inactive``; how subscriptions ended: ``expired``, ``shard_end``, ``taken_over``,
``closed_by_subscriber``, ``closing``, ``upstream_error``, ``internal_error``; and the reads:
``upstream_get_records`` (the emulator's GetRecords calls) and ``shared_records`` (records pushed
from what another subscription to the shard read). ``FanOutProxy``
counts them under these names, ``ThrottlingProxy`` under ``SubscribeToShard.<name>``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import select
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from demo.proxy import ForwardingProxy

__all__ = [
    "CONSUMER_OPERATIONS",
    "EVENT_STREAM",
    "StreamConsumers",
    "FanOutProxy",
    "ShardSubscriptions",
    "SubscribeLimits",
    "encode_message",
    "event_message",
    "exception_message",
]

MIB = 1024 * 1024
EVENT_STREAM = "application/vnd.amazon.eventstream"
_STRING = 7  # event-stream header value type: string
_POSITIONS = ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER", "TRIM_HORIZON", "LATEST", "AT_TIMESTAMP")
_SEQUENCE = re.compile(r"0|[1-9]\d{0,128}")
#: Upstream calls carry the subscriber's own Authorization header; this one when it sent none.
_AUTH = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/kinesis/aws4_request, SignedHeaders=host, Signature=0"


@dataclass(frozen=True)
class SubscribeLimits:
    """What the local ``SubscribeToShard`` enforces (defaults: the service's, Kinesis API
    reference, SubscribeToShard).

    :param bytes_per_second: pushed data bytes per second per (consumer, shard); ``None``: not paced.
    :param subscription_seconds: a subscription's event stream ends this long after it was accepted.
    :param takeover_seconds: a call while the consumer's subscription to the shard is open and
        younger than this is refused (``ResourceInUseException``); an older one is taken over.
        ``None``: an open subscription is never taken over.
    :param call_interval_seconds: one accepted call per this many seconds per (consumer, shard)
        (``LimitExceededException``); ``None``: not limited.
    :param poll_seconds: how often the emulator is polled while the subscriber is caught up.
    :param event_bytes: data bytes per event at most (an event holds at least one record).
    :param records_per_event: records per event at most.
    """

    bytes_per_second: float | None = 2 * MIB
    subscription_seconds: float = 300.0
    takeover_seconds: float | None = 5.0
    call_interval_seconds: float | None = 1.0
    poll_seconds: float = 1.0
    event_bytes: int = 1 * MIB
    records_per_event: int = 10_000


# -- event-stream framing ------------------------------------------------------------------------


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message: a prelude (total length, headers length, both big-endian uint32,
    and the CRC32 of those 8 bytes), the headers (name length, name, value type 7 = string, value
    length uint16, value), the payload, and the CRC32 of everything before it."""
    encoded = b"".join(
        struct.pack(">B", len(name.encode())) + name.encode() + struct.pack(">BH", _STRING, len(value.encode())) + value.encode()
        for name, value in headers.items()
    )  # fmt: skip
    prelude = struct.pack(">II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    message = prelude + struct.pack(">I", binascii.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", binascii.crc32(message))


def event_message(event_type: str, payload: dict[str, Any]) -> bytes:
    """An event (``initial-response``, ``SubscribeToShardEvent``) with a JSON payload."""
    headers = {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, json.dumps(payload, separators=(",", ":")).encode())


def _records_event(records: list[str], millis: int, continuation: str) -> bytes:
    """:func:`event_message` of ``{"Records": ..., "MillisBehindLatest": millis,
    "ContinuationSequenceNumber": continuation}`` from each record's JSON text (the same bytes)."""
    payload = '{"Records":[%s],"MillisBehindLatest":%d,"ContinuationSequenceNumber":%s}' % (
        ",".join(records), millis, json.dumps(continuation))  # fmt: skip
    headers = {":event-type": "SubscribeToShardEvent", ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, payload.encode())


def exception_message(code: str, message: str) -> bytes:
    """A modeled exception of the event stream (``ResourceInUseException``, ...): botocore raises
    it as an ``EventStreamError`` with that code while the events are iterated."""
    headers = {":exception-type": code, ":content-type": "application/json", ":message-type": "exception"}
    return encode_message(headers, json.dumps({"message": message}).encode())


# -- state -----------------------------------------------------------------------------------------


@dataclass
class _Subscription:
    started: float
    stream: str = ""
    shard_id: str = ""
    #: the subscriber's Authorization header, for the upstream calls made on its behalf
    auth: str = _AUTH
    stop: threading.Event = field(default_factory=threading.Event)
    #: the subscriber's connection
    sock: socket.socket | None = None
    #: why ``stop`` was set: ``taken_over`` or ``closing``
    reason: str = ""


@dataclass
class _Slot:
    """One (consumer, shard): its open subscription, its last accepted call, its pacing debt."""

    current: _Subscription | None = None
    last_call: float = float("-inf")
    debt: float = 0.0
    debt_at: float = 0.0


@dataclass
class _SharedShard:
    """What the emulator returned for one shard, shared by the subscriptions open to it.

    Every consumer's subscription pushes the same records, so a record is read from the emulator
    (and its JSON parsed) once for all of them, as the service stores a shard once for every
    consumer: ``following`` maps a sequence number to the record right after it, as an
    emulator's ``GetRecords`` returned them in a row. Pacing stays per (consumer, shard).
    """

    #: sequence number (int) -> the record that follows it (a GetRecords record, JSON-decoded),
    #: in the order they were read (the oldest are dropped first)
    following: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: sequence number (int) -> the data bytes of the record that follows it
    sizes: dict[int, int] = field(default_factory=dict)
    data_bytes: int = 0
    #: ``ApproximateArrivalTimestamp`` of the shard's newest record at the last read (epoch s)
    tip: float | None = None
    #: subscriptions open to the shard; the records are dropped when none is
    users: int = 0
    #: held while one subscription reads the emulator for the shard
    reading: threading.Lock = field(default_factory=threading.Lock)
    #: sequence number (int) -> the record's JSON text in an event, written once for every
    #: subscription (the oldest are dropped first)
    encoded: dict[int, str] = field(default_factory=dict)
    encoded_chars: int = 0

    def add(self, after: int | None, records: list[dict[str, Any]], sizes: list[int], millis: int, cap: int) -> None:
        """Remember ``records`` (read in a row after sequence number ``after``; ``None``: where
        the first one starts is not known exactly; ``millis``: the last one's
        ``MillisBehindLatest``), keeping at most ``cap`` data bytes."""
        arrived = records[-1].get("ApproximateArrivalTimestamp") if records else None
        if isinstance(arrived, (int, float)):
            self.tip = max(self.tip or 0.0, arrived + millis / 1000)
        previous = after
        for record, size in zip(records, sizes, strict=True):
            if previous is not None and previous not in self.following:
                self.following[previous] = record
                self.sizes[previous] = size
                self.data_bytes += size
            previous = int(record["SequenceNumber"])
        while self.data_bytes > cap and self.following:
            oldest = next(iter(self.following))
            del self.following[oldest]
            self.data_bytes -= self.sizes.pop(oldest)

    def after(self, at: int, limit: int) -> tuple[list[dict[str, Any]], list[int]]:
        """Up to ``limit`` records known to follow sequence number ``at`` in a row, their sizes."""
        records: list[dict[str, Any]] = []
        sizes: list[int] = []
        while len(records) < limit and (record := self.following.get(at)) is not None:
            records.append(record)
            sizes.append(self.sizes[at])
            at = int(record["SequenceNumber"])
        return records, sizes

    def texts(self, records: list[dict[str, Any]], lock: threading.Lock, cap: int) -> list[str]:
        """Each record's JSON text (``separators=(",", ":")``), written once per record for all
        subscriptions; keeps at most ``cap`` characters. ``lock`` guards this object."""
        keys = [int(r["SequenceNumber"]) for r in records]
        with lock:
            texts = [self.encoded.get(key) for key in keys]
        missing = [i for i, text in enumerate(texts) if text is None]
        if not missing:
            return texts  # type: ignore[return-value]
        for i in missing:
            texts[i] = json.dumps(records[i], separators=(",", ":"))
        with lock:
            for i in missing:
                if keys[i] not in self.encoded:
                    self.encoded[keys[i]] = texts[i]  # type: ignore[assignment]
                    self.encoded_chars += len(texts[i])  # type: ignore[arg-type]
            while self.encoded_chars > cap and self.encoded:
                self.encoded_chars -= len(self.encoded.pop(next(iter(self.encoded))))
        return texts  # type: ignore[return-value]

    def behind(self, record: dict[str, Any]) -> int:
        """``MillisBehindLatest`` of ``record``, from the tip seen at the last read."""
        arrived = record.get("ApproximateArrivalTimestamp")
        if self.tip is None or not isinstance(arrived, (int, float)):
            return 0
        return max(0, int((self.tip - arrived) * 1000))


@dataclass
class _Cursor:
    """Where one subscription reads the emulator."""

    #: the emulator's shard iterator (``None``: its chain ended)
    iterator: str | None
    #: whether the subscription's continuation is exactly where the next record follows (not an
    #: estimate, module doc, Positions): only then are records read for the shard pushed to it
    exact: bool = False
    #: whether ``iterator`` continues right after the continuation (not when records came from
    #: what was read for the shard)
    fresh: bool = True
    #: the emulator's refusals in a row
    failures: int = 0


class _Gone(Exception):
    """The subscriber closed the connection."""


def _data_bytes(record: dict[str, Any]) -> int:
    b64 = record.get("Data", "")
    return len(b64) * 3 // 4 - (2 if b64.endswith("==") else 1 if b64.endswith("=") else 0)


def _iterator_position(iterator: str, shard_id: str) -> str | None:
    """The sequence number a moto shard iterator continues after (base64 of
    ``stream:shard:sequence``); ``None`` for any other emulator's iterator."""
    try:
        text = base64.b64decode(iterator, validate=False).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    head, _, number = text.strip().rpartition(":")
    return number if head.endswith(f":{shard_id}") and _SEQUENCE.fullmatch(number) else None


def _before(sequence_number: str) -> str:
    return str(max(0, int(sequence_number) - 1))


def _call_upstream(proxy: Any, operation: str, payload: dict[str, Any], auth: str) -> tuple[int, list[tuple[str, str]], bytes]:
    """One Kinesis call of the proxy's own to the emulator, with the subscriber's ``Authorization``
    and a date (kinesalite refuses a signed request without ``X-Amz-Date``; neither checks the signature)."""
    return proxy.call_upstream("POST", "/", json.dumps(payload).encode(), {
        "X-Amz-Target": f"Kinesis_20131202.{operation}", "Content-Type": "application/x-amz-json-1.1", "Authorization": auth,
        "X-Amz-Date": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
    })  # fmt: skip


# -- stream consumers, for an emulator without them ------------------------------------------------

#: The stream-consumer operations :class:`StreamConsumers` answers.
CONSUMER_OPERATIONS = ("RegisterStreamConsumer", "DescribeStreamConsumer", "ListStreamConsumers", "DeregisterStreamConsumer")


class StreamConsumers:
    """Stream consumers kept by the proxy, for an emulator that has none (kinesalite 3): the four
    calls of :data:`CONSUMER_OPERATIONS` answered as the Kinesis API reference describes them, in
    memory. A consumer is ``CREATING`` for ``activate_seconds`` after it was registered, then
    ``ACTIVE``; deregistered, it is gone at once. Its ARN is the stream's ARN followed by
    ``/consumer/NAME:CREATION_EPOCH_SECONDS``, as the service writes it. Registering needs the
    stream (the emulator's ``DescribeStreamSummary`` by name, from the ARN); a name already
    registered for the stream is ``ResourceInUseException``; an unknown consumer
    ``ResourceNotFoundException``; more than ``max_consumers`` of a stream ``LimitExceededException``
    (the service's 20).

    :param proxy: the :class:`~demo.proxy.ForwardingProxy` it answers in (``lock``, ``answer``,
        ``answer_error``, ``call_upstream``).
    """

    def __init__(self, proxy: Any, *, activate_seconds: float = 0.2, max_consumers: int = 20) -> None:
        self.proxy = proxy
        self.activate_seconds = activate_seconds
        self.max_consumers = max_consumers
        #: consumer ARN -> its description (``StreamARN`` included) and the monotonic time it was registered
        self._consumers: dict[str, tuple[dict[str, Any], float]] = {}

    def describe(self, consumer_arn: str) -> dict[str, Any] | None:
        """``DescribeStreamConsumer``'s ``ConsumerDescription`` of ``consumer_arn``, or ``None``."""
        with self.proxy.lock:
            found = self._consumers.get(consumer_arn)
            if found is None:
                return None
            description, registered = found
            status = "ACTIVE" if time.monotonic() - registered >= self.activate_seconds else "CREATING"
            return {**description, "ConsumerStatus": status}

    def call(self, request: BaseHTTPRequestHandler, body: bytes, operation: str) -> None:
        """Answer one call of :data:`CONSUMER_OPERATIONS`."""
        try:
            args = json.loads(body or b"{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            self.proxy.answer_error(request, 400, "SerializationException", "The request body is not a JSON object")
            return
        status, answer = getattr(self, f"_{operation}")(args, request.headers.get("Authorization") or _AUTH)
        if status != 200:
            self.proxy.answer_error(request, status, answer["code"], answer["message"])
            return
        self.proxy.answer(request, 200, [("Content-Type", "application/x-amz-json-1.1")], json.dumps(answer).encode())

    def _find(self, args: dict[str, Any]) -> tuple[str | None, str]:
        """The consumer ARN ``args`` name (``ConsumerARN``, or ``StreamARN`` and ``ConsumerName``) and how to name it."""
        if args.get("ConsumerARN"):
            arn = str(args["ConsumerARN"])
            with self.proxy.lock:
                return (arn if arn in self._consumers else None), arn
        stream_arn, name = str(args.get("StreamARN") or ""), str(args.get("ConsumerName") or "")
        with self.proxy.lock:
            for arn, (description, _) in self._consumers.items():
                if description["StreamARN"] == stream_arn and description["ConsumerName"] == name:
                    return arn, name
        return None, f"{name} of stream {stream_arn}"

    @staticmethod
    def _not_found(what: str) -> tuple[int, dict[str, Any]]:
        return 400, {"code": "ResourceNotFoundException", "message": f"Consumer {what} not found"}

    def _RegisterStreamConsumer(self, args: dict[str, Any], auth: str) -> tuple[int, dict[str, Any]]:  # noqa: N802 - the operation's name
        stream_arn, name = str(args.get("StreamARN") or ""), str(args.get("ConsumerName") or "")
        if ":stream/" not in stream_arn or not re.fullmatch(r"[a-zA-Z0-9_.-]{1,128}", name):
            return 400, {"code": "InvalidArgumentException", "message": "StreamARN and ConsumerName ([a-zA-Z0-9_.-]{1,128}) are required"}
        status, _, _ = _call_upstream(self.proxy, "DescribeStreamSummary", {"StreamName": stream_arn.partition(":stream/")[2]}, auth)
        if status != 200:
            return 400, {"code": "ResourceNotFoundException", "message": f"Stream {stream_arn} not found"}
        now = time.time()
        with self.proxy.lock:
            of_stream = [d for d, _ in self._consumers.values() if d["StreamARN"] == stream_arn]
            if any(d["ConsumerName"] == name for d in of_stream):
                return 400, {"code": "ResourceInUseException", "message": f"Consumer {name} of stream {stream_arn} already exists"}
            if len(of_stream) >= self.max_consumers:
                return 400, {"code": "LimitExceededException", "message": f"Stream {stream_arn} has {len(of_stream)} consumers"}
            arn = f"{stream_arn}/consumer/{name}:{int(now)}"
            description = {"ConsumerName": name, "ConsumerARN": arn, "ConsumerCreationTimestamp": now, "StreamARN": stream_arn}
            self._consumers[arn] = (description, time.monotonic())
        return 200, {"Consumer": {k: v for k, v in {**description, "ConsumerStatus": "CREATING"}.items() if k != "StreamARN"}}

    def _DescribeStreamConsumer(self, args: dict[str, Any], auth: str) -> tuple[int, dict[str, Any]]:  # noqa: N802
        arn, what = self._find(args)
        description = self.describe(arn) if arn else None
        return (200, {"ConsumerDescription": description}) if description else self._not_found(what)

    def _ListStreamConsumers(self, args: dict[str, Any], auth: str) -> tuple[int, dict[str, Any]]:  # noqa: N802
        stream_arn = str(args.get("StreamARN") or "")
        with self.proxy.lock:
            arns = [arn for arn, (d, _) in self._consumers.items() if d["StreamARN"] == stream_arn]
        described = [self.describe(arn) for arn in arns]
        return 200, {"Consumers": [{k: v for k, v in d.items() if k != "StreamARN"} for d in described if d]}

    def _DeregisterStreamConsumer(self, args: dict[str, Any], auth: str) -> tuple[int, dict[str, Any]]:  # noqa: N802
        arn, what = self._find(args)
        if arn is None:
            return self._not_found(what)
        with self.proxy.lock:
            self._consumers.pop(arn, None)
        return 200, {}


class ShardSubscriptions:
    """The ``SubscribeToShard`` side of a proxy (module doc). Call :meth:`subscribe` from the
    proxy's ``handle`` for ``Kinesis_20131202.SubscribeToShard``; :meth:`close` when it stops.

    :param proxy: the :class:`~demo.proxy.ForwardingProxy` it serves in (its ``lock``, ``stats``
        (a ``Counter``), ``call_upstream``, ``answer`` and ``answer_error`` are used).
    :param limits: what to enforce; may be replaced while the proxy runs (read at each use).
    :param prefix: the prefix of the names counted in ``proxy.stats``.
    """

    #: Data bytes per shard kept of what the emulator returned, for the other subscriptions open
    #: to the shard (the oldest are dropped first): consumers reading together stay well within it.
    shared_bytes: int = 16 * MIB

    def __init__(self, proxy: Any, limits: SubscribeLimits | None = None, prefix: str = "",
                 consumers: StreamConsumers | None = None) -> None:  # fmt: skip
        self.proxy = proxy
        self.limits = limits or SubscribeLimits()
        self.prefix = prefix
        #: the proxy's own stream consumers (an emulator without them), or ``None``: the emulator's
        self.consumers = consumers
        self.slots: dict[tuple[str, str], _Slot] = {}
        #: (stream, shard) -> the records read for the subscriptions open to it
        self.shared: dict[tuple[str, str], _SharedShard] = {}
        self.closing = False

    def open_subscriptions(self) -> int:
        """Subscriptions open now."""
        with self.proxy.lock:
            return sum(1 for slot in self.slots.values() if slot.current is not None)

    def close(self) -> None:
        """End every open subscription (the proxy is stopping)."""
        with self.proxy.lock:
            self.closing = True
            for slot in self.slots.values():
                if slot.current is not None:
                    slot.current.reason = slot.current.reason or "closing"
                    slot.current.stop.set()

    def _count(self, name: str, stream: str | None = None, n: int = 1) -> None:
        with self.proxy.lock:
            self.proxy.stats[f"{self.prefix}{name}"] += n
            if stream is not None:
                self.proxy.stats[f"{self.prefix}{name}:{stream}"] += n

    def _upstream(self, operation: str, payload: dict[str, Any], auth: str) -> tuple[int, list[tuple[str, str]], bytes]:
        return _call_upstream(self.proxy, operation, payload, auth)

    def _refuse(self, request: BaseHTTPRequestHandler, outcome: str, stream: str | None, code: str, message: str,
                status: int = 400) -> None:  # fmt: skip
        self._count(outcome, stream)
        if outcome not in ("invalid", "not_found"):
            self._count("refused", stream)
        self.proxy.answer_error(request, status, code, message)

    # -- the call ----------------------------------------------------------------------------------

    def subscribe(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        """Answer one ``SubscribeToShard`` call: an error, or the event stream until the
        subscription ends (this holds the request's thread that long)."""
        try:
            args = json.loads(body or b"{}")
        except ValueError:
            args = None
        self._count("calls")
        if not isinstance(args, dict):
            self._refuse(request, "invalid", None, "SerializationException", "The request body is not a JSON object")
            return
        auth = request.headers.get("Authorization") or _AUTH
        consumer_arn, shard_id = str(args.get("ConsumerARN") or ""), str(args.get("ShardId") or "")
        position = args.get("StartingPosition") if isinstance(args.get("StartingPosition"), dict) else None
        problem = self._invalid(consumer_arn, shard_id, position)
        if problem:
            self._refuse(request, "invalid", None, "InvalidArgumentException", problem)
            return
        assert position is not None
        if self.consumers is not None:
            consumer = self.consumers.describe(consumer_arn)
            if consumer is None:
                self._refuse(request, "not_found", None, "ResourceNotFoundException", f"Consumer {consumer_arn} not found")
                return
        else:
            status, headers, payload = self._upstream("DescribeStreamConsumer", {"ConsumerARN": consumer_arn}, auth)
            if status != 200:
                self._count("not_found" if status == 400 else "upstream_error")
                self.proxy.answer(request, status, headers, payload)
                return
            consumer = json.loads(payload).get("ConsumerDescription", {})
        stream = consumer.get("StreamARN", "").partition(":stream/")[2]
        if consumer.get("ConsumerStatus") != "ACTIVE":
            self._refuse(request, "inactive", stream, "ResourceInUseException",
                         f"Consumer {consumer_arn} is {consumer.get('ConsumerStatus')}, not ACTIVE")  # fmt: skip
            return
        ask = {"StreamName": stream, "ShardId": shard_id, "ShardIteratorType": position["Type"]}
        if "SequenceNumber" in position:
            ask["StartingSequenceNumber"] = position["SequenceNumber"]
        if "Timestamp" in position:
            ask["Timestamp"] = position["Timestamp"]
        status, headers, payload = self._upstream("GetShardIterator", ask, auth)
        if status != 200:
            self._count("not_found" if status == 400 else "upstream_error", stream)
            self.proxy.answer(request, status, headers, payload)
            return
        iterator = json.loads(payload)["ShardIterator"]

        limits = self.limits
        key = (consumer_arn, shard_id)
        now = time.monotonic()
        with self.proxy.lock:
            slot = self.slots.setdefault(key, _Slot())
            current = slot.current
            interval = limits.call_interval_seconds
            if current is not None and (limits.takeover_seconds is None or now - current.started < limits.takeover_seconds):
                refusal = ("in_use", "ResourceInUseException",
                           f"Another active subscription exists for consumer {consumer_arn} and shard {shard_id} "
                           f"(opened {now - current.started:.1f} s ago)")  # fmt: skip
            elif interval is not None and now - slot.last_call < interval:
                refusal = ("limit_exceeded", "LimitExceededException",
                           f"Rate exceeded for consumer {consumer_arn} and shard {shard_id}: one SubscribeToShard per second")  # fmt: skip
            elif self.closing:
                refusal = ("closing", "InternalFailureException", "The proxy is stopping")
            else:
                refusal = None
                if current is not None:
                    current.reason = "taken_over"
                    current.stop.set()
                subscription = _Subscription(started=now, stream=stream, shard_id=shard_id, auth=auth)
                slot.current, slot.last_call = subscription, now
        if refusal is not None:
            outcome, code, message = refusal
            self._refuse(request, outcome, stream, code, message, status=500 if outcome == "closing" else 400)
            return
        self._count("subscriptions", stream)
        try:
            self._serve(request, slot, subscription, iterator, position)
        finally:
            self._release(slot, subscription)

    @staticmethod
    def _invalid(consumer_arn: str, shard_id: str, position: dict[str, Any] | None) -> str | None:
        if not consumer_arn or not shard_id or position is None:
            return "ConsumerARN, ShardId and StartingPosition are required"
        kind = position.get("Type")
        if kind not in _POSITIONS:
            return f"StartingPosition.Type {kind!r} is not one of {', '.join(_POSITIONS)}"
        if kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
            if not _SEQUENCE.fullmatch(str(position.get("SequenceNumber", ""))):
                return f"StartingPosition {kind} needs a SequenceNumber (digits), not {position.get('SequenceNumber')!r}"
        elif "SequenceNumber" in position:
            return f"StartingPosition {kind} takes no SequenceNumber"
        if kind == "AT_TIMESTAMP" and not isinstance(position.get("Timestamp"), (int, float)):
            return "StartingPosition AT_TIMESTAMP needs a Timestamp"
        return None

    # -- the event stream --------------------------------------------------------------------------

    def _serve(self, request: BaseHTTPRequestHandler, slot: _Slot, subscription: _Subscription, iterator: str,
               position: dict[str, Any]) -> None:  # fmt: skip
        stream = subscription.stream
        request.send_response(200)
        request.send_header("Content-Type", EVENT_STREAM)
        request.send_header("Transfer-Encoding", "chunked")
        request.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        # The connection ends with the subscription: said so, for the client not to send its next
        # request on a connection the proxy is about to close.
        request.send_header("Connection", "close")
        request.end_headers()
        request.close_connection = True
        request.connection.settimeout(30.0)  # a subscriber that stops reading without closing
        subscription.sock = request.connection

        def send(message: bytes) -> None:
            try:
                request.wfile.write(b"%x\r\n%s\r\n" % (len(message), message))
                request.wfile.flush()
            except OSError as error:
                raise _Gone() from error

        # How it ended is counted, and the (consumer, shard) freed, before the subscriber can
        # see the end: what it sees next in the stats and the slots is already true.
        try:
            send(event_message("initial-response", {}))
            outcome = self._push(send, slot, subscription, iterator, position)
        except _Gone:
            self._release(slot, subscription)
            self._count("closed_by_subscriber", stream)
            return
        except Exception:  # a bug or an emulator's surprise: say so on the stream, as the service would
            self._release(slot, subscription)
            self._count("internal_error", stream)
            self._end(send, request, ("InternalFailureException", "Internal failure"))
            raise
        self._release(slot, subscription)
        self._count(outcome, stream)
        failure = {
            "taken_over": ("ResourceInUseException", "Another subscription of this consumer to the shard took over"),
            "closing": ("InternalFailureException", "The service is shutting down"),
            "upstream_error": ("InternalFailureException", "Reading the shard failed"),
        }.get(outcome)  # fmt: skip
        self._end(send, request, failure)

    def _release(self, slot: _Slot, subscription: _Subscription) -> None:
        with self.proxy.lock:
            if slot.current is subscription:
                slot.current = None

    @staticmethod
    def _end(send: Callable[[bytes], None], request: BaseHTTPRequestHandler, failure: tuple[str, str] | None) -> None:
        """End the event stream (after an exception event, if it failed)."""
        try:
            if failure is not None:
                send(exception_message(*failure))
            request.wfile.write(b"0\r\n\r\n")  # the last chunk
        except (_Gone, OSError):
            pass

    def _wait(self, subscription: _Subscription, seconds: float, deadline: float) -> bool:
        """Wait ``seconds`` (not past the subscription's end); ``False`` if the subscription ended.
        Raises :class:`_Gone` as soon as the subscriber closes the connection (it sends nothing
        after its request, so a readable socket is its end), which frees the (consumer, shard)."""
        until = min(time.monotonic() + seconds, deadline)
        while True:
            left = until - time.monotonic()
            if left <= 0:
                break
            if subscription.stop.wait(min(left, 0.1)):
                return False
            if subscription.sock is not None and select.select([subscription.sock], [], [], 0)[0]:
                try:
                    if not subscription.sock.recv(1, socket.MSG_PEEK):
                        raise _Gone()
                except OSError as error:
                    raise _Gone() from error
        return not subscription.stop.is_set() and time.monotonic() < deadline

    def _pay(self, slot: _Slot, size: int, subscription: _Subscription, deadline: float) -> bool:
        """Wait until the (consumer, shard) is out of debt, then charge ``size`` bytes to it."""
        rate = self.limits.bytes_per_second
        if not rate:
            return not subscription.stop.is_set() and time.monotonic() < deadline
        while True:
            with self.proxy.lock:
                now = time.monotonic()
                slot.debt = max(0.0, slot.debt - (now - slot.debt_at) * rate)
                slot.debt_at = now
                if slot.debt <= 0:
                    if subscription.stop.is_set() or now >= deadline:
                        return False
                    slot.debt = float(size)
                    return True
                owed = slot.debt / rate
            if not self._wait(subscription, owed, deadline):
                return False

    def _push(self, send: Callable[[bytes], None], slot: _Slot, subscription: _Subscription, iterator: str | None,
              position: dict[str, Any]) -> str:  # fmt: skip
        """Push events until the subscription ends; returns how it ended."""
        key = (subscription.stream, subscription.shard_id)
        with self.proxy.lock:
            shared = self.shared.setdefault(key, _SharedShard())
            shared.users += 1
        try:
            return self._push_events(send, slot, subscription, iterator, position, shared)
        finally:
            with self.proxy.lock:
                shared.users -= 1
                if not shared.users and self.shared.get(key) is shared:
                    del self.shared[key]

    def _push_events(self, send: Callable[[bytes], None], slot: _Slot, subscription: _Subscription, iterator: str | None,
                     position: dict[str, Any], shared: _SharedShard) -> str:  # fmt: skip
        stream, shard_id = subscription.stream, subscription.shard_id
        deadline = subscription.started + self.limits.subscription_seconds
        at = self._start(iterator or "", subscription, position)  # the continuation: the last sequence number passed
        exact = (_iterator_position(iterator or "", shard_id) is not None
                 or position["Type"] in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"))  # fmt: skip
        cursor = _Cursor(iterator, exact=exact)
        ending = self._ending(subscription)
        largest = 0
        caught_up = False
        while True:
            limits = self.limits
            if subscription.stop.is_set():
                return subscription.reason or "closing"
            if time.monotonic() >= deadline:
                return "expired"
            if ending is None and caught_up:
                ending = self._ending(subscription)
            if ending is not None and int(at) >= ending:
                self._count("events", stream)
                send(event_message("SubscribeToShardEvent", self._last_event([], 0, subscription)))
                return "shard_end"
            closed_before = ending is not None
            ask = 100 if not largest else max(1, min(10_000, limits.event_bytes // largest))
            ask = min(ask, limits.records_per_event)
            read = self._read(subscription, shared, cursor, at, ask)
            if isinstance(read, str):
                if read == "retry":
                    continue
                return read  # upstream_error
            records, sizes, millis = read
            if ending is not None:
                within = [r for r in records if int(r["SequenceNumber"]) <= ending]
                at_end = len(within) < len(records) or bool(within and int(within[-1]["SequenceNumber"]) >= ending)
                records, sizes = within, sizes[: len(within)]
            else:
                at_end = False
            at_end = at_end or cursor.iterator is None or (closed_before and not records)
            if not records and not at_end:
                if (from_iterator := _iterator_position(cursor.iterator or "", shard_id)) is not None and int(from_iterator) > int(at):
                    at = from_iterator  # the emulator moved on without records (never on moto)
                self._count("events", stream)
                empty = {"Records": [], "MillisBehindLatest": millis, "ContinuationSequenceNumber": at}
                send(event_message("SubscribeToShardEvent", empty))
                caught_up = True
                self._wait(subscription, limits.poll_seconds, deadline)  # if it ended, the loop's head tells why
                continue
            caught_up = False
            largest = max([largest, *sizes])
            newest = records[-1].get("ApproximateArrivalTimestamp") if records else None
            events = self._split(records, sizes)
            if not events:  # the shard's end with nothing more to push
                self._count("events", stream)
                send(event_message("SubscribeToShardEvent", self._last_event([], millis, subscription)))
                return "shard_end"
            for index, (chunk, size) in enumerate(events):
                if not self._pay(slot, size, subscription, deadline):
                    # Ended while waiting to push: the rest is the next subscription's. (The
                    # emulator's iterator is past ``at`` now: nothing more may come from it.)
                    return (subscription.reason or "closing") if subscription.stop.is_set() else "expired"
                behind = millis
                arrived = chunk[-1].get("ApproximateArrivalTimestamp")
                if isinstance(newest, (int, float)) and isinstance(arrived, (int, float)):
                    behind += max(0, int((newest - arrived) * 1000))
                last = at_end and index == len(events) - 1
                if last:
                    message = event_message("SubscribeToShardEvent", self._last_event(chunk, behind, subscription))
                else:
                    texts = shared.texts(chunk, self.proxy.lock, 2 * self.shared_bytes)
                    message = _records_event(texts, behind, chunk[-1]["SequenceNumber"])
                self._count("events", stream)  # counted as they are written: the counts never lag what was seen
                self._count("records", stream, len(chunk))
                self._count("bytes", stream, size)
                send(message)
                at = chunk[-1]["SequenceNumber"]
                if last:
                    return "shard_end"

    def _read(self, subscription: _Subscription, shared: _SharedShard, cursor: _Cursor, at: str,
              limit: int) -> tuple[list[dict[str, Any]], list[int], int] | str:  # fmt: skip
        """The next records after ``at`` (at most ``limit``): from what was read for the shard
        already, else from the emulator (one read at a time per shard: a subscription that
        reaches the same records meanwhile waits for that read and takes them from it).

        :returns: ``(records, their data bytes, MillisBehindLatest)``, or ``"retry"`` (the
            emulator refused the call: its iterator is renewed), or ``"upstream_error"``.
        """
        stream, auth = subscription.stream, subscription.auth
        read = self._from_shared(shared, stream, at, limit, cursor.exact)
        if read[0]:
            cursor.fresh = False
            return read
        with shared.reading:
            read = self._from_shared(shared, stream, at, limit, cursor.exact)
            if read[0]:
                cursor.fresh = False
                return read
            if not cursor.fresh:  # the emulator's iterator is behind: continue from ``at``
                status, _, again = self._iterator_after(subscription, at)
                if status != 200:
                    return "upstream_error"
                cursor.iterator, cursor.fresh = json.loads(again)["ShardIterator"], True
            status, _, payload = self._upstream("GetRecords", {"ShardIterator": cursor.iterator, "Limit": limit}, auth)
            self._count("upstream_get_records", stream)
            if status != 200:  # e.g. an expired iterator of the emulator's: again from where we are
                cursor.failures += 1
                status, _, again = self._iterator_after(subscription, at)
                if status != 200 or cursor.failures > 3:
                    return "upstream_error"
                cursor.iterator = json.loads(again)["ShardIterator"]
                return "retry"
            cursor.failures = 0
            page = json.loads(payload)
            records = page.get("Records", [])
            cursor.iterator = page.get("NextShardIterator")
            millis = int(page.get("MillisBehindLatest") or 0)
            sizes = [_data_bytes(r) for r in records]
            if records:
                with self.proxy.lock:
                    shared.add(int(at) if cursor.exact else None, records, sizes, millis, self.shared_bytes)
                cursor.exact = True  # from here on ``at`` is a record's own sequence number
            return records, sizes, millis

    def _from_shared(self, shared: _SharedShard, stream: str, at: str, limit: int,
                     exact: bool) -> tuple[list[dict[str, Any]], list[int], int]:  # fmt: skip
        """Up to ``limit`` records read (by any subscription) right after ``at``, none unless
        ``exact``: the records, their data bytes, and the last one's ``MillisBehindLatest``."""
        if not exact:
            return [], [], 0
        with self.proxy.lock:
            records, sizes = shared.after(int(at), limit)
            millis = shared.behind(records[-1]) if records else 0
        if records:
            self._count("shared_records", stream, len(records))
        return records, sizes, millis

    def _iterator_after(self, subscription: _Subscription, at: str) -> tuple[int, list[tuple[str, str]], bytes]:
        """The emulator's ``GetShardIterator`` answer for just after sequence number ``at``."""
        return self._upstream("GetShardIterator", {"StreamName": subscription.stream, "ShardId": subscription.shard_id,
                                                   "ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": at},
                              subscription.auth)  # fmt: skip

    def _split(self, records: list[dict[str, Any]], sizes: list[int]) -> list[tuple[list[dict[str, Any]], int]]:
        """The records in events of at most ``event_bytes`` data bytes (at least one record)."""
        events: list[tuple[list[dict[str, Any]], int]] = []
        chunk: list[dict[str, Any]] = []
        total = 0
        for record, size in zip(records, sizes, strict=True):
            if chunk and total + size > self.limits.event_bytes:
                events.append((chunk, total))
                chunk, total = [], 0
            chunk.append(record)
            total += size
        if chunk:
            events.append((chunk, total))
        return events

    def _last_event(self, records: list[dict[str, Any]], millis: int, subscription: _Subscription) -> dict[str, Any]:
        """A closed shard's last event: its child shards, no continuation."""
        return {"Records": records, "MillisBehindLatest": millis, "ChildShards": self._children(subscription)}

    # -- the emulator's shards ---------------------------------------------------------------------

    def _shards(self, subscription: _Subscription) -> list[dict[str, Any]]:
        status, _, payload = self._upstream("ListShards", {"StreamName": subscription.stream, "MaxResults": 10_000},
                                            subscription.auth)  # fmt: skip
        return json.loads(payload).get("Shards", []) if status == 200 else []

    def _ending(self, subscription: _Subscription) -> int | None:
        """The closed shard's EndingSequenceNumber now; ``None`` while it is open."""
        shard = next((s for s in self._shards(subscription) if s["ShardId"] == subscription.shard_id), None)
        ending = shard and shard.get("SequenceNumberRange", {}).get("EndingSequenceNumber")
        return None if ending is None else int(ending)

    def _children(self, subscription: _Subscription) -> list[dict[str, Any]]:
        children = []
        for shard in self._shards(subscription):
            parents = [p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p]
            if subscription.shard_id in parents:
                children.append({"ShardId": shard["ShardId"], "ParentShards": parents, "HashKeyRange": shard["HashKeyRange"]})
        return children

    def _start(self, iterator: str, subscription: _Subscription, position: dict[str, Any]) -> str:
        """The continuation of a subscription that has pushed nothing yet (module doc, Positions)."""
        exact = _iterator_position(iterator, subscription.shard_id)
        if exact is not None:
            return exact
        kind = position["Type"]
        if kind == "AFTER_SEQUENCE_NUMBER":
            return str(position["SequenceNumber"])
        if kind == "AT_SEQUENCE_NUMBER":
            return _before(position["SequenceNumber"])
        shard = next((s for s in self._shards(subscription) if s["ShardId"] == subscription.shard_id), {})
        return _before(shard.get("SequenceNumberRange", {}).get("StartingSequenceNumber", "0"))


class FanOutProxy(ForwardingProxy):
    """A proxy in front of an emulator that serves ``SubscribeToShard`` (module doc) and passes
    every other call through. Start with :meth:`start` (or ``with``); ``endpoint`` is its URL.

    :param upstream: the emulator's URL (``http://127.0.0.1:PORT``).
    :param subscription_seconds: a subscription ends this long after it was accepted (seconds;
        the service's 5 minutes by default).
    :param bytes_per_second: pushed data bytes per second per (consumer, shard) (2 MiB/s);
        ``None``: not paced.
    :param records_per_event: records per event at most.
    :param poll_seconds: how often the emulator is polled while a subscriber is caught up.
    :param limits: all settings at once (:class:`SubscribeLimits`), instead of the ones above.
    :param own_consumers: answer the stream-consumer calls itself (:class:`StreamConsumers`), for
        an emulator that has none (kinesalite); by default they pass through.

    ``stats`` counts calls, subscriptions, refusals, events, records and bytes (module doc);
    ``subscriptions`` is the :class:`ShardSubscriptions` (its ``limits`` may be replaced).
    """

    def __init__(self, upstream: str, *, subscription_seconds: float = 300.0, bytes_per_second: float | None = 2 * MIB,
                 records_per_event: int = 10_000, poll_seconds: float = 0.5,
                 limits: SubscribeLimits | None = None, own_consumers: bool = False) -> None:  # fmt: skip
        super().__init__(upstream)
        self.stats: Counter[str] = Counter()
        limits = limits or SubscribeLimits(bytes_per_second=bytes_per_second, subscription_seconds=subscription_seconds,
                                           records_per_event=records_per_event, poll_seconds=poll_seconds)  # fmt: skip
        self.subscriptions = ShardSubscriptions(self, limits, consumers=StreamConsumers(self) if own_consumers else None)

    def handle(self, request: BaseHTTPRequestHandler, body: bytes, target: str) -> None:
        operation = target.partition(".")[2]
        if operation == "SubscribeToShard":
            self.subscriptions.subscribe(request, body)
        elif operation in CONSUMER_OPERATIONS and self.subscriptions.consumers is not None:
            self.subscriptions.consumers.call(request, body, operation)
        else:
            self.answer(request, *self.forward(request, body))

    def stop(self) -> None:
        self.subscriptions.close()
        super().stop()
