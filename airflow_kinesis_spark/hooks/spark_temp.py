"""The runners' private temporary directories (``kinesis-batch-<batch id>-<random>``), the owner
file that names the process using one, and the sweep that removes what killed runs left behind.

* :func:`make_batch_temp_dir` / :func:`batch_temp_dir`: a new directory, owned by this process
  (or the detached job's); the context manager removes it when the block ends.
* :func:`sweep_leftover_temp_dirs`: removes the directories whose owner no longer runs (or that
  nothing changed for a day), and a failed detached job's once its consumer committed past it;
  ``hooks.spark.SparkJob`` runs it when a run starts, the deferrable operator after a commit.

Log lines keep the logger of ``hooks.spark`` (``airflow_kinesis_spark.hooks.spark``), where they
were written before this module held them. The runners use this module; it imports neither.
No Airflow import.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from airflow_kinesis_spark.core.names import stream_name_of

# The logger of ``hooks.spark``, where these lines were written before this module held them:
# logging configurations and readers of the task log filter on it.
log = logging.getLogger("airflow_kinesis_spark.hooks.spark")

__all__ = [
    "TEMP_DIR_PREFIX",
    "TEMP_DIR_OWNER_FILE",
    "TEMP_DIR_MAX_AGE",
    "sweep_leftover_temp_dirs",
    "consumer_key",
    "make_batch_temp_dir",
    "batch_temp_dir",
]

#: Name prefix of the runners' private temporary directories: ``kinesis-batch-<batch id>-<random>``.
TEMP_DIR_PREFIX = "kinesis-batch-"
#: File in each temporary directory naming the process that uses it (JSON: host, pid, start time).
TEMP_DIR_OWNER_FILE = "owner.json"
#: Seconds after which a left-over temporary directory whose owner cannot be checked (no owner
#: file, another host) is removed, and how long a failed detached job's log is kept.
TEMP_DIR_MAX_AGE = 24 * 3600.0


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/PID/stat`` field 22), or
    ``None`` where ``/proc`` does not say (not Linux, or no such process): with the pid, it names
    one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _write_owner(directory: str, pid: int, **about: Any) -> None:
    """Name process ``pid`` of this host as the user of ``directory`` (:data:`TEMP_DIR_OWNER_FILE`),
    keeping what the file says of the batch (``consumer``, ``batch_id``) unless ``about`` sets it."""
    target = os.path.join(directory, TEMP_DIR_OWNER_FILE)
    try:
        with open(target, encoding="utf-8") as fh:
            kept = {k: v for k, v in json.load(fh).items() if k in ("consumer", "batch_id")}
    except (OSError, ValueError, AttributeError):
        kept = {}
    owner = {**kept, **about, "host": socket.gethostname(), "pid": pid, "started": _process_start(pid)}
    with open(target + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(owner, fh)
    os.replace(target + ".tmp", target)


def _owner_alive(directory: str) -> bool | None:
    """Whether the process named in ``directory``'s owner file still runs: ``True``/``False``, or
    ``None`` when that cannot be told (no readable owner file, or a process of another host)."""
    try:
        with open(os.path.join(directory, TEMP_DIR_OWNER_FILE), encoding="utf-8") as fh:
            owner = json.load(fh)
        pid, host, started = int(owner["pid"]), owner["host"], owner.get("started")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user has the pid: it runs
    if started is not None and _process_start(pid) not in (None, started):
        return False  # the pid now names another process
    return True


def _committed_past(directory: str, committed: Mapping[str, int] | None) -> bool:
    """Whether ``directory``'s owner file names a (stream/consumer, batch id) that ``committed``
    (``"stream/consumer"`` -> its committed batch id) has committed, or passed."""
    if not committed:
        return False
    try:
        with open(os.path.join(directory, TEMP_DIR_OWNER_FILE), encoding="utf-8") as fh:
            owner = json.load(fh)
        return int(owner["batch_id"]) <= committed[owner["consumer"]]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def sweep_leftover_temp_dirs(
    temp_dir: str | None = None, *, max_age: float = TEMP_DIR_MAX_AGE, committed: Mapping[str, int] | None = None
) -> list[str]:
    """Remove the runners' temporary directories that runs killed with ``SIGKILL`` left behind.

    Only directories of ``temp_dir`` (default: :func:`tempfile.gettempdir`) named
    ``kinesis-batch-*`` (:data:`TEMP_DIR_PREFIX`), owned by this user, are looked at; one is removed when

    * its owner file names a process of this host that no longer runs (``os.kill(pid, 0)``, and
      the process's start time where ``/proc`` gives it, so a reused pid does not count), unless it
      holds a failed detached job's ``spark-submit.log`` younger than ``max_age``; or
    * its owner cannot be checked (no owner file: directories of earlier versions; another host
      sharing the directory) and nothing in it changed for ``max_age`` seconds.

    A failed detached job's directory also goes, whatever its age, once its consumer has
    committed its batch or a later one (``committed``: ``"stream/consumer"`` -> committed batch
    id, as the commit that just succeeded knows it): a later commit is proof nothing can still use it.

    A directory whose owner runs is never removed. Errors are logged, never raised.

    :returns: the paths removed.
    """
    base = temp_dir or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(TEMP_DIR_PREFIX)]
    except OSError as err:
        log.warning("Could not list %s for left-over temporary directories: %s", base, err)
        return removed
    now = time.time()
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            alive = _owner_alive(entry.path)
            if alive:
                continue
            age = now - max(entry.stat(follow_symlinks=False).st_mtime, _newest_mtime(entry.path))
            keep_log = alive is False and os.path.exists(os.path.join(entry.path, "spark-submit.log")) \
                and not _committed_past(entry.path, committed)  # fmt: skip
            if (alive is None or keep_log) and age < max_age:
                continue
            shutil.rmtree(entry.path)
            removed.append(entry.path)
        except FileNotFoundError:
            continue  # removed meanwhile (its run ended, or another sweep)
        except OSError as err:
            log.warning("Could not remove left-over temporary directory %s: %s", entry.path, err)
    if removed:
        log.info("Removed %d temporary directories that killed runs left behind: %s", len(removed), ", ".join(removed))
    return removed


def _newest_mtime(directory: str) -> float:
    """The newest modification time of ``directory``'s direct entries (0 when it is empty)."""
    newest = 0.0
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except FileNotFoundError:
                continue
    return newest


def consumer_key(stream_name: str, consumer_name: str) -> str:
    """``"{stream}/{consumer}"``: how a temporary directory names its batch's consumer."""
    return f"{stream_name_of(stream_name)}/{consumer_name}"


def make_batch_temp_dir(batch_id: int | str, pid: int | None = None, *, consumer: str | None = None) -> str:
    """A new private temporary directory ``kinesis-batch-<batch_id>-*`` owned by process ``pid``
    (default: this one). The caller removes it; what killed runs left behind is removed when the
    next run starts (:class:`SparkJob`, :func:`sweep_leftover_temp_dirs`).

    :param consumer: ``"stream/consumer"`` of the batch: recorded, so a later commit of the
        consumer removes a failed job's directory (:func:`sweep_leftover_temp_dirs`).
    """
    directory = tempfile.mkdtemp(prefix=f"{TEMP_DIR_PREFIX}{batch_id}-")
    about = {"consumer": consumer, "batch_id": batch_id} if consumer else {}
    _write_owner(directory, os.getpid() if pid is None else pid, **about)
    return directory


@contextmanager
def batch_temp_dir(batch_id: int | str) -> Iterator[str]:
    """:func:`make_batch_temp_dir`, removed when the block ends, whether it succeeded or failed
    (a run killed with ``SIGKILL`` leaves it to the next run's sweep)."""
    directory = make_batch_temp_dir(batch_id)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
