"""What boto3 clients share: the threads that call one client, the data one process loads.

botocore keeps at most ``max_pool_connections`` HTTP connections per client (default 10); a thread
beyond that opens a connection and throws it away afterwards (urllib3's "Connection pool is
full"). Code that calls one client from several threads (the probes, the KCL-style lease mirror)
uses at most that many (:func:`pool_threads`). The sessions of one process share botocore's
data loader (:func:`share_data_loader`). No Airflow import.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["DEFAULT_POOL_CONNECTIONS", "pool_threads", "share_data_loader"]

#: Threads when the client does not say how many connections it pools (botocore's default).
DEFAULT_POOL_CONNECTIONS = 10


def pool_threads(client: Any, tasks: int) -> int:
    """Threads to run ``tasks`` calls of ``client`` with: its ``max_pool_connections`` (or
    :data:`DEFAULT_POOL_CONNECTIONS`), at most ``tasks``, at least 1."""
    config = getattr(getattr(client, "meta", None), "config", None)
    pool_size = getattr(config, "max_pool_connections", None) or DEFAULT_POOL_CONNECTIONS
    return max(1, min(pool_size, tasks))


#: botocore's data loaders, one per data path (``AWS_DATA_PATH``), shared by the sessions of this
#: process (:func:`share_data_loader`).
_DATA_LOADERS: dict[str, Any] = {}
_DATA_LOADERS_LOCK = threading.Lock()


def share_data_loader(session: Any) -> Any:
    """Give the boto3 ``session`` the data loader of the first session this process shared one
    for, with the same data path; returns ``session``.

    botocore reads its data files (``endpoints.json``, about 1 MB, the endpoint rule sets, each
    service's model) once per loader, and every boto3 session brings a loader of its own: each
    new session parsed them again (the hooks' sessions of every operator run; the Spark job's
    session in every task of a reused Python worker). The files are read-only data, the same for
    every credential and region, and botocore caches what it loaded on the loader.
    """
    core = session._session  # boto3 keeps its botocore session there
    path = str(core.get_config_variable("data_path"))
    with _DATA_LOADERS_LOCK:
        loader = _DATA_LOADERS.setdefault(path, core.get_component("data_loader"))
    core.register_component("data_loader", loader)
    return session
