"""An HTTP proxy on 127.0.0.1 in front of an AWS emulator, for tests and benchmarks to stand
between the provider and the emulator (inject faults, enforce service limits).

Subclasses override :meth:`ForwardingProxy.handle`; :meth:`forward` passes a request upstream,
:meth:`answer` and :meth:`answer_error` reply as the AWS JSON protocols do.
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

__all__ = ["ForwardingProxy"]


class _Server(ThreadingHTTPServer):
    """A thread per connection, like http.server's; with a listen backlog for many callers at once.

    socketserver listens with a backlog of 5: when a Spark job's readers open their connections
    together (a thread per shard range), Linux drops the connections beyond the backlog and the
    callers send again after 1 s, then 3 s (TCP's retransmission timeout): reads of a few shards
    took a second or two more than the others.
    """

    daemon_threads = True
    request_queue_size = 1024


class ForwardingProxy:
    """Start with :meth:`start`; ``endpoint`` is its URL.

    :param upstream: the emulator's URL (``http://127.0.0.1:PORT``).
    :param keep_alive: keep one connection to the emulator per serving thread (that is, per
        client connection) instead of opening one per request, for an emulator that keeps
        connections open (kinesalite). moto's server (werkzeug's) closes every connection after
        its answer, so each call to moto still opens one. A request whose reused connection
        turns out closed before an answer came is sent once more on a new one.
    """

    def __init__(self, upstream: str, *, keep_alive: bool = False) -> None:
        self.upstream = urlparse(upstream)
        self.lock = threading.Lock()
        self.keep_alive = keep_alive
        self._connections = threading.local()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # An answer is written as headers, then body: with Nagle's algorithm on, the body
            # waits for the client's delayed acknowledgement of the headers (up to 40 ms on
            # Linux) on every kept-alive connection.
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                target = self.headers.get("X-Amz-Target", "")
                proxy.handle(self, body, target)

            do_GET = do_POST  # noqa: N815

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> ForwardingProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ForwardingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def handle(self, request: BaseHTTPRequestHandler, body: bytes, target: str) -> None:
        """Answer one request; ``target`` is its ``X-Amz-Target`` (``Service.Operation``)."""
        self.answer(request, *self.forward(request, body))

    def forward(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send the request upstream; returns its status, headers and body."""
        return self.call_upstream(request.command, request.path, body, dict(request.headers.items()))

    def call_upstream(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection", "content-length")}
        kept = getattr(self._connections, "conn", None) if self.keep_alive else None
        conn = kept or http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=120)
        self._connections.conn = None  # held by this call; kept again only after a whole answer
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            answer = response.status, response.getheaders(), response.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            conn.close()
            if kept is None:
                raise
            return self.call_upstream(method, path, body, headers)  # the kept connection had been closed
        except BaseException:
            conn.close()
            raise
        if self.keep_alive:
            self._connections.conn = conn
        else:
            conn.close()
        return answer

    @staticmethod
    def answer(request: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
        request.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                request.send_header(name, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    @staticmethod
    def answer_error(request: BaseHTTPRequestHandler, status: int, code: str, message: str, dynamodb: bool = False) -> None:
        """An error reply in the AWS JSON protocol (``__type`` and ``message``)."""
        kind = f"com.amazonaws.dynamodb.v20120810#{code}" if dynamodb else code
        payload = json.dumps({"__type": kind, "message": message}).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/x-amz-json-1.0" if dynamodb else "application/x-amz-json-1.1")
        request.send_header("x-amzn-ErrorType", code)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)
