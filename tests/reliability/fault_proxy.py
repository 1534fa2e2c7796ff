"""A fault-injecting HTTP proxy in front of an AWS emulator, for the reliability suite.

It forwards every request to the upstream emulator and, with a seeded probability per request,
answers as the service does when it is overloaded or failing instead:

* Kinesis: ``ProvisionedThroughputExceededException`` or ``KMSThrottlingException`` (HTTP 400),
  ``InternalFailure`` (500), ``ServiceUnavailable`` (503), or a dropped connection (the client's
  socket error) -- all before forwarding, as a throttled or failed read.
* Kinesis ``SubscribeToShard`` (enhanced fan-out; the upstream then is a local SubscribeToShard
  server such as ``demo.subscribe.FanOutProxy``): a failed call before forwarding (the errors the
  API reference lists for it that a retry can cure: ``LimitExceededException``,
  ``ResourceInUseException``, ``KMSThrottlingException``, ``InternalFailure``, a dropped
  connection), or a subscription cut mid-stream after one to three relayed events: the connection
  dropped (``cut``) or an ``InternalFailureException`` exception event, as the service sends
  inside the stream (``stream_error``). The event stream is relayed message by message, as it
  comes (``event_delay`` seconds apart when set: a slow read to kill in the middle of).
* DynamoDB: ``ThrottlingException`` or ``ProvisionedThroughputExceededException`` (400) before
  forwarding (``TransactionConflictException`` is not injected: only transactional calls raise it,
  and the store makes none); and for writes, an ``InternalServerError``
  (500) *after* forwarding: the write applied but the client cannot know (an ambiguous outcome).

Counts of what it injected are kept per fault kind. Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import random
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler

from demo.proxy import ForwardingProxy
from demo.subscribe import exception_message

KINESIS_FAULTS = (
    (400, "ProvisionedThroughputExceededException", "Rate exceeded for shard"),
    (400, "KMSThrottlingException", "KMS rate exceeded"),
    (500, "InternalFailure", "injected internal failure"),
    (503, "ServiceUnavailable", "injected unavailability"),
    (None, "drop", "connection dropped"),
)
SUBSCRIBE_FAULTS = (
    (400, "LimitExceededException", "Rate exceeded for consumer and shard"),
    (400, "ResourceInUseException", "Another active subscription exists for this consumer and shard"),
    (400, "KMSThrottlingException", "KMS rate exceeded"),
    (500, "InternalFailure", "injected internal failure"),
    (None, "drop", "connection dropped"),
    ("cut", "cut", "subscription cut mid-stream"),
    ("cut", "stream_error", "InternalFailureException event mid-stream"),
)
#: ``stream_*`` faults: the exception event sent inside the stream (code, message).
STREAM_ERRORS = {
    "stream_error": ("InternalFailureException", "injected failure mid-stream"),
    "stream_not_found": ("ResourceNotFoundException", "injected: consumer not found"),
}
#: Not drawn at a rate (no retry cures it): a consumer deregistered while subscribed.
CONSUMER_GONE = ("cut", "stream_not_found", "ResourceNotFoundException event mid-stream")
SUBSCRIBE_TARGET = "Kinesis_20131202.SubscribeToShard"
DYNAMODB_FAULTS = (
    (400, "ThrottlingException", "injected throttling"),
    (400, "ProvisionedThroughputExceededException", "injected throughput exceeded"),
)
DYNAMODB_WRITES = ("PutItem", "UpdateItem", "DeleteItem")


class FaultProxy(ForwardingProxy):
    """Start with :meth:`start`; ``endpoint`` is its URL; ``rate`` may be changed at any time.

    :param upstream: the emulator's URL (``http://127.0.0.1:PORT``).
    :param rate: probability of a fault per request, 0..1.
    :param seed: of the fault sequence.
    """

    def __init__(self, upstream: str, rate: float = 0.0, seed: int = 0) -> None:
        super().__init__(upstream)
        self.rate = rate
        self.random = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.operations: Counter[str] = Counter()
        #: ``(operation, body substring, "before" | "after")``: the first matching request is held
        #: (never answered; "after": forwarded first, so it applied) and ``held`` is set.
        self.hold: tuple[str, str, str] | None = None
        self.held = threading.Event()
        self._release = threading.Event()
        #: Answer every n-th GetRecords with ExpiredIteratorException (as after 5 idle minutes).
        self.expire_every: int | None = None
        #: Seconds between two relayed SubscribeToShard events (a slower push; 0: as they come).
        self.event_delay = 0.0
        #: Faults for the next SubscribeToShard calls, in order, before any drawn at ``rate``:
        #: ``(fault, cut_after)``, a fault from ``SUBSCRIBE_FAULTS`` (or ``None``: no fault) and, for
        #: a cut, the messages relayed before it (1: the initial response only; else a random 1..3).
        self.subscribe_faults: list[tuple[tuple | None, int | None]] = []
        #: The SubscribeToShard server upstream, when there is one (``harness.fault_stack``).
        self.fan_out: ForwardingProxy | None = None

    def reads(self) -> int:
        """Read calls seen so far: GetRecords calls and relayed SubscribeToShard events."""
        with self.lock:
            return self.operations["GetRecords"] + self.operations["SubscribeToShardEvent"]

    def stop(self) -> None:
        self._release.set()
        super().stop()

    def _draw(self, faults: tuple) -> tuple | None:
        with self.lock:
            self.requests += 1
            if self.random.random() >= self.rate:
                return None
            return self.random.choice(faults)

    def handle(self, request: BaseHTTPRequestHandler, body: bytes, target: str) -> None:
        service, _, operation = target.partition(".")
        is_dynamodb = service.startswith("DynamoDB")
        with self.lock:
            self.operations[operation] += 1
            hold = self.hold
            if hold and operation == hold[0] and hold[1].encode() in body and not self.held.is_set():
                self.hold = None
            else:
                hold = None
        if operation == "GetRecords" and self.expire_every and self.operations["GetRecords"] % self.expire_every == 0:
            self.injected["ExpiredIteratorException"] += 1
            self.answer_error(request, 400, "ExpiredIteratorException", "Iterator expired", False)
            return
        if hold is not None:
            if hold[2] == "after":
                self.forward(request, body)
            self.held.set()
            self._release.wait()
            request.close_connection = True
            return
        if target == SUBSCRIBE_TARGET:
            with self.lock:
                forced = self.subscribe_faults.pop(0) if self.subscribe_faults else None
            if forced is not None:
                self._subscribe(request, body, *forced)
            else:
                self._subscribe(request, body, self._draw(SUBSCRIBE_FAULTS))
            return
        fault = self._draw(DYNAMODB_FAULTS if is_dynamodb else KINESIS_FAULTS) if target else None
        after = is_dynamodb and operation in DYNAMODB_WRITES and fault is not None and self._coin()
        if fault is not None and not after:
            status, code, message = fault
            self.injected[code] += 1
            if status is None:
                request.close_connection = True
                request.connection.close()
                return
            self.answer_error(request, status, code, message, is_dynamodb)
            return
        status, headers, payload = self.forward(request, body)
        if after:
            self.injected["ambiguous:" + operation] += 1
            self.answer_error(request, 500, "InternalServerError", "injected failure after the write applied", True)
            return
        self.answer(request, status, headers, payload)

    def _coin(self) -> bool:
        with self.lock:
            return self.random.random() < 0.5

    def _subscribe(self, request: BaseHTTPRequestHandler, body: bytes, fault: tuple | None, cut_after: int | None = None) -> None:
        """Relay one SubscribeToShard: fail it, or stream its events through (cut after
        ``cut_after`` messages, or a random 1..3, when ``fault`` is a cut)."""
        if fault is not None:
            status, code, message = fault
            self.injected["SubscribeToShard:" + code] += 1
            if status is None:
                request.close_connection = True
                request.connection.close()
                return
            if status != "cut":
                self.answer_error(request, status, code, message, False)
                return
            if cut_after is None:
                with self.lock:
                    cut_after = self.random.randint(1, 3)
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=120)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "connection", "content-length")}
            conn.request(request.command, request.path, body=body, headers=headers)
            response = conn.getresponse()
            if response.status != 200:
                self.answer(request, response.status, response.getheaders(), response.read())
                return
            request.send_response(200)
            request.send_header("Content-Type", response.getheader("Content-Type", "application/vnd.amazon.eventstream"))
            request.send_header("Transfer-Encoding", "chunked")
            request.end_headers()
            request.close_connection = True
            events = 0
            while True:
                message = _read_message(response)
                if message is None:
                    break
                if events and self.event_delay:
                    time.sleep(self.event_delay)
                if cut_after is not None and events >= cut_after:  # after the initial response and cut_after - 1 events
                    if fault is not None and fault[1] != "cut":  # an exception event, then the stream's end
                        _send_chunk(request, exception_message(*STREAM_ERRORS.get(fault[1], ("InternalFailureException", fault[2]))))
                        request.wfile.write(b"0\r\n\r\n")
                    request.connection.close()  # "cut": no end of the chunked body
                    return
                _send_chunk(request, message)
                if events:
                    with self.lock:
                        self.operations["SubscribeToShardEvent"] += 1
                events += 1
            request.wfile.write(b"0\r\n\r\n")  # the upstream ended the subscription
        except OSError:  # the subscriber went away (killed, or it stopped reading): drop the upstream too
            request.close_connection = True
        finally:
            conn.close()


def _read_message(response: http.client.HTTPResponse) -> bytes | None:
    """One event-stream message (prelude: total length, headers length, CRC) from a streamed
    response body; ``None`` at its end."""
    prelude = response.read(4)
    if len(prelude) < 4:
        return None
    (total,) = struct.unpack("!I", prelude)
    rest = response.read(total - 4)
    return prelude + rest if len(rest) == total - 4 else None


def _send_chunk(request: BaseHTTPRequestHandler, message: bytes) -> None:
    request.wfile.write(f"{len(message):x}\r\n".encode() + message + b"\r\n")
    request.wfile.flush()

