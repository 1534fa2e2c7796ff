"""moto's server (``moto_server``) made fit for many calls at once; takes moto_server's arguments:
``python demo/moto_server.py -H 127.0.0.1 -p PORT``.

Two changes to how moto serves, neither to what it answers:

* **A listen backlog of 1024 connections.** werkzeug's development server, which moto runs,
  listens with a backlog of 128: a Spark job whose readers open a connection each (256 shard
  ranges: 256 at once) overflows it, and Linux drops the connections beyond it; their callers
  send again after 1 s (TCP's retransmission timeout).
* **moto's list of its service packages read once.** moto's dispatcher asks, twice for every
  request, whether the request's host names one of its packages; each time it lists its
  package directory and checks each of its ~180 entries is a directory
  (``moto.backends.list_of_moto_modules``, moto 5.2). That was about half of moto's CPU per
  call (a ``GetShardIterator`` took 2.5 ms of CPU, 1.2 to 1.5 ms with the list kept), and the
  emulator shares the machine's cores with the provider it serves: at 256 shards the
  benchmarks measured the emulator more than the provider. The installed packages do not
  change while the server runs.
"""

from __future__ import annotations

import werkzeug.serving
from moto import backends
from moto.server import main

#: Connections the listening socket queues before they are accepted (Linux caps it at
#: ``net.core.somaxconn``, 4096 by default).
LISTEN_BACKLOG = 1024


def serve(argv: list[str] | None = None) -> None:
    """Run moto's server with the changes above until it is stopped."""
    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules  # moto's dispatcher calls it through the module
    werkzeug.serving.BaseWSGIServer.request_queue_size = LISTEN_BACKLOG
    main(argv)


if __name__ == "__main__":
    serve()
