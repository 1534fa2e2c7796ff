"""The worker's view of the files Spark wrote: listing a batch's data files, their Parquet
statistics, and small marker files (through ``pyarrow.fs``: local paths, ``file://``, ``s3://``
and ``s3a://``).

``storage_options`` use the keys of delta-rs / object_store (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``); every
sink takes them in that form and translates them for its library (:func:`pyiceberg_io_properties`).
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

__all__ = ["DataFile", "filesystem", "list_data_files", "write_text", "read_text", "exists", "table_uri", "pyiceberg_io_properties",
           "read_schema"]


@dataclass(frozen=True)
class DataFile:
    """One Parquet data file: ``uri`` (the scheme of the output root), ``path`` relative to the
    listed directory, ``size`` (bytes), ``mtime_ms`` (epoch milliseconds)."""

    uri: str
    path: str
    size: int
    mtime_ms: int


def table_uri(location: str) -> str:
    """``location`` as the Python libraries name it: ``s3a://``/``s3n://`` -> ``s3://``; a bare
    path stays a path (without a trailing ``/``)."""
    parsed = urlparse(location)
    if parsed.scheme in ("s3a", "s3n"):
        return "s3://" + location.split("://", 1)[1].rstrip("/")
    return location.rstrip("/") or "/"


def filesystem(location: str, storage_options: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """``(pyarrow.fs.FileSystem, path inside it)`` for ``location``.

    :raises ValueError: a scheme other than a local path, ``file``, ``s3``/``s3a``/``s3n``.
    """
    from pyarrow import fs

    uri = table_uri(location)
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return fs.LocalFileSystem(), parsed.path if parsed.scheme else uri
    if parsed.scheme == "s3":
        opts = dict(storage_options or {})
        kwargs: dict[str, Any] = {}
        if opts.get("AWS_ACCESS_KEY_ID"):
            kwargs.update(access_key=opts["AWS_ACCESS_KEY_ID"], secret_key=opts.get("AWS_SECRET_ACCESS_KEY"),
                          session_token=opts.get("AWS_SESSION_TOKEN"))  # fmt: skip
        if opts.get("AWS_REGION"):
            kwargs["region"] = opts["AWS_REGION"]
        if opts.get("AWS_ENDPOINT_URL"):
            endpoint = urlparse(opts["AWS_ENDPOINT_URL"])
            kwargs.update(endpoint_override=endpoint.netloc or endpoint.path, scheme=endpoint.scheme or "https")
        return fs.S3FileSystem(**kwargs), parsed.netloc + parsed.path
    raise ValueError(f"output location {location!r}: the worker reads file and s3 locations only (scheme {parsed.scheme!r})")


def _join(base_uri: str, relative: str) -> str:
    return f"{base_uri.rstrip('/')}/{relative}"


def _hidden(name: str) -> bool:
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


def list_data_files(location: str, storage_options: Mapping[str, str] | None = None) -> list[DataFile]:
    """The Parquet data files under ``location`` (recursively), sorted by path. Names are filtered
    as Spark's file index does: names starting with ``.``, and with ``_`` unless they hold ``=``
    (a partition folder such as ``_p0=2024-01-01``), are skipped (``_SUCCESS``, ``_quarantine``,
    ``.crc`` files). A missing location has no files."""
    from pyarrow import fs

    filesys, root = filesystem(location, storage_options)
    info = filesys.get_file_info(root)
    if info.type == fs.FileType.NotFound:
        return []
    files = []
    for item in filesys.get_file_info(fs.FileSelector(root, recursive=True)):
        if item.type != fs.FileType.File:
            continue
        relative = posixpath.relpath(item.path, root)
        if any(_hidden(part) for part in relative.split("/")) or not relative.endswith(".parquet"):
            continue
        mtime = item.mtime_ns // 1_000_000 if item.mtime_ns is not None else 0
        files.append(DataFile(uri=_join(table_uri(location), relative), path=relative, size=int(item.size), mtime_ms=mtime))
    return sorted(files, key=lambda f: f.path)


def read_schema(uri: str, storage_options: Mapping[str, str] | None = None) -> Any:
    """The ``pyarrow.Schema`` of the Parquet file ``uri`` (from its footer, without metadata)."""
    import pyarrow.parquet as pq

    filesys, path = filesystem(uri, storage_options)
    with filesys.open_input_file(path) as src:
        return pq.read_schema(src).remove_metadata()


def write_text(location: str, text: str, storage_options: Mapping[str, str] | None = None) -> None:
    """Write ``text`` (UTF-8) to the file ``location``, replacing it: a temporary file then a
    rename on a local file system; one PUT (atomic by itself) on S3."""
    from pyarrow import fs

    filesys, path = filesystem(location, storage_options)
    filesys.create_dir(posixpath.dirname(path), recursive=True)
    if isinstance(filesys, fs.LocalFileSystem):
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with filesys.open_output_stream(tmp) as out:
            out.write(text.encode())
        filesys.move(tmp, path)
    else:
        with filesys.open_output_stream(path) as out:
            out.write(text.encode())


def read_text(location: str, storage_options: Mapping[str, str] | None = None) -> str | None:
    """The file's text, or ``None`` when it does not exist."""
    from pyarrow import fs

    filesys, path = filesystem(location, storage_options)
    if filesys.get_file_info(path).type == fs.FileType.NotFound:
        return None
    with filesys.open_input_stream(path) as src:
        return src.read().decode()


def exists(location: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Whether a file or directory exists at ``location``."""
    from pyarrow import fs

    filesys, path = filesystem(location, storage_options)
    return filesys.get_file_info(path).type != fs.FileType.NotFound


def pyiceberg_io_properties(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """``storage_options`` as pyiceberg's FileIO properties (``s3.access-key-id``, ...)."""
    names = {"AWS_ACCESS_KEY_ID": "s3.access-key-id", "AWS_SECRET_ACCESS_KEY": "s3.secret-access-key",
             "AWS_SESSION_TOKEN": "s3.session-token", "AWS_REGION": "s3.region", "AWS_ENDPOINT_URL": "s3.endpoint"}  # fmt: skip
    return {names[k]: v for k, v in (storage_options or {}).items() if k in names and v}


def aws_storage_options(credentials: Any, region: str | None, endpoint_url: str | None) -> dict[str, str]:
    """Storage options (delta-rs's key names, which :func:`filesystem` reads too) of an AWS access:
    ``credentials`` (botocore's, with ``access_key``, ``secret_key``, ``token``; ``None``: none),
    the region, and an endpoint (``AWS_ALLOW_HTTP`` for an ``http://`` one, e.g. an emulator).
    One place for the operators' and the CLI's. Empty values are left out."""
    opts: dict[str, str] = {}
    if credentials is not None:
        opts.update(AWS_ACCESS_KEY_ID=credentials.access_key, AWS_SECRET_ACCESS_KEY=credentials.secret_key,
                    AWS_SESSION_TOKEN=credentials.token or "")  # fmt: skip
    opts["AWS_REGION"] = region or ""
    if endpoint_url:
        opts["AWS_ENDPOINT_URL"] = endpoint_url
        if endpoint_url.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    return {k: v for k, v in opts.items() if v}

