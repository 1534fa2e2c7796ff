"""A fault-injecting HTTP proxy in front of an AWS emulator, for the reliability suite.

It forwards every request to the upstream emulator and, with a seeded probability per request,
answers as the service does when it is overloaded or failing instead:

* Kinesis: ``ProvisionedThroughputExceededException`` or ``KMSThrottlingException`` (HTTP 400),
  ``InternalFailure`` (500), ``ServiceUnavailable`` (503), or a dropped connection (the client's
  socket error) -- all before forwarding, as a throttled or failed read.
* DynamoDB: ``ThrottlingException``, ``ProvisionedThroughputExceededException`` or
  ``TransactionConflictException`` (400) before forwarding; and for writes, an ``InternalServerError``
  (500) *after* forwarding: the write applied but the client cannot know (an ambiguous outcome).

Counts of what it injected are kept per fault kind. Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

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
    (400, "TransactionConflictException", "injected transaction conflict"),
)
DYNAMODB_WRITES = ("PutItem", "UpdateItem", "DeleteItem")


class FaultProxy:
    """Start with :meth:`start`; ``endpoint`` is its URL; ``rate`` may be changed at any time.

    :param upstream: the emulator's URL (``http://127.0.0.1:PORT``).
    :param rate: probability of a fault per request, 0..1.
    :param seed: of the fault sequence.
    """

    def __init__(self, upstream: str, rate: float = 0.0, seed: int = 0) -> None:
        self.upstream = urlparse(upstream)
        self.rate = rate
        self.random = random.Random(seed)
        self.lock = threading.Lock()
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
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                proxy.handle(self)

            do_GET = do_POST  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FaultProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def _draw(self, faults: tuple) -> tuple | None:
        with self.lock:
            self.requests += 1
            if self.random.random() >= self.rate:
                return None
            return self.random.choice(faults)

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        target = request.headers.get("X-Amz-Target", "")
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
            self._answer_error(request, 400, "ExpiredIteratorException", "Iterator expired", False)
            return
        if hold is not None:
            if hold[2] == "after":
                self._forward(request, body)
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
            self._answer_error(request, status, code, message, is_dynamodb)
            return
        status, headers, payload = self._forward(request, body)
        if after:
            self.injected["ambiguous:" + operation] += 1
            self._answer_error(request, 500, "InternalServerError", "injected failure after the write applied", True)
            return
        request.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                request.send_header(name, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    def _coin(self) -> bool:
        with self.lock:
            return self.random.random() < 0.5

    def _forward(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "connection")}
            conn.request(request.command, request.path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()

    @staticmethod
    def _answer_error(request: BaseHTTPRequestHandler, status: int, code: str, message: str, dynamodb: bool) -> None:
        kind = f"com.amazonaws.dynamodb.v20120810#{code}" if dynamodb else code
        payload = json.dumps({"__type": kind, "message": message}).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/x-amz-json-1.0" if dynamodb else "application/x-amz-json-1.1")
        request.send_header("x-amzn-ErrorType", code)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)
