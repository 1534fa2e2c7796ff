"""A local SubscribeToShard (enhanced fan-out) in front of moto, for tests and demos.

Neither moto nor kinesalite serves ``SubscribeToShard``. :class:`FanOutProxy` forwards every call
to the emulator and answers ``SubscribeToShard`` itself, re-serving the emulator's records as the
service pushes them (Kinesis API reference, SubscribeToShard; the event stream encoding of the
AWS SDKs, which botocore's ``eventstream`` parser reads):

- an ``initial-response`` event first, then ``SubscribeToShardEvent`` events of at most
  ``records_per_event`` records with ``ContinuationSequenceNumber`` and ``MillisBehindLatest``;
  at a closed shard's end an event with ``ChildShards`` and no continuation, and the stream ends;
- 2 MiB/s per (consumer, shard): events are paced to the bytes they carry;
- a subscription ends after ``subscription_seconds`` (the service's 5 minutes; shorter in tests);
- a second subscription of a consumer to a shard while one is open is refused with
  ``ResourceInUseException``; an unknown consumer ARN with ``ResourceNotFoundException``.

Stream consumers (RegisterStreamConsumer, DescribeStreamConsumer, ...) are moto's, passed through.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from demo.proxy import ForwardingProxy

__all__ = ["FanOutProxy", "encode_event"]

MIB = 1024 * 1024


def _header(name: str, value: str) -> bytes:
    raw, text = name.encode(), value.encode()
    return struct.pack("!B", len(raw)) + raw + struct.pack("!BH", 7, len(text)) + text  # type 7: string


def encode_event(event_type: str, payload: dict[str, Any], message_type: str = "event") -> bytes:
    """One event-stream message: prelude (total length, headers length, CRC32), headers, JSON
    payload, message CRC32."""
    headers = _header(":message-type", message_type) + _header(":event-type", event_type) + _header(":content-type", "application/json")
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack("!II", total, len(headers))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + headers + body
    return message + struct.pack("!I", binascii.crc32(message) & 0xFFFFFFFF)


class FanOutProxy(ForwardingProxy):
    """Forwards to ``upstream``; serves ``SubscribeToShard`` (module doc). ``stats`` counts
    subscriptions, refusals and pushed bytes."""

    def __init__(self, upstream: str, *, subscription_seconds: float = 300.0, bytes_per_second: float = 2 * MIB,
                 records_per_event: int = 500, poll_seconds: float = 0.5) -> None:  # fmt: skip
        super().__init__(upstream)
        self.subscription_seconds = subscription_seconds
        self.bytes_per_second = bytes_per_second
        self.records_per_event = records_per_event
        self.poll_seconds = poll_seconds
        self.open: set[tuple[str, str]] = set()
        self.stats: dict[str, int] = {"subscriptions": 0, "refused": 0, "events": 0, "bytes": 0}

    def handle(self, request: BaseHTTPRequestHandler, body: bytes, target: str) -> None:
        if target.endswith(".SubscribeToShard"):
            self.subscribe(request, json.loads(body or b"{}"))
        else:
            self.answer(request, *self.forward(request, body))

    def _call(self, operation: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, _, data = self.call_upstream("POST", "/", json.dumps(payload).encode(), {
            "Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": f"Kinesis_20131202.{operation}",
            "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/kinesis/aws4_request, SignedHeaders=host, Signature=0",
        })  # fmt: skip
        return status, json.loads(data or b"{}")

    def subscribe(self, request: BaseHTTPRequestHandler, args: dict[str, Any]) -> None:
        consumer_arn, shard_id = args.get("ConsumerARN", ""), args.get("ShardId", "")
        status, described = self._call("DescribeStreamConsumer", {"ConsumerARN": consumer_arn})
        consumer = described.get("ConsumerDescription", {})
        if status != 200 or consumer.get("ConsumerStatus") != "ACTIVE":
            self.answer_error(request, 400, "ResourceNotFoundException", f"Consumer {consumer_arn} not found or not ACTIVE")
            return
        key = (consumer_arn, shard_id)
        with self.lock:
            if key in self.open:
                self.stats["refused"] += 1
                self.answer_error(request, 400, "ResourceInUseException",
                                  f"Another active subscription exists for consumer {consumer_arn} and shard {shard_id}")  # fmt: skip
                return
            self.open.add(key)
            self.stats["subscriptions"] += 1
        try:
            self._push(request, consumer["StreamARN"], shard_id, args.get("StartingPosition", {}))
        finally:
            with self.lock:
                self.open.discard(key)

    def _iterator(self, stream_arn: str, shard_id: str, position: dict[str, Any]) -> str | None:
        request = {"StreamARN": stream_arn, "StreamName": stream_arn.rsplit("/", 1)[-1], "ShardId": shard_id,
                   "ShardIteratorType": position.get("Type", "LATEST")}  # fmt: skip
        if "SequenceNumber" in position:
            request["StartingSequenceNumber"] = position["SequenceNumber"]
        if "Timestamp" in position:
            request["Timestamp"] = position["Timestamp"]
        return self._call("GetShardIterator", request)[1].get("ShardIterator")

    def _push(self, request: BaseHTTPRequestHandler, stream_arn: str, shard_id: str, position: dict[str, Any]) -> None:
        # Chunked: each event is its own chunk, so the client reads it as it comes (a body delimited
        # by closing the connection is read in large blocks: nothing until the subscription ends).
        request.send_response(200)
        request.send_header("Content-Type", "application/vnd.amazon.eventstream")
        request.send_header("Transfer-Encoding", "chunked")
        request.end_headers()
        request.close_connection = True

        def send(message: bytes) -> None:
            request.wfile.write(f"{len(message):x}\r\n".encode() + message + b"\r\n")
            request.wfile.flush()

        send(encode_event("initial-response", {}))
        iterator = self._iterator(stream_arn, shard_id, position)
        last = position.get("SequenceNumber")
        ends = time.monotonic() + self.subscription_seconds
        while iterator and time.monotonic() < ends:
            page = self._call("GetRecords", {"ShardIterator": iterator, "Limit": self.records_per_event})[1]
            records = page.get("Records", [])
            iterator = page.get("NextShardIterator")
            if records:
                last = records[-1]["SequenceNumber"]
            event: dict[str, Any] = {"Records": records, "MillisBehindLatest": page.get("MillisBehindLatest", 0)}
            if iterator is None or (not records and self._closed_end(stream_arn, shard_id, last)):
                event["ChildShards"] = self._children(stream_arn, shard_id)
                iterator = None  # the shard's end: no continuation
            else:
                event["ContinuationSequenceNumber"] = last or "0"
            size = sum(len(base64.b64decode(r["Data"])) for r in records)
            try:
                send(encode_event("SubscribeToShardEvent", event))
            except OSError:
                return  # the subscriber went away
            self.stats["events"] += 1
            self.stats["bytes"] += size
            time.sleep(max(size / self.bytes_per_second, 0 if records else self.poll_seconds))
        try:
            request.wfile.write(b"0\r\n\r\n")  # the subscription ends
        except OSError:
            pass

    def _shards(self, stream_arn: str) -> list[dict[str, Any]]:
        return self._call("ListShards", {"StreamARN": stream_arn, "StreamName": stream_arn.rsplit("/", 1)[-1]})[1].get("Shards", [])

    def _closed_end(self, stream_arn: str, shard_id: str, last: str | None) -> bool:
        """Whether the shard is closed and nothing is left of it (moto never ends a closed
        shard's iterators: an empty page of a closed shard is its end)."""
        shard = next((s for s in self._shards(stream_arn) if s["ShardId"] == shard_id), None)
        return shard is not None and shard["SequenceNumberRange"].get("EndingSequenceNumber") is not None

    def _children(self, stream_arn: str, shard_id: str) -> list[dict[str, Any]]:
        return [{"ShardId": s["ShardId"], "ParentShards": [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p],
                 "HashKeyRange": s["HashKeyRange"]}
                for s in self._shards(stream_arn) if shard_id in (s.get("ParentShardId"), s.get("AdjacentParentShardId"))]  # fmt: skip

