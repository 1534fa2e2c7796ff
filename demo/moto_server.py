"""moto's server (``moto_server``) with a listen backlog for many connections at once.

werkzeug's development server, which moto runs, listens with a backlog of 128 connections: a
Spark job whose readers open a connection each (256 shard ranges: 256 at once) overflows it, and
Linux drops the connections beyond it; their callers send again after 1 s (TCP's retransmission
timeout). ``python demo/moto_server.py -H 127.0.0.1 -p PORT`` takes moto_server's arguments.
"""

from __future__ import annotations

import sys

import werkzeug.serving
from moto.server import main

#: Connections the listening socket queues before they are accepted (Linux caps it at
#: ``net.core.somaxconn``, 4096 by default).
LISTEN_BACKLOG = 1024

if __name__ == "__main__":
    werkzeug.serving.BaseWSGIServer.request_queue_size = LISTEN_BACKLOG
    sys.exit(main())
