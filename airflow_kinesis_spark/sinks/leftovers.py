"""Leftovers under an output's batch root: files and folders that no committed reference holds
and that nothing can still use (``kinesis-spark leftovers``; docs/maintenance.md).

Retried and superseded attempts of a batch (table outputs write each plan's attempt into its
own ``batch_id=N-{plan_id}`` folder), drivers killed while writing (their
``_staging/{name}-{digest}`` folders) and window re-runs (each run of a table window writes its
own ``window={label}/run=...`` folder) leave files that no committed snapshot, version or
committed record references. This module finds them and removes them.

**References** (never removed, whatever else holds):

- Iceberg: every data and delete file of every snapshot still in the table's metadata (time
  travel keeps them; expiring snapshots is Iceberg's own maintenance, after which the files only
  the expired snapshots held become leftovers here).
- Delta: every path of an ``add`` (and ``remove``) action in every commit and checkpoint file
  still in ``_delta_log``, and the current version's files (removed but not vacuumed files are
  ``vacuum``'s business).
- Parquet: every file a committed record ``_committed/batch_id=N/manifest`` lists.

**Leftovers** (only under the sink's batch root, and only where nothing can still use them):

- in a batch folder ``batch_id=N`` or ``batch_id=N-{plan_id}`` whose batch id is at most the
  latest batch the output has committed (a later committed batch is proof the attempt is
  dead): a table's folder none of whose files is referenced, as a whole; otherwise the
  unreferenced data files (and their ``.crc`` checksum files) of a folder that holds
  referenced ones. A Parquet batch folder without a committed record is kept (a batch
  committed before committed records existed has none; docs/output.md), and so is the
  ``_quarantine`` folder of a batch no other attempt of which is referenced (its dead letters
  may be the committed batch's);
- ``_staging/{name}-{digest}`` folders of such batches;
- table window run folders ``window={label}/run=...`` the table does not reference, and
  windows' staging folders, once nothing was written in them for ``min_age`` seconds (a window
  run is not fenced by batch ids: a run still writing or about to commit must not lose its
  files; its age is the only proof).

Never anything outside the batch root, never a batch beyond the latest committed one (the
pending batch's folder), never the owner record, ``_committed``, ``_delta_log`` or
``metadata``, nor files the table formats' own writers put elsewhere (compaction's).

No Airflow import.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote, urlparse

from airflow_kinesis_spark.core.job import STAGING_DIR
from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.core.locations import COMMITTED_DIR
from airflow_kinesis_spark.sinks.files import filesystem, table_uri

log = logging.getLogger(__name__)

__all__ = ["Leftover", "LeftoverScan", "DEFAULT_MIN_AGE_SECONDS", "scan_leftovers", "find_leftovers", "remove_leftovers",
           "sweep_staging", "staged_batch_id"]  # fmt: skip

#: How long nothing may have been written in a window run or a window's staging folder before it
#: counts as a leftover (seconds): a day, far beyond a window job's write and its table commit.
DEFAULT_MIN_AGE_SECONDS = 24 * 3600

#: A batch folder: ``batch_id=N`` (Parquet; tables of earlier versions) or ``batch_id=N-{plan_id}``
#: (``core.locations.batch_output_location``).
_BATCH = re.compile(r"^batch_id=(?P<batch>\d+)(?:-(?P<plan>[0-9a-f]{12}))?$")
#: A staging folder: ``{name}-{16 hex digits of the writer}`` (``core.job.staging_location``).
_STAGED = re.compile(r"^(?P<name>.+)-[0-9a-f]{16}$")
#: A table window's run folder: ``run={start time, no ':' or '-'}-{8 hex}`` (``core.window_run.run_window``).
_RUN = re.compile(r"^run=(?P<time>\d{8}T\d{6}(?:\.\d{3})?Z)-[0-9a-f]{8}$")
#: The quarantine (dead letters) folder of a batch (``sinks.spark_write.QUARANTINE_DIR``).
_QUARANTINE = "_quarantine"
#: Files and folders a leftover may never be, or be inside.
_NEVER = frozenset({COMMITTED_DIR, "_delta_log", "metadata", "_kinesis_spark_output.json"})
#: Concurrent reads of table metadata files (manifests, Delta log files).
_READERS = 16


@dataclass(frozen=True)
class Leftover:
    """A file or folder that can go.

    :param path: its location, in the scheme of the output root (``s3a://...``, a local path).
    :param size: bytes (a folder: the sum of its files).
    :param reason: why it is a leftover, for people.
    :param folder: a folder (removed with everything in it) or one file.
    """

    path: str
    size: int
    reason: str
    folder: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "reason": self.reason, "folder": self.folder}


@dataclass(frozen=True)
class LeftoverScan:
    """What :func:`scan_leftovers` found.

    :param root: the batch root scanned.
    :param format: the output format.
    :param latest_batch_id: the latest batch the output has committed (``None``: none found;
        then no batch folder or batch staging folder is a leftover).
    :param references: how many distinct files the committed references hold.
    :param leftovers: what can go, sorted by path.
    :param kept: what looks left over but is kept, with why (for people).
    """

    root: str
    format: str
    latest_batch_id: int | None
    references: int
    leftovers: tuple[Leftover, ...] = ()
    kept: tuple[str, ...] = field(default=())

    @property
    def total_size(self) -> int:
        """Bytes of all the leftovers."""
        return sum(item.size for item in self.leftovers)

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "format": self.format, "latest_batch_id": self.latest_batch_id, "references": self.references,
                "leftovers": [item.to_dict() for item in self.leftovers], "bytes": self.total_size, "kept": list(self.kept)}  # fmt: skip


def staged_batch_id(name: str) -> int | None:
    """The batch id of a staging folder's name (``batch_id=N[-{plan_id}]-{digest}``); ``None`` for
    any other name (a window's)."""
    staged = _STAGED.match(name)
    batch = _BATCH.match(staged["name"]) if staged else None
    return int(batch["batch"]) if batch else None


def _key(location: str) -> str:
    """A location as the file system's path: local paths absolute, ``s3*://b/k`` as ``b/k``."""
    parsed = urlparse(location)
    if parsed.scheme in ("s3", "s3a", "s3n"):
        return posixpath.normpath(parsed.netloc + parsed.path)
    path = parsed.path if parsed.scheme == "file" else location
    return os.path.abspath(path) if parsed.scheme in ("", "file") else location


def _root(sink: Any) -> str:
    root = (sink.batch_root or getattr(sink, "output_root", "") or sink.output_path or getattr(sink, "location", "")).rstrip("/")
    if not root:
        raise ValueError("the sink has no output root to look for leftovers in (build it with build_sink)")
    return root


# -- references -----------------------------------------------------------------------------


@dataclass
class _Committed:
    """The committed references of an output and the latest batch it has committed."""

    files: set[str] = field(default_factory=set)
    latest: int | None = None
    #: the output is known to be this root's: a commit of its (stream, consumer), or a reference under the root
    known: bool = False

    def saw_batch(self, batch_id: int | None) -> None:
        if batch_id is not None and (self.latest is None or batch_id > self.latest):
            self.latest = batch_id
            self.known = True


def _parquet_committed(root: str, storage_options: Mapping[str, str] | None) -> _Committed:
    """The committed records under ``root``: their files, and the latest batch id with one (one listing)."""
    from pyarrow import fs

    found = _Committed()
    filesys, base = filesystem(f"{root}/{COMMITTED_DIR}", storage_options)
    for item in filesys.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True)):
        parent = posixpath.basename(posixpath.dirname(item.path))
        match = _BATCH.match(parent)
        if item.type != fs.FileType.File or item.base_name != "manifest" or not match or match["plan"]:
            continue
        with filesys.open_input_stream(item.path) as src:
            found.files.update(_key(line) for line in src.read().decode().splitlines() if line.strip())
        found.saw_batch(int(match["batch"]))
    return found


def _iceberg_committed(sink: Any, stream: str | None, consumer: str | None) -> _Committed:
    """Every data and delete file of every snapshot in the table's metadata (pyiceberg's
    ``inspect.all_files``); the latest batch of (stream, consumer) in the snapshot summaries. One
    metadata load, so both are of one table version."""
    from airflow_kinesis_spark.sinks.iceberg import SUMMARY_BATCH, SUMMARY_CONSUMER, SUMMARY_STREAM

    found = _Committed()
    table = sink.load()
    if table is None:
        return found
    for snapshot in table.metadata.snapshots:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        batch = summary.get(SUMMARY_BATCH) or ""
        if stream and (summary.get(SUMMARY_STREAM), summary.get(SUMMARY_CONSUMER)) == (stream_name_of(stream), consumer) and batch.isdigit():
            found.saw_batch(int(batch))
    # Iceberg's all_files metadata table: the data and delete files of every snapshot's state (a
    # manifest entry marking a file deleted is not: the file is in no state of that snapshot).
    found.files.update(_key(path) for path in table.inspect.all_files().column("file_path").to_pylist())
    return found


def _delta_committed(sink: Any, stream: str | None, consumer: str | None) -> _Committed:
    """Every path of an add or remove action in the commits and checkpoints in ``_delta_log``, and
    the current version's files; the latest batch of (stream, consumer): its transaction's version
    and the batch ids of its commits. The table is loaded before the log is listed, so no batch
    counts as committed whose files the listing could miss."""
    import pyarrow.parquet as pq
    from pyarrow import fs

    from airflow_kinesis_spark.sinks.delta import app_id

    found = _Committed()
    table = sink.load()
    if table is None:
        return found
    if stream and consumer:
        found.saw_batch(table.transaction_version(app_id(stream_name_of(stream), consumer)))

    def add(path: str | None) -> None:
        if path:
            for text in {path, unquote(path)}:
                found.files.add(_key(text if "://" in text or text.startswith("/") else f"{sink.uri}/{text}"))

    import pyarrow as pa

    for path in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist():
        add(path)
    filesys, log_dir = filesystem(f"{sink.uri}/_delta_log", sink.storage_options)
    listed = [i for i in filesys.get_file_info(fs.FileSelector(log_dir, recursive=True, allow_not_found=True)) if i.type == fs.FileType.File]

    def read(item: Any) -> list[tuple[str, Any]]:
        actions: list[tuple[str, Any]] = []
        if item.base_name.endswith(".json"):
            with filesys.open_input_stream(item.path) as src:
                for line in src.read().decode().splitlines():
                    action = json.loads(line) if line.strip() else {}
                    actions += [(kind, value) for kind, value in action.items() if kind in ("add", "remove", "commitInfo")]
        elif item.base_name.endswith(".parquet"):  # checkpoints, their parts and sidecars
            with filesys.open_input_file(item.path) as src:
                data = pq.read_table(src)
            for kind in ("add", "remove"):
                if kind in data.column_names:
                    actions += [(kind, {"path": p}) for p in data.column(kind).combine_chunks().field("path").to_pylist() if p]
        return actions

    with ThreadPoolExecutor(_READERS) as pool:
        for actions in pool.map(read, listed):
            for kind, value in actions:
                if kind != "commitInfo":
                    add(value.get("path"))
                elif stream and (value.get("kinesis-spark.stream"), value.get("kinesis-spark.consumer")) == (
                        stream_name_of(stream), consumer) and str(value.get("kinesis-spark.batch-id") or "").isdigit():  # fmt: skip
                    found.saw_batch(int(value["kinesis-spark.batch-id"]))
    return found


def _committed(sink: Any, root: str, stream: str | None, consumer: str | None) -> _Committed:
    if sink.format == "iceberg":
        return _iceberg_committed(sink, stream, consumer)
    if sink.format == "delta":
        return _delta_committed(sink, stream, consumer)
    return _parquet_committed(root, sink.storage_options)


# -- the scan -------------------------------------------------------------------------------


@dataclass
class _Scan:
    filesys: Any
    base: str  # the batch root as the file system's path
    root: str  # the batch root as given
    format: str
    committed: _Committed
    min_age: float
    now: float
    local: bool  # a local file system (paths are made absolute), else an object store (bucket/key)
    leftovers: list[Leftover] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def uri(self, path: str) -> str:
        relative = posixpath.relpath(path, self.base)
        if relative.startswith("..") or relative == "." or any(part in _NEVER for part in relative.split("/")):
            raise RuntimeError(f"leftovers: {path} is not a removable place under {self.base}")  # a bug: refuse loudly
        return f"{self.root}/{relative}"

    def relative(self, path: str) -> str:
        return posixpath.relpath(path, self.base)

    def listing(self, path: str) -> list[Any]:
        from pyarrow import fs

        return list(self.filesys.get_file_info(fs.FileSelector(path, recursive=True, allow_not_found=True)))

    def children(self, path: str) -> list[Any]:
        from pyarrow import fs

        return list(self.filesys.get_file_info(fs.FileSelector(path, allow_not_found=True)))

    @property
    def referenced_by(self) -> str:
        return {"iceberg": "no snapshot", "delta": "no Delta version"}.get(self.format, "no committed record")

    def folder(self, info: Any, files: Sequence[Any], reason: str) -> None:
        size = sum(int(f.size or 0) for f in files if f.type == _file_type())
        self.leftovers.append(Leftover(self.uri(info.path), size, reason, folder=True))

    def file(self, info: Any, reason: str) -> None:
        self.leftovers.append(Leftover(self.uri(info.path), int(info.size or 0), reason))

    def referenced(self, files: Iterable[Any]) -> list[Any]:
        return [f for f in files if f.type == _file_type() and self.key(f.path) in self.committed.files]

    def key(self, path: str) -> str:
        """A listed path as :func:`_key` gives the references: a local one absolute; an object
        store's (``bucket/key``) as it is, never taken for a local path."""
        return os.path.abspath(path) if self.local else posixpath.normpath(path)

    def idle_seconds(self, info: Any, files: Sequence[Any], named: float | None = None) -> float:
        """Seconds since anything was last written in the folder (its newest file, the folder's
        own time, the time in its name)."""
        times = [t for t in [getattr(f, "mtime_ns", None) for f in [info, *files]] if t is not None]
        newest = max([t / 1e9 for t in times] + ([named] if named is not None else []), default=self.now)
        return self.now - newest


def _file_type() -> Any:
    from pyarrow import fs

    return fs.FileType.File


def _data_file(relative: str) -> bool:
    """A data file as Spark's file index and ``files.list_data_files`` see one: a ``.parquet``
    file outside ``.``-names and ``_``-names without ``=`` (``_quarantine``, ``_temporary``)."""
    parts = relative.split("/")
    return relative.endswith(".parquet") and not any(p.startswith(".") or (p.startswith("_") and "=" not in p) for p in parts)


def _age_text(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _unreferenced_files(scan: _Scan, folder: Any, files: Sequence[Any], what: str) -> None:
    """The unreferenced data files of a folder that holds referenced ones, and their ``.crc`` files."""
    names = {f.path for f in files if f.type == _file_type()}
    for item in files:
        if item.type != _file_type() or not _data_file(posixpath.relpath(item.path, folder.path)):
            continue
        if scan.key(item.path) in scan.committed.files:
            continue
        scan.file(item, f"{what}: {scan.referenced_by} references this file (its folder's other files are referenced)")
        crc = posixpath.join(posixpath.dirname(item.path), f".{item.base_name}.crc")
        if crc in names:
            scan.file(next(f for f in files if f.path == crc), f"checksum of leftover {item.base_name}")


def _batch_folders(scan: _Scan, folders: Sequence[Any]) -> None:
    latest = scan.committed.latest
    by_batch: dict[int, list[tuple[Any, list[Any]]]] = {}
    for info in folders:
        match = _BATCH.match(info.base_name)
        assert match is not None, "only batch folders are passed (the scan's listing)"
        batch = int(match["batch"])
        if latest is None or batch > latest:
            continue  # the pending batch (or a later one): a live run may be writing it
        by_batch.setdefault(batch, []).append((info, scan.listing(info.path)))
    expected = sum(1 for path in scan.committed.files if _BATCH.match(posixpath.relpath(path, scan.base).split("/", 1)[0]))
    found = sum(len(scan.referenced(files)) for attempts in by_batch.values() for _, files in attempts)
    if expected and not found:  # an independent check of the path comparison: never remove what it cannot see
        raise RuntimeError(f"{scan.root}: the output references {expected} files in its batch folders, but listing them found "
                           "none of them: the paths do not compare, or the files are gone. Nothing was removed.")  # fmt: skip
    for batch, attempts in sorted(by_batch.items()):
        any_referenced = any(scan.referenced(files) for _, files in attempts)
        for info, files in attempts:
            what = f"batch {batch}" + (f", plan {info.base_name.split('-', 1)[1]}" if "-" in info.base_name else "")
            if scan.referenced(files):
                _unreferenced_files(scan, info, files, what)
            elif scan.format == "parquet":
                scan.kept.append(f"{scan.relative(info.path)}: batch {batch} has no committed record; a batch committed before "
                                 "committed records existed has none either (check it with DynamoDB; docs/output.md)")  # fmt: skip
            elif any(_QUARANTINE in scan.relative(f.path).split("/") for f in files) and not any_referenced:
                scan.kept.append(f"{scan.relative(info.path)}/{_QUARANTINE}: dead letters of batch {batch}, which may be the "
                                 "committed batch's (it had no other rows); its data files, if any, are leftovers")  # fmt: skip
                _unreferenced_files(scan, info, files, what)
            else:
                scan.folder(info, files, f"{what}: {scan.referenced_by} references its files; batch {latest} is committed")


def _staging_folders(scan: _Scan, staging: Any, window: str | None = None) -> None:
    latest = scan.committed.latest
    for info in scan.children(staging.path):
        if info.type != _file_type() and _STAGED.match(info.base_name):
            files = scan.listing(info.path)
            if scan.referenced(files):
                continue  # never: whatever put a referenced file there
            batch = staged_batch_id(info.base_name)
            if batch is not None:
                if latest is not None and batch <= latest:
                    scan.folder(info, files, f"staging of batch {batch} (killed or superseded driver); batch {latest} is committed")
                continue
            idle = scan.idle_seconds(info, files)
            if idle >= scan.min_age:
                scan.folder(info, files, f"staging of {window or 'a window'} (killed driver); idle {_age_text(idle)}")


def _window_folder(scan: _Scan, window: Any) -> None:
    for info in scan.children(window.path):
        if info.type == _file_type():
            continue
        if info.base_name == STAGING_DIR:
            _staging_folders(scan, info, window.base_name)
            continue
        run = _RUN.match(info.base_name)
        if scan.format == "parquet" or not run:
            continue  # a Parquet window's own output, or something this module does not know
        if not scan.committed.known:
            scan.kept.append(f"{scan.relative(info.path)}: the table references no file under {scan.root} and holds no commit "
                             "of its stream and consumer: it may not be this root's table (check the table and catalog), so "
                             "no window run is compared with it")  # fmt: skip
            continue
        files = scan.listing(info.path)
        named = datetime.strptime(run["time"].replace("Z", "+0000"), "%Y%m%dT%H%M%S.%f%z" if "." in run["time"] else "%Y%m%dT%H%M%S%z")
        idle = scan.idle_seconds(info, files, named.timestamp())
        what = f"{window.base_name} {info.base_name}"
        if scan.referenced(files):
            if idle >= scan.min_age:
                _unreferenced_files(scan, info, files, what)
        elif idle >= scan.min_age:
            scan.folder(info, files, f"window run: {scan.referenced_by} references its files (never committed, or no "
                                     f"longer in the table's history); idle {_age_text(idle)}")  # fmt: skip
        else:
            scan.kept.append(f"{scan.relative(info.path)}: not referenced, but written {_age_text(idle)} ago (less than the "
                             f"minimum age {_age_text(scan.min_age)}): a window run may still commit it")  # fmt: skip


def scan_leftovers(
    sink: Any, stream_name: str | None = None, consumer_name: str | None = None, *, min_age: float = DEFAULT_MIN_AGE_SECONDS,
    now: datetime | None = None,
) -> LeftoverScan:  # fmt: skip
    """Find the leftovers under ``sink``'s batch root (module doc); reads only.

    :param sink: a sink of :func:`~airflow_kinesis_spark.sinks.build.build_sink` (its ``batch_root``,
        ``storage_options`` and, for tables, its table).
    :param stream_name: / :param consumer_name: the output's (stream, consumer): for a table, the
        latest committed batch is read from its commits of this pair (and from the batch
        folders its references lie in); ``None``: from the references alone.
    :param min_age: seconds nothing may have been written in a window run or a window's staging
        folder before it counts (default a day).
    :param now: the time ages are measured at (default: now).
    :raises ValueError: the sink has no root, or a location's scheme is not file or s3.
    """
    root = _root(sink)
    committed = _committed(sink, root, stream_name, consumer_name)
    filesys, base = filesystem(root, sink.storage_options)
    local = urlparse(table_uri(root)).scheme in ("", "file")
    scan = _Scan(filesys, (os.path.abspath(base) if local else base).rstrip("/"), root, sink.format, committed, float(min_age),
                 (now or datetime.now(timezone.utc)).timestamp(), local)  # fmt: skip
    for path in committed.files:  # a batch folder holding referenced files proves its batch committed
        relative = posixpath.relpath(path, scan.base)
        if not relative.startswith(".."):
            committed.known = True
            batch = _BATCH.match(relative.split("/", 1)[0])
            committed.saw_batch(int(batch["batch"]) if batch else None)
    top = [i for i in scan.children(scan.base) if i.type != _file_type()]
    _batch_folders(scan, [i for i in top if _BATCH.match(i.base_name)])
    for info in top:
        if info.base_name == STAGING_DIR:
            _staging_folders(scan, info)
        elif info.base_name.startswith("window="):
            _window_folder(scan, info)
    leftovers = tuple(sorted(scan.leftovers, key=lambda item: item.path))
    log.info("leftovers under %s: %d (%d bytes); latest committed batch %s; %d committed files referenced", root,
             len(leftovers), sum(i.size for i in leftovers), committed.latest, len(committed.files))  # fmt: skip
    for note in scan.kept:
        log.info("kept %s", note)
    return LeftoverScan(root, sink.format, committed.latest, len(committed.files), leftovers, tuple(scan.kept))


def find_leftovers(
    sink: Any, stream_name: str | None = None, consumer_name: str | None = None, *, min_age: float = DEFAULT_MIN_AGE_SECONDS,
    now: datetime | None = None,
) -> list[Leftover]:  # fmt: skip
    """:func:`scan_leftovers`'s leftovers: path, size, reason."""
    return list(scan_leftovers(sink, stream_name, consumer_name, min_age=min_age, now=now).leftovers)


def remove_leftovers(
    sink: Any, leftovers: Sequence[Leftover], stream_name: str | None = None, consumer_name: str | None = None, *,
    min_age: float = DEFAULT_MIN_AGE_SECONDS, now: datetime | None = None,
) -> list[Leftover]:  # fmt: skip
    """Remove ``leftovers`` (what a dry run showed) that are still leftovers: the output is scanned
    again first, and only what both scans name is removed (a commit since the first scan keeps
    its files).

    :returns: what was removed.
    :raises OSError: a removal failed (what was removed before it stays removed).
    """
    from pyarrow import fs

    again = {item.path: item for item in find_leftovers(sink, stream_name, consumer_name, min_age=min_age, now=now)}
    filesys, _ = filesystem(_root(sink), sink.storage_options)
    removed = []
    for item in leftovers:
        current = again.get(item.path)
        if current is None or current.folder != item.folder:
            log.info("not removing %s: no longer a leftover", item.path)
            continue
        _, path = filesystem(item.path, sink.storage_options)
        info = filesys.get_file_info(path)
        if info.type == fs.FileType.NotFound:
            continue
        if item.folder:
            filesys.delete_dir(path)
        else:
            filesys.delete_file(path)
        log.info("removed %s (%d bytes): %s", item.path, current.size, current.reason)
        removed.append(current)
    return removed


def sweep_staging(root: str, batch_id: int, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """Remove the staging folders of batch ``batch_id`` and earlier batches under
    ``{root}/_staging/`` (one listing): after the batch's checkpoint commit no driver of them can
    still publish. Window staging folders and later batches' are left alone.

    :returns: the removed folders.
    :raises OSError: listing or removing failed.
    """
    from pyarrow import fs

    filesys, base = filesystem(f"{root.rstrip('/')}/{STAGING_DIR}", storage_options)
    removed = []
    for info in filesys.get_file_info(fs.FileSelector(base, allow_not_found=True)):
        staged = staged_batch_id(info.base_name)
        if info.type == fs.FileType.Directory and staged is not None and staged <= batch_id:
            filesys.delete_dir(info.path)
            removed.append(f"{root.rstrip('/')}/{STAGING_DIR}/{info.base_name}")
    if removed:
        log.info("batch %d: removed %d staging folders of committed batches under %s/%s: %s", batch_id, len(removed),
                 root.rstrip("/"), STAGING_DIR, ", ".join(posixpath.basename(r) for r in removed))  # fmt: skip
    return removed
