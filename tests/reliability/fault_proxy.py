"""A fault-injecting HTTP proxy in front of an AWS emulator, for the reliability suite.

It forwards every request to the upstream emulator and, with a seeded probability per request,
answers as the service does when it is overloaded or failing instead:

* Kinesis: ``ProvisionedThroughputExceededException`` or ``KMSThrottlingException`` (HTTP 400),
  ``InternalFailure`` (500), ``ServiceUnavailable`` (503), or a dropped connection (the client's
  socket error) -- all before forwarding, as a throttled or failed read.
* DynamoDB: ``ThrottlingException`` or ``ProvisionedThroughputExceededException`` (400) before
  forwarding (``TransactionConflictException`` is not injected: only transactional calls raise it,
  and the store makes none); and for writes, an ``InternalServerError``
  (500) *after* forwarding: the write applied but the client cannot know (an ambiguous outcome).

Counts of what it injected are kept per fault kind. Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler

from demo.proxy import ForwardingProxy

KINESIS_FAULTS = (
    (400, "ProvisionedThroughputExceededException", "Rate exceeded for shard"),
    (400, "KMSThrottlingException", "KMS rate exceeded"),
    (500, "InternalFailure", "injected internal failure"),
    (503, "ServiceUnavailable", "injected unavailability"),
    (None, "drop", "connection dropped"),
)
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
