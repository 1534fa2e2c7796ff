"""What boto3 clients share: the threads that call one client, the data one process loads.

botocore keeps at most ``max_pool_connections`` HTTP connections per client (default 10); a thread
beyond that opens a connection and throws it away afterwards (urllib3's "Connection pool is
full"). Code that calls one client from several threads (the probes, the KCL-style lease mirror)
uses at most that many (:func:`pool_threads`). The sessions of one process share botocore's
data loader (:func:`share_data_loader`). No Airflow import.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

__all__ = ["DEFAULT_POOL_CONNECTIONS", "CallGate", "CallsStopped", "GatedClient", "gated", "pool_threads", "share_data_loader"]

if TYPE_CHECKING:  # the boto3 stubs (mypy-boto3-kinesis): annotations only
    from mypy_boto3_kinesis import KinesisClient

#: Threads when the client does not say how many connections it pools (botocore's default).
DEFAULT_POOL_CONNECTIONS = 10


def pool_threads(client: Any, tasks: int) -> int:
    """Threads to run ``tasks`` calls of ``client`` with: its ``max_pool_connections`` (or
    :data:`DEFAULT_POOL_CONNECTIONS`), at most ``tasks``, at least 1."""
    config = getattr(getattr(client, "meta", None), "config", None)
    pool_size = getattr(config, "max_pool_connections", None) or DEFAULT_POOL_CONNECTIONS
    return max(1, min(pool_size, tasks))


class CallsStopped(Exception):
    """Raised into a call through a :class:`CallGate` whose ``stop`` is set (e.g. the probes
    stop at the first record: ``core.probes.probe_ranges(until_record=True)``)."""


class CallGate:
    """Lets at most ``limit`` calls of a client shared by threads be in flight at once (botocore
    pools ``max_pool_connections`` connections; a call beyond them opens one and throws it away:
    "Connection pool is full", and thousands of threads would open thousands of connections),
    whatever the number of threads: the probes of a batch (``core.probes``), the readers of a
    Spark task (``job.read``). A caller that made its first call goes before callers that have
    not started, so the started ones finish first; with ``stop`` set, a call raises
    :class:`CallsStopped` instead.

    A finished call wakes one waiting caller (a started one if any waits), not every thread: at
    256 shards there are 80 probe threads, and waking them all after each call cost more CPU
    than the calls themselves."""

    def __init__(self, limit: int, stop: threading.Event | None = None) -> None:
        self.limit = max(1, limit)
        self.stop = stop or threading.Event()
        self._lock = threading.Lock()
        self._started_turn = threading.Condition(self._lock)  # callers that made their first call
        self._first_turn = threading.Condition(self._lock)  # callers that have not
        self._in_flight = 0
        self._continuing = 0  # started callers waiting for a connection

    @contextmanager
    def call(self, first: bool) -> Iterator[None]:
        with self._lock:
            if first:
                while self._in_flight >= self.limit or self._continuing:
                    self._first_turn.wait()
            else:
                self._continuing += 1
                try:
                    while self._in_flight >= self.limit:
                        self._started_turn.wait()
                finally:
                    self._continuing -= 1
            if self.stop.is_set():
                self._wake()  # each stopped caller wakes the next, until all waiting ones left
                raise CallsStopped()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._wake()

    def _wake(self) -> None:
        """Hand a free connection to one waiting caller, a started one first (the lock is held)."""
        (self._started_turn if self._continuing else self._first_turn).notify()


def gated(client: KinesisClient, gate: CallGate) -> KinesisClient:
    """``client`` as one caller sees it through ``gate`` (:class:`GatedClient`), typed as the
    client it wraps: a :class:`GatedClient` answers every attribute of that client, its API calls
    through the gate."""
    return cast("KinesisClient", GatedClient(client, gate))


class GatedClient:
    """One caller's view of the shared client (a probe's, a reader's): each API call passes the
    :class:`CallGate`; ``exceptions``, ``meta`` and private attributes are the client's."""

    def __init__(self, client: Any, gate: CallGate) -> None:
        self._client = client
        self._gate = gate
        self._started = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name.startswith("_") or name in ("exceptions", "meta") or not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            first, self._started = not self._started, True
            with self._gate.call(first):
                return attribute(*args, **kwargs)

        return call


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
