"""``DescribeStreamSummary`` shared by the sensors and triggers of a host: a summary cache and a pacer.

``DescribeStreamSummary`` "has a limit of 20 transactions per second per account" (Kinesis API
reference, DescribeStreamSummary), whatever the stream: every sensor and trigger of a deployment
draws on one budget. A :class:`SummaryBudget` keeps them under it on one host:

* **cache**: a stream's summary, once asked, answers every caller of the host that can take it
  that old (``max_age``: seconds; the stream's status a few seconds, its retention period
  minutes: it changes only by ``IncreaseStreamRetentionPeriod`` / ``DecreaseStreamRetentionPeriod``);
* **pacer**: calls that do reach the service start at least ``1 / calls_per_second`` apart per
  endpoint (region), a reservation made under the state's lock (GCRA: each call takes the next
  free slot and waits for it), so bursts are spread, never refused.

The state (cached summaries, the pacer's next free slot) lives in one small JSON file under
``state_dir``, read and written under an exclusive ``flock`` of a lock file, so every process of
the host that uses the same directory shares it: the sensors' worker processes, each in its own
process (and, in ``reschedule`` mode, a new process per poke), and the triggerer's event loop.
Processes on other hosts (other workers, pods of the KubernetesExecutor) have budgets of their
own: ``calls_per_second`` is per host, so hosts x ``calls_per_second`` must stay under the
account's 20 (the default, 10, leaves room for two hosts and for the operators' and other
applications' occasional calls). A call the service refuses all the same
(``LimitExceededException``) is retried by botocore's retry handler, in every retry mode
(legacy: Kinesis' ``LimitExceededException`` policy in botocore's ``_retry.json``; standard and
adaptive: a throttling error code), sync and async alike.

The cached and paced calls are made by the drivers (``shards.describe_stream_summary`` with a
boto3 client, ``aio.describe_stream_summary`` with an aiobotocore one); this module decides and
keeps the state. No Airflow import.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "DESCRIBE_STREAM_SUMMARY_LIMIT",
    "DEFAULT_CALLS_PER_SECOND",
    "STATUS_MAX_AGE_S",
    "RETENTION_MAX_AGE_S",
    "SummaryBudget",
    "default_state_dir",
]

#: DescribeStreamSummary: 20 transactions per second per account (Kinesis API reference).
DESCRIBE_STREAM_SUMMARY_LIMIT = 20
#: Calls per second one host makes at most by default: half the account's limit.
DEFAULT_CALLS_PER_SECOND = 10.0
#: How old a stream's status may be for the resharding sensor and trigger (seconds).
STATUS_MAX_AGE_S = 5.0
#: How old a stream's retention period may be for the retention guard (seconds).
RETENTION_MAX_AGE_S = 300.0
#: How old a summary may be for its ``StreamARN`` (seconds): a stream's name, account and region
#: fix its ARN (Kinesis API reference, ARN format), so any summary kept in the state file will do.
ARN_MAX_AGE_S = 3600.0
#: Summaries older than this are dropped from the state file (seconds).
_KEEP_S = 3600.0
#: A pacer slot further ahead than this is not from this boot (the monotonic clock restarted): reset.
_MAX_AHEAD_S = 120.0
_STATE_FILE = "describe-stream-summary.json"
_LOCK_FILE = "describe-stream-summary.lock"
_local_lock = threading.Lock()
_memory_state: dict[str, Any] = {}
_WARNED: set[str] = set()


def default_state_dir() -> str:
    """``<system temp dir>/airflow-kinesis-spark-<uid>``: one per user of the host."""
    return os.path.join(tempfile.gettempdir(), f"airflow-kinesis-spark-{os.getuid()}")


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"__datetime__": value.isoformat()}
    raise TypeError(f"not JSON: {type(value).__name__}")


def _decode(obj: dict[str, Any]) -> Any:
    return datetime.fromisoformat(obj["__datetime__"]) if set(obj) == {"__datetime__"} else obj


@dataclass(frozen=True)
class SummaryBudget:
    """The host's share of the account's ``DescribeStreamSummary`` budget, and its summary cache.

    :param calls_per_second: calls this host starts per second at most, per endpoint (region);
        > 0. The account allows 20 (:data:`DESCRIBE_STREAM_SUMMARY_LIMIT`) for all its hosts.
    :param state_dir: the directory of the shared state (created with mode 0700; it must belong
        to this user and be closed to others); ``None``: :func:`default_state_dir`. A directory
        that cannot be used leaves the state in this process only (logged once).
    :param principal: who asks (e.g. the connection id and role): part of the cache's key, so
        streams of one name in two accounts never share a summary. The pacer is per endpoint
        whatever the principal, which keeps every account of the host under its limit.
    :raises ValueError: ``calls_per_second`` not > 0.
    """

    calls_per_second: float = DEFAULT_CALLS_PER_SECOND
    state_dir: str | None = None
    principal: str = ""

    def __post_init__(self) -> None:
        if not self.calls_per_second > 0:
            raise ValueError(f"describe_stream_summary_per_second must be > 0; got {self.calls_per_second!r}")

    # -- keys ------------------------------------------------------------------------------------

    @staticmethod
    def _endpoint(client: Any) -> str:
        meta = getattr(client, "meta", None)
        return f"{getattr(meta, 'endpoint_url', '')}|{getattr(meta, 'region_name', '')}"

    def _stream_key(self, client: Any, stream: str) -> str:
        return f"{self.principal}|{self._endpoint(client)}|{stream}"

    # -- the state -------------------------------------------------------------------------------

    @contextmanager
    def _state(self, write: bool = True) -> Iterator[dict[str, Any]]:
        """The shared state, locked for the block (threads by a lock, processes by ``flock``);
        written back after it unless ``write`` is false (a block that only reads)."""
        directory = self.state_dir or default_state_dir()
        with _local_lock:
            try:
                import fcntl

                os.makedirs(directory, mode=0o700, exist_ok=True)
                info = os.lstat(directory)
                if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
                    raise PermissionError(f"{directory} must be a directory of this user, closed to others (mode 0700)")
                lock = os.open(os.path.join(directory, _LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
            except (OSError, ImportError) as err:
                if directory not in _WARNED:
                    _WARNED.add(directory)
                    log.warning("DescribeStreamSummary budget shared in this process only: %s", err)
                yield _memory_state
                return
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                path = os.path.join(directory, _STATE_FILE)
                try:
                    with open(path, encoding="utf-8") as file:
                        state = json.load(file, object_hook=_decode)
                    if not isinstance(state, dict):
                        state = {}
                except (OSError, ValueError):
                    state = {}  # none yet, or left half written by a process that died
                yield state
                if not write:
                    return
                temporary = f"{path}.{os.getpid()}.{threading.get_ident()}"
                with open(temporary, "w", encoding="utf-8") as file:
                    json.dump(state, file, default=_encode)
                os.replace(temporary, path)
            finally:
                os.close(lock)  # releases the flock

    # -- decisions ---------------------------------------------------------------------------------

    def reserve(self, client: Any, stream: str, max_age: float) -> tuple[dict[str, Any] | None, float]:
        """Before a call: a cached summary at most ``max_age`` seconds old, or a slot of the pacer.

        :returns: ``(summary, 0.0)`` from the cache; else ``(None, delay)``: call the service
            after ``delay`` seconds (then :meth:`cached` again, and :meth:`remember` the answer).
        """
        now = time.monotonic()
        with self._state() as state:
            summary = self._fresh(state, client, stream, max_age, now)
            if summary is not None:
                return summary, 0.0
            slots = state.setdefault("next_slot", {})
            key = self._endpoint(client)
            slot = float(slots.get(key, now))
            if slot < now or slot > now + _MAX_AHEAD_S:
                slot = now
            slots[key] = slot + 1.0 / self.calls_per_second
            return None, slot - now

    def cached(self, client: Any, stream: str, max_age: float) -> dict[str, Any] | None:
        """A summary of ``stream`` at most ``max_age`` seconds old, or ``None``."""
        if max_age <= 0:
            return None
        with self._state(write=False) as state:
            return self._fresh(state, client, stream, max_age, time.monotonic())

    def remember(self, client: Any, stream: str, summary: dict[str, Any]) -> None:
        """Keep ``summary`` (``StreamDescriptionSummary``) for every caller of the host."""
        now = time.monotonic()
        with self._state() as state:
            summaries = state.setdefault("summaries", {})
            for key in [k for k, v in summaries.items() if not 0 <= now - float(v.get("at", 0)) <= _KEEP_S]:
                del summaries[key]
            summaries[self._stream_key(client, stream)] = {"at": now, "summary": summary}

    def _fresh(self, state: dict[str, Any], client: Any, stream: str, max_age: float, now: float) -> dict[str, Any] | None:
        entry = state.get("summaries", {}).get(self._stream_key(client, stream))
        if not entry:
            return None
        age = now - float(entry.get("at", 0))
        return dict(entry["summary"]) if 0 <= age <= max_age else None
