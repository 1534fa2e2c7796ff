"""How many calls one boto3 client serves at once: the threads that share it.

botocore keeps at most ``max_pool_connections`` HTTP connections per client (default 10); a thread
beyond that opens a connection and throws it away afterwards (urllib3's "Connection pool is
full"). Code that calls one client from several threads (the probes, the KCL-style lease mirror)
uses at most that many. No Airflow import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_POOL_CONNECTIONS", "pool_threads"]

#: Threads when the client does not say how many connections it pools (botocore's default).
DEFAULT_POOL_CONNECTIONS = 10


def pool_threads(client: Any, tasks: int) -> int:
    """Threads to run ``tasks`` calls of ``client`` with: its ``max_pool_connections`` (or
    :data:`DEFAULT_POOL_CONNECTIONS`), at most ``tasks``, at least 1."""
    config = getattr(getattr(client, "meta", None), "config", None)
    pool_size = getattr(config, "max_pool_connections", None) or DEFAULT_POOL_CONNECTIONS
    return max(1, min(pool_size, tasks))
