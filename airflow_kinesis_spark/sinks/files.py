"""The worker's view of the files Spark wrote: listing a batch's data files, their Parquet
statistics, and small marker files (through ``pyarrow.fs``: local paths, ``file://``, ``s3://``
and ``s3a://``).

``storage_options`` use the keys of delta-rs / object_store (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``), plus
:data:`CA_BUNDLE_OPTION`; every sink takes them in that form and translates them for its library
(:func:`pyiceberg_io_properties`).
"""

from __future__ import annotations

import os
import posixpath
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

__all__ = ["CA_BUNDLE_OPTION", "DataFile", "check_library_trust", "filesystem", "list_data_files", "write_text", "read_text",
           "exists", "table_uri", "pyiceberg_io_properties", "read_schema"]


#: The storage option naming a CA bundle (a PEM file's path) for an ``s3://`` location, botocore's
#: name for it. This package's own access (:func:`filesystem`) gives it to pyarrow
#: (``S3FileSystem(tls_ca_file_path=)``, pyarrow 21 or later); the operators set it from
#: ``verify`` when that is a path. delta-rs and pyiceberg take none (object_store has no such
#: key; pyiceberg 0.12 passes none to pyarrow, apache/iceberg-python#3866): they trust the
#: system's CA certificates or the file the worker's ``SSL_CERT_FILE`` names
#: (:func:`check_library_trust`).
CA_BUNDLE_OPTION = "AWS_CA_BUNDLE"


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

    :param storage_options: :data:`CA_BUNDLE_OPTION` among them: the CA bundle an ``s3``
        location's endpoint is verified with (else the system's CA certificates).
    :raises ValueError: a scheme other than a local path, ``file``, ``s3``/``s3a``/``s3n``; a CA
        bundle with pyarrow older than 21.
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
        if opts.get(CA_BUNDLE_OPTION):
            import pyarrow

            if int(pyarrow.__version__.split(".")[0]) < 21:
                raise ValueError(f"storage option {CA_BUNDLE_OPTION} (verify's CA bundle): pyarrow {pyarrow.__version__} takes "
                                 "no CA bundle for S3 (tls_ca_file_path came in pyarrow 21); install pyarrow>=21")  # fmt: skip
            kwargs["tls_ca_file_path"] = opts[CA_BUNDLE_OPTION]
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


def aws_storage_options(credentials: Any, region: str | None, endpoint_url: str | None,
                        verify: bool | str | None = None) -> dict[str, str]:  # fmt: skip
    """Storage options (delta-rs's key names, which :func:`filesystem` reads too) of an AWS access:
    ``credentials`` (botocore's, with ``access_key``, ``secret_key``, ``token``; ``None``: none),
    the region, an endpoint (``AWS_ALLOW_HTTP`` for an ``http://`` one, e.g. an emulator) and
    ``verify`` as boto3 takes it (a path: :data:`CA_BUNDLE_OPTION`; ``False`` has no storage
    option: pyarrow always verifies). One place for the operators' and the CLI's. Empty values
    are left out."""
    opts: dict[str, str] = {}
    if credentials is not None:
        opts.update(AWS_ACCESS_KEY_ID=credentials.access_key, AWS_SECRET_ACCESS_KEY=credentials.secret_key,
                    AWS_SESSION_TOKEN=credentials.token or "")  # fmt: skip
    opts["AWS_REGION"] = region or ""
    if endpoint_url:
        opts["AWS_ENDPOINT_URL"] = endpoint_url
        if endpoint_url.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    if isinstance(verify, str):
        opts[CA_BUNDLE_OPTION] = verify
    return {k: v for k, v in opts.items() if v}


def check_library_trust(location: str, storage_options: Mapping[str, str] | None, library: str) -> None:
    """Before ``library`` (delta-rs, pyiceberg) reads or writes an ``s3://`` ``location`` whose
    storage options name a CA bundle (:data:`CA_BUNDLE_OPTION`), which it cannot be given: one
    request (pyarrow's ``get_file_info``) trusting what the library trusts, the system's CA
    certificates or the file the worker's ``SSL_CERT_FILE`` names (both libraries' TLS stacks read
    it: OpenSSL's and rustls-native-certs'). Nothing is checked without a CA bundle or for a
    local location; an answer other than a TLS failure (a missing key, access denied) passes.

    :raises OutputTrustError: the endpoint's certificate is not trusted so; names the location,
        the endpoint, the bundle and the fix (``SSL_CERT_FILE`` in the worker's environment).
    """
    from airflow_kinesis_spark.exceptions import OutputTrustError

    opts = dict(storage_options or {})
    bundle = opts.pop(CA_BUNDLE_OPTION, None)
    if not bundle or urlparse(table_uri(location)).scheme != "s3":
        return
    filesys, path = filesystem(location, opts)
    try:
        filesys.get_file_info(path)
    except OSError as err:
        if "curlCode: 60" not in str(err) and "curlCode: 77" not in str(err):
            return
        endpoint = opts.get("AWS_ENDPOINT_URL") or "the region's S3 endpoint"
        current = os.environ.get("SSL_CERT_FILE")
        raise OutputTrustError(
            f"{library} would not trust the TLS certificate of {endpoint} (output {location!r}): it cannot be given "
            f"the CA bundle {bundle!r} (verify, or the storage option {CA_BUNDLE_OPTION}) and trusts the system's CA "
            f"certificates or the worker's SSL_CERT_FILE ({'now ' + repr(current) if current else 'not set'}). "
            f"Set SSL_CERT_FILE={bundle} in the environment of the workers that run this task (a bundle that "
            f"also holds the public CAs if the worker reaches other TLS endpoints through these libraries), or "
            f"install the CA in the system's certificates. Nothing was read or written.",
            location=location, endpoint=endpoint, ca_bundle=bundle, library=library,
        ) from err

