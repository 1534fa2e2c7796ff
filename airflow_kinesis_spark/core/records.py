"""Typed records: the user records' bytes decoded by schema into columns, or kept as dead letters.

``RecordSettings.format`` (:data:`RECORD_FORMATS`) says what a user record's ``data`` holds:

* ``raw`` (the default): nothing is decoded; the output has the ``data`` column.
* ``json``: one JSON object per record (UTF-8). The schema is a JSON Schema (draft 4 to 2020-12:
  ``type``, ``properties``, ``items``, ``required``, ``format`` ``date-time``/``date``) or a
  Spark DDL string (``"id bigint, tags array<string>"``). Decoded with pyarrow's JSON reader,
  which is strict: a field of another JSON type fails the record, never coerces it.
* ``avro``: Avro binary encoding of one datum, no container file (the schema's JSON; decoded a
  page at a time by polars' Avro reader where polars is installed, else and for any page it does
  not take whole by fastavro's ``schemaless_reader``).
* ``protobuf``: one serialized message; the schema is a ``FileDescriptorSet`` (serialized, base64)
  and the message's full name (``protoc --include_imports --descriptor_set_out``).

The schema is inline (:class:`RecordSettings` ``schema``), or AWS Glue Schema Registry's
(``registry``): then each record is in the registry's wire format (``header version`` byte 3, a
compression byte, 0 for none or 5 for zlib, the 16-byte schema version id, the payload; the
format of the AWS Glue Schema Registry serializers, ``awslabs/aws-glue-schema-registry``) and is
decoded with the schema version it names. The versions are resolved once per batch plan
(:func:`resolve_registry`, on the Airflow worker, with the connection's credentials) and stored
in the plan, so the job, its retries and a re-run decode with the same versions.

The decoded columns are the schema's top-level fields (nested records and arrays kept as
structs and lists), all nullable; over registry versions, the union of the versions' fields
(a version that adds a field adds a column; a field two versions type differently is refused,
naming the field). A record that does not decode becomes a **dead letter** (:data:`DEAD_LETTER_KINDS`):
its row carries the kind and the message, and the job writes it raw to the batch's
``_quarantine`` folder instead of the output.

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

import io
import json
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.record_schemas import (
    is_repeated,
    json_required,
    proto_descriptor,
    schema_type,
    spark_compatible,
)

if TYPE_CHECKING:
    from mypy_boto3_glue import GlueClient
    from mypy_boto3_glue.type_defs import SchemaIdTypeDef

__all__ = [
    "RECORD_FORMATS",
    "DEAD_LETTER_KINDS",
    "DEFAULT_MAX_DEAD_LETTER_FRACTION",
    "RecordSettings",
    "RecordDecoder",
    "Decoded",
    "DecodeError",
    "decoded_schema",

    "resolve_registry",
]

#: ``RecordSettings.format`` values.
RECORD_FORMATS = ("raw", "json", "avro", "protobuf")
#: Why a record is a dead letter: its payload does not parse in the format (``malformed_payload``;
#: also a registry header of another version), the registry header's compression byte is unknown
#: or the payload does not decompress (``bad_compression``), it names a schema version the
#: registry does not hold for the schema (deleted, or another schema's: ``unknown_schema_version``),
#: a field does not have the schema's type or a required field is missing (``wrong_type``).
#: Corrupt KPL aggregates (``corrupt_aggregate``) are the reader's, before any decoding.
DEAD_LETTER_KINDS = ("malformed_payload", "bad_compression", "unknown_schema_version", "wrong_type", "corrupt_aggregate")
#: Default of ``max_dead_letter_fraction``: more dead letters than this fraction of a batch's
#: records is taken for a configuration error (a wrong schema or format), not bad records.
DEFAULT_MAX_DEAD_LETTER_FRACTION = 0.01

#: AWS Glue Schema Registry wire format (awslabs/aws-glue-schema-registry, ``AWSSchemaRegistryConstants``).
GSR_HEADER_VERSION = 3
GSR_COMPRESSION_NONE = 0
GSR_COMPRESSION_ZLIB = 5
GSR_HEADER_BYTES = 18
#: The provider's metadata columns (``core.schema.OUTPUT_COLUMNS``): no decoded field may take their names.
_RESERVED = ("stream_name", "shard_id", "sequence_number", "sub_sequence_number", "partition_key",
             "explicit_hash_key", "approximate_arrival_timestamp", "data")  # fmt: skip
_REGISTRY_FORMATS = {"json": "JSON", "avro": "AVRO", "protobuf": "PROTOBUF"}


class DecodeError(Exception):
    """One record does not decode; ``kind`` is one of :data:`DEAD_LETTER_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class RecordSettings:
    """How a task decodes its records (the DAG author's settings; stored in each batch plan).

    :param format: one of :data:`RECORD_FORMATS`.
    :param schema: inline schema: Avro schema JSON (``avro``), JSON Schema or Spark DDL
        (``json``), base64 of a serialized ``FileDescriptorSet`` (``protobuf``). Not with ``registry``.
    :param message: ``protobuf``: the message's full name (``package.Message``).
    :param registry: AWS Glue Schema Registry: ``{"registry_name": ..., "schema_name": ...}`` or
        ``{"schema_arn": ...}`` (another account's schema by ARN, read with the connection's role).
    :param keep_raw_data: keep the ``data`` column (the record's bytes) beside the decoded ones.
    :param max_dead_letter_fraction: more dead letters than this fraction of a batch's (or
        window's) records fails it, nothing committed (0..1; default
        :data:`DEFAULT_MAX_DEAD_LETTER_FRACTION`).
    :raises ValueError: naming the setting, the problem and the fix.
    """

    format: str = "raw"
    schema: str | None = None
    message: str | None = None
    registry: Mapping[str, str] | None = None
    keep_raw_data: bool = False
    max_dead_letter_fraction: float = DEFAULT_MAX_DEAD_LETTER_FRACTION

    def __post_init__(self) -> None:
        if self.format not in RECORD_FORMATS:
            raise ValueError(f"RecordSettings.format must be one of {', '.join(RECORD_FORMATS)}; got {self.format!r}")
        fraction = self.max_dead_letter_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise ValueError(f"RecordSettings.max_dead_letter_fraction must be a number from 0 to 1; got {fraction!r}")
        if self.format == "raw":
            if self.schema or self.registry or self.message or self.keep_raw_data:
                raise ValueError("RecordSettings.schema, message, registry and keep_raw_data apply to format "
                                 "'json', 'avro' or 'protobuf'; format='raw' writes the records' bytes as they are")  # fmt: skip
            return
        if bool(self.schema) == bool(self.registry):
            raise ValueError(f"RecordSettings(format={self.format!r}) needs a schema: schema (inline) or registry "
                             "({'registry_name': ..., 'schema_name': ...} or {'schema_arn': ...}, AWS Glue Schema "
                             "Registry), one of the two")  # fmt: skip
        if self.registry is not None:
            keys = set(self.registry)
            if keys not in ({"registry_name", "schema_name"}, {"schema_arn"}):
                raise ValueError("RecordSettings.registry must be {'registry_name': ..., 'schema_name': ...} or {'schema_arn': "
                                 f"'arn:aws:glue:...:schema/registry/schema'}}; got keys {sorted(keys)}")  # fmt: skip
            if self.format == "protobuf":
                raise ValueError("RecordSettings(format='protobuf') takes its schema inline (schema: a base64 FileDescriptorSet, "
                                 "message: the message's full name): registry Protobuf schemas are .proto text, "
                                 "which this provider does not compile")  # fmt: skip
        if self.format == "protobuf" and not self.message:
            raise ValueError("RecordSettings(format='protobuf') needs message: the message's full name, e.g. 'shop.v1.Order'")
        if self.format != "protobuf" and self.message:
            raise ValueError("RecordSettings.message applies to format='protobuf'")
        if self.schema:
            decoded_schema(self.to_dict())  # an inline schema that does not convert fails here, before any run

    @property
    def typed(self) -> bool:
        """Whether records are decoded (any format but ``raw``)."""
        return self.format != "raw"

    def to_dict(self) -> dict[str, Any]:
        """The settings as stored in a plan's output spec (``OutputSpec.records``)."""
        return {"format": self.format, "schema": self.schema, "message": self.message,
                "registry": dict(self.registry) if self.registry else None, "keep_raw_data": bool(self.keep_raw_data),
                "max_dead_letter_fraction": float(self.max_dead_letter_fraction)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RecordSettings:
        if not data:
            return cls()
        return cls(format=data.get("format", "raw"), schema=data.get("schema"), message=data.get("message"),
                   registry=data.get("registry"), keep_raw_data=bool(data.get("keep_raw_data")),
                   max_dead_letter_fraction=float(data.get("max_dead_letter_fraction", DEFAULT_MAX_DEAD_LETTER_FRACTION)))  # fmt: skip


# -- the registry ------------------------------------------------------------------------------

def resolve_registry(glue: GlueClient, settings: RecordSettings) -> dict[str, Any]:
    """The registry schema's versions, for a plan: ``settings.to_dict()`` plus ``"versions"``,
    ``{version id: {"number": int, "data_format": "JSON"|"AVRO", "definition": str}}``.

    Fetched once per plan (the job, its retries and a re-run of the batch decode with what the
    plan holds): ``GetSchema`` (the schema's data format and latest version number), then
    ``GetSchemaVersion`` per version number (``ListSchemaVersions`` would do in fewer calls, but
    the registry's definitions come only from ``GetSchemaVersion``). A version number the
    registry no longer holds (deleted) or that is not ``AVAILABLE`` is left out: its records
    become ``unknown_schema_version`` dead letters.

    :param glue: a boto3 Glue client (the connection's credentials and region; a schema of
        another account is read by ARN with a role that may read it).
    :raises ValueError: the schema's data format is not ``settings.format``'s, or it has no
        available version.
    :raises botocore.exceptions.ClientError: the registry or schema does not exist, or access is denied.
    """
    if not settings.registry:
        return settings.to_dict()
    given = dict(settings.registry)
    schema_id: SchemaIdTypeDef = {"SchemaArn": given["schema_arn"]} if "schema_arn" in given else {
        "RegistryName": given["registry_name"], "SchemaName": given["schema_name"]}  # fmt: skip
    described = glue.get_schema(SchemaId=schema_id)
    name = described.get("SchemaArn") or schema_id
    want = _REGISTRY_FORMATS[settings.format]
    if described.get("DataFormat") != want:
        raise ValueError(f"schema {name} in AWS Glue Schema Registry holds {described.get('DataFormat')} schemas, but "
                         f"the task's RecordSettings.format is {settings.format!r} ({want}); set it to match the registry's schema")  # fmt: skip
    versions: dict[str, Any] = {}
    for number in range(1, int(described.get("LatestSchemaVersion") or 0) + 1):
        try:
            got = glue.get_schema_version(SchemaId=schema_id, SchemaVersionNumber={"VersionNumber": number})
        except glue.exceptions.EntityNotFoundException:
            continue  # deleted: its records are dead letters
        if got.get("Status") not in (None, "AVAILABLE"):
            continue  # pending or failed registration, or being deleted
        versions[str(got["SchemaVersionId"])] = {"number": number, "data_format": got.get("DataFormat", want),
                                                 "definition": got["SchemaDefinition"]}  # fmt: skip
    if not versions:
        raise ValueError(f"schema {name} in AWS Glue Schema Registry has no available version")
    return {**settings.to_dict(), "versions": versions}


def _split_gsr(data: bytes) -> tuple[str, bytes]:
    """``(version id, payload)`` of a registry record.

    :raises DecodeError: a short record or another header version (``malformed_payload``), an
        unknown compression byte or a payload that does not decompress (``bad_compression``).
    """
    if len(data) < GSR_HEADER_BYTES or data[0] != GSR_HEADER_VERSION:
        raise DecodeError("malformed_payload", f"not an AWS Glue Schema Registry record: header version byte "
                                               f"{data[0] if data else None}, expected {GSR_HEADER_VERSION}")  # fmt: skip
    version_id = str(uuid.UUID(bytes=bytes(data[2:GSR_HEADER_BYTES])))
    payload = data[GSR_HEADER_BYTES:]
    if data[1] == GSR_COMPRESSION_ZLIB:
        try:
            payload = zlib.decompress(payload)
        except zlib.error as err:
            raise DecodeError("bad_compression", f"zlib: {err}") from err
    elif data[1] != GSR_COMPRESSION_NONE:
        raise DecodeError("bad_compression", f"compression byte {data[1]} is neither 0 (none) nor 5 (zlib)")
    return version_id, payload


# -- schemas to Arrow types --------------------------------------------------------------------


def decoded_schema(spec: Mapping[str, Any]) -> Any:
    """The decoded columns of a record spec (:meth:`RecordSettings.to_dict`, with ``versions``
    when from a registry) as a ``pyarrow.Schema`` of nullable fields; ``None`` for ``raw``.

    :raises ValueError: a schema that does not parse or has a construct with no column type
        (naming the field), or a field named as a metadata column.
    :raises TableCommitError: a field two registry versions type differently (naming it).
    """
    fmt = spec.get("format", "raw")
    if fmt == "raw":
        return None
    import pyarrow as pa

    if spec.get("schema"):
        struct = schema_type(fmt, spec["schema"], spec.get("message"))
    else:
        versions = sorted((spec.get("versions") or {}).values(), key=lambda v: v["number"])
        if not versions:
            raise ValueError("the registry schema's versions are not resolved (resolve_registry)")
        struct = None
        for version in versions:
            this = schema_type(fmt, version["definition"], None)
            struct = this if struct is None else _merge(struct, this, f"version {version['number']}")
    fields = [pa.field(f.name, f.type, nullable=True) for f in struct]
    taken = [f.name for f in fields if f.name in _RESERVED]
    if taken:
        raise ValueError(f"the record schema's fields {taken} have the names of the provider's metadata columns "
                         f"({', '.join(_RESERVED)}); rename them in the schema, or use RecordSettings(format='raw') and a transform")  # fmt: skip
    return pa.schema(fields)


def _merge(old: Any, new: Any, what: str) -> Any:
    """The union of two struct types' fields (``old``'s order, then ``new``'s additions).

    :raises ValueError: a field of both with different types.
    """
    import pyarrow as pa

    from airflow_kinesis_spark.core.schema import type_name

    fields = {f.name: f for f in old}
    for f in new:
        have = fields.get(f.name)
        if have is None:
            fields[f.name] = f
        elif type_name(have.type) != type_name(f.type):
            from airflow_kinesis_spark.exceptions import TableCommitError

            raise TableCommitError(
                f"field {f.name!r}: earlier versions of the registry schema give it type {type_name(have.type)}, {what} "
                f"gives {type_name(f.type)}: records of both would land in one column, whose type cannot change. Nothing "
                "was read or committed. Register a version that restores the type (and delete the other), or write the "
                "new records under a new schema name into a new table (docs/typed-records.md, schema changes).",
                field=f.name,
            )  # fmt: skip
    return pa.struct(list(fields.values()))


# -- decoding ----------------------------------------------------------------------------------


@dataclass
class Decoded:
    """One page's decoded records: ``columns`` (one Arrow array per decoded field, a row per
    record; nulls where it did not decode), and per record ``kinds``/``messages`` (``None`` but
    for a dead letter)."""

    columns: list[Any]
    kinds: list[str | None]
    messages: list[str | None]
    dead_letters: int = 0


@dataclass
class RecordDecoder:
    """Decodes user records' bytes by a record spec (:meth:`RecordSettings.to_dict` with the
    registry's ``versions``). Built once per Spark task; :meth:`decode` per page.

    :ivar schema: the decoded columns (``pyarrow.Schema``, Spark-compatible types).
    """

    spec: Mapping[str, Any]
    schema: Any = field(init=False)
    _by_version: dict[str, Callable[[list[bytes]], tuple[Any, list[tuple[int, str, str]]]]] = field(init=False)
    _inline: Callable[[list[bytes]], tuple[Any, list[tuple[int, str, str]]]] | None = field(init=False)
    _struct: Any = field(init=False)

    def __post_init__(self) -> None:
        import pyarrow as pa

        merged = decoded_schema(self.spec)
        self.schema = pa.schema([pa.field(f.name, spark_compatible(f.type), nullable=True) for f in merged])
        struct = self._struct = pa.struct(list(self.schema))
        fmt = self.spec["format"]
        self._by_version = {}
        self._inline = None
        if self.spec.get("schema"):
            self._inline = _decoder(fmt, self.spec["schema"], self.spec.get("message"), struct)
        else:
            for vid, version in (self.spec.get("versions") or {}).items():
                self._by_version[vid] = _decoder(fmt, version["definition"], None, struct)

    def decode(self, datas: Sequence[bytes]) -> Decoded:
        """Decode one page of records (in order).

        :returns: :class:`Decoded`; never raises for a bad record (it becomes a dead letter).
        """
        import pyarrow as pa

        struct = self._struct
        n = len(datas)
        kinds: list[str | None] = [None] * n
        messages: list[str | None] = [None] * n
        if self._inline is not None:
            groups = {"": (list(range(n)), list(datas))}
            decoders = {"": self._inline}
        else:
            groups, decoders = {}, self._by_version
            for i, data in enumerate(datas):
                try:
                    vid, payload = _split_gsr(data)
                except DecodeError as err:
                    kinds[i], messages[i] = err.kind, str(err)
                    continue
                if vid not in decoders:
                    kinds[i], messages[i] = "unknown_schema_version", (
                        f"schema version {vid} is not a version of the registry schema (deleted, or another schema's)")
                    continue
                index, payloads = groups.setdefault(vid, ([], []))
                index.append(i)
                payloads.append(payload)
        parts, order = [], []
        for key, (index, payloads) in groups.items():
            array, failures = decoders[key](payloads)
            for j, kind, message in failures:
                kinds[index[j]], messages[index[j]] = kind, message
            parts.append(array)
            order.extend(index)
        dead = sum(1 for k in kinds if k is not None)
        if not order:
            whole = pa.nulls(n, struct)
        else:
            joined = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
            if len(order) < n:  # rows that failed before a decoder: nulls at the end, then put in place
                joined = pa.concat_arrays([joined, pa.nulls(n - len(order), struct)])
                placed = set(order)
                order.extend(i for i in range(n) if i not in placed)
            position = [0] * n
            for j, i in enumerate(order):
                position[i] = j
            whole = joined.take(pa.array(position, pa.int64())) if order != list(range(n)) else joined
        if dead:  # a dead letter's columns are null, whatever part of it decoded
            import pyarrow.compute as pc

            whole = pc.if_else(pa.array([k is None for k in kinds]), whole, pa.nulls(n, struct))
        columns = [whole.field(i) for i in range(struct.num_fields)]
        return Decoded(columns, kinds, messages, dead)


def _decoder(fmt: str, schema: str, message: str | None, struct: Any) -> Callable[[list[bytes]], tuple[Any, list[tuple[int, str, str]]]]:
    """A function decoding payloads of one schema into a StructArray of ``struct`` (the merged
    output type) and the failures ``[(index, kind, message)]``."""
    if fmt == "json":
        return _json_decoder(schema, struct)
    if fmt == "avro":
        return _avro_decoder(schema, struct)
    return _python_decoder(_proto_reader(schema, message or ""), struct)


def _json_decoder(schema: str, struct: Any) -> Callable[[list[bytes]], tuple[Any, list[tuple[int, str, str]]]]:
    """JSON objects through pyarrow's JSON reader with the output schema as its explicit schema
    (fields outside it ignored): all of a page in one call, and record by record only when that
    call fails, to find which records do not decode. The schema's own type (not the merged one)
    is what is checked: a field a version does not have is null."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    own = schema_type("json", schema, None)
    own_schema = pa.schema([pa.field(f.name, spark_compatible(f.type), nullable=True) for f in own])
    required = json_required(schema)
    options = pj.ParseOptions(explicit_schema=own_schema, unexpected_field_behavior="ignore")

    def read(payloads: list[bytes]) -> Any:
        text = b"\n".join(p.replace(b"\n", b" ").replace(b"\r", b" ") for p in payloads)
        block = max(1 << 20, len(text) + 1)
        return pj.read_json(io.BytesIO(text), read_options=pj.ReadOptions(use_threads=False, block_size=block),
                            parse_options=options)  # fmt: skip

    def to_output(table: Any) -> Any:
        arrays = [table.column(f.name).combine_chunks() if f.name in own_schema.names else pa.nulls(table.num_rows, f.type)
                  for f in struct]  # fmt: skip
        return pa.StructArray.from_arrays(arrays, fields=list(struct))

    def one(payload: bytes) -> tuple[Any | None, tuple[str, str] | None]:
        if not payload.strip().startswith(b"{"):
            try:
                json.loads(payload)
            except ValueError:
                return None, ("malformed_payload", "the record is not JSON")
            return None, ("wrong_type", "the record is JSON, but not an object")
        try:
            table = read([payload])
        except pa.ArrowInvalid as err:
            text = str(err)
            kind = "wrong_type" if "changed from" in text or "Failed to convert" in text or "couldn't parse" in text else "malformed_payload"
            return None, (kind, text)
        if table.num_rows != 1:
            return None, ("malformed_payload", f"the record holds {table.num_rows} JSON values, not one object")
        return table, None

    def decode(payloads: list[bytes]) -> tuple[Any, list[tuple[int, str, str]]]:
        failures: list[tuple[int, str, str]] = []
        table = None
        if all(p[:1] == b"{" for p in payloads):
            try:
                table = read(payloads)
                if table.num_rows != len(payloads):
                    table = None
            except pa.ArrowInvalid:
                table = None
        if table is None:
            tables = []
            for j, payload in enumerate(payloads):
                got, failure = one(payload)
                if failure is not None:
                    failures.append((j, *failure))
                    got = pa.table({f.name: pa.nulls(1, f.type) for f in own_schema})
                tables.append(got)
            table = pa.concat_tables(tables) if tables else pa.table({f.name: pa.nulls(0, f.type) for f in own_schema})
        if required:
            failed = {j for j, _, _ in failures}
            for name in required:
                if name in own_schema.names:
                    nulls = pc.is_null(table.column(name)).to_pylist()
                    for j, missing in enumerate(nulls):
                        if missing and j not in failed:
                            failures.append((j, "wrong_type", f"required field {name!r} is missing or null"))
                            failed.add(j)
        return to_output(table), failures

    return decode


def _python_decoder(reader: Callable[[bytes], Any], struct: Any) -> Callable[[list[bytes]], tuple[Any, list[tuple[int, str, str]]]]:
    """Payloads decoded one by one into Python values by ``reader`` (which raises ``DecodeError``
    or any error for a payload that does not parse), converted to Arrow all at once; record by
    record only when that conversion fails."""
    import pyarrow as pa

    def decode(payloads: list[bytes]) -> tuple[Any, list[tuple[int, str, str]]]:
        values: list[Any] = []
        failures: list[tuple[int, str, str]] = []
        for j, payload in enumerate(payloads):
            try:
                values.append(reader(payload))
            except DecodeError as err:
                failures.append((j, err.kind, str(err)))
                values.append(None)
            except Exception as err:  # noqa: BLE001 - any parser error is this record's, never the batch's
                failures.append((j, "malformed_payload", f"{type(err).__name__}: {err}"))
                values.append(None)
        try:
            return pa.array(values, struct), failures
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
            pass
        arrays = []
        for j, value in enumerate(values):
            try:
                arrays.append(pa.array([value], struct))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError) as err:
                failures.append((j, "wrong_type", f"{type(err).__name__}: {err}"))
                arrays.append(pa.nulls(1, struct))
        return pa.concat_arrays(arrays), failures

    return decode


def _avro_decoder(schema: str, struct: Any) -> Callable[[list[bytes]], tuple[Any, list[tuple[int, str, str]]]]:
    """Avro pages through polars' Avro reader (:func:`_avro_page_reader`: a whole page in one
    call: 2.1 µs a record for ``make bench``'s orders, against 35.8 µs with fastavro alone, in
    docs/benchmarks.md, section 8, then and before) where polars is installed and reads
    the schema; a page it does not take whole (a record that does not decode, or one it cannot
    tell ends where it should) is decoded record by record with fastavro, which says which
    records are dead letters and why. A page polars refused that fastavro then decodes without
    a single failure means polars does not read this schema as fastavro does: fastavro alone from
    then on, for this decoder."""
    slow = _python_decoder(_avro_reader(schema), struct)
    fast = _avro_page_reader(schema, struct)

    def decode(payloads: list[bytes]) -> tuple[Any, list[tuple[int, str, str]]]:
        nonlocal fast
        if fast is not None and payloads:
            whole = fast(payloads)
            if whole is not None:
                return whole, []
        array, failures = slow(payloads)
        if fast is not None and payloads and not failures:
            fast = None  # polars reads this schema otherwise than fastavro: fastavro alone from now on
        return array, failures

    return decode


def _avro_reader(schema: str) -> Callable[[bytes], Any]:
    """fastavro's ``schemaless_reader`` of one datum; a payload with bytes after the datum is
    malformed (the datum was written with another schema)."""
    import fastavro

    parsed = fastavro.parse_schema(_reader_schema(json.loads(schema)))

    def read(payload: bytes) -> Any:
        stream = io.BytesIO(payload)
        value = fastavro.schemaless_reader(stream, parsed, None)
        if stream.tell() != len(payload):
            raise DecodeError("malformed_payload", f"Avro datum ends at byte {stream.tell()} of {len(payload)}: "
                                                   "written with another schema?")  # fmt: skip
        return value

    return read


#: Avro logical types whose column is the underlying value (``core.record_schemas``): a
#: ``uuid``'s string, a ``time-*``'s and a ``local-timestamp-*``'s number (milliseconds or
#: microseconds), as written.
_UNDERLYING_LOGICAL_TYPES = ("uuid", "time-millis", "time-micros", "local-timestamp-millis", "local-timestamp-micros")
#: The field :func:`_avro_page_reader` adds after each datum (a ``fixed`` of 8 random bytes).
_END_OF_DATUM = "_airflow_kinesis_spark_end_of_datum"


def _reader_schema(schema: Any) -> Any:
    """An Avro schema without the logical types in :data:`_UNDERLYING_LOGICAL_TYPES` (fastavro
    would hand back ``uuid.UUID``, ``datetime.time`` and naive ``datetime`` objects; the column
    holds the underlying string or number)."""
    if isinstance(schema, dict):
        return {k: _reader_schema(v) for k, v in schema.items()
                if not (k == "logicalType" and v in _UNDERLYING_LOGICAL_TYPES)}  # fmt: skip
    if isinstance(schema, list):
        return [_reader_schema(s) for s in schema]
    return schema


def _renamed_copies(schema: Any, seen: set[str]) -> Any:
    """``schema`` (every named-type reference replaced by its definition, fastavro's
    ``expand_schema``) with each repeated definition under a name of its own, which the Avro
    specification requires and the binary encoding never reads."""
    if isinstance(schema, list):
        return [_renamed_copies(s, seen) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _renamed_copies(v, seen) if k in ("type", "items", "values", "fields") else v for k, v in schema.items()}
    if schema.get("type") in ("record", "enum", "fixed") and "name" in schema:
        name, base, n = str(schema["name"]), str(schema["name"]), 1
        while name in seen:  # a suffix no name has yet (the schema's own names included)
            name, n = f"{base}_{n}", n + 1
        seen.add(name)
        out["name"] = name
    return out


def _avro_page_reader(schema: str, struct: Any) -> Callable[[list[bytes]], Any] | None:
    """A page of Avro datums decoded in one call by polars' Avro reader (``polars.read_avro``,
    Rust): the page becomes one Avro object container file (the header written by fastavro, one
    block holding every datum), each datum followed by 8 random bytes read as a ``fixed`` field
    the schema gains (:data:`_END_OF_DATUM`). polars does not say where each datum ended; the
    marker does: a datum with bytes after it (written with another schema) or one cut short
    reads other bytes as its marker, or fails the whole page.

    :returns: a function of a page returning the ``struct`` array, or ``None`` when the page is
        not decoded whole (each record is then decoded by fastavro); ``None`` instead of the
        function where polars is not installed or does not read the schema (a ``map``: polars
        refuses it with a Rust panic, a ``BaseException``).
    """
    try:
        import polars
    except ImportError:
        return None
    import os

    import fastavro
    import pyarrow as pa
    import pyarrow.compute as pc

    from fastavro.schema import expand_schema

    definition = _reader_schema(json.loads(schema))
    if not (isinstance(definition, dict) and definition.get("type") == "record"):
        return None
    definition = _renamed_copies(expand_schema(definition), set())  # polars resolves no named-type references
    marker = os.urandom(8)
    marked = {**definition, "fields": [*definition.get("fields", []), {"name": _END_OF_DATUM, "type": {
        "type": "fixed", "name": "EndOfDatum", "namespace": "airflow_kinesis_spark", "size": 8}}]}  # fmt: skip
    expected = pa.scalar(marker, pa.binary(8))
    long_schema = fastavro.parse_schema("long")

    def to_output(table: Any) -> Any:
        arrays = [table.column(f.name).combine_chunks().cast(f.type) if f.name in table.column_names
                  else pa.nulls(table.num_rows, f.type) for f in struct]  # fmt: skip
        return pa.StructArray.from_arrays(arrays, fields=list(struct))

    def long(n: int) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, long_schema, n)
        return out.getvalue()

    def polars_table(blob: bytes) -> Any:
        try:
            return polars.read_avro(io.BytesIO(blob)).to_arrow()
        except BaseException as err:  # polars' refusals include Rust panics (pyo3's PanicException)
            if isinstance(err, (KeyboardInterrupt, SystemExit)):
                raise
            return None

    container = io.BytesIO()
    fastavro.writer(container, fastavro.parse_schema(marked), [], codec="null")
    header = container.getvalue()
    sync = header[-16:]  # a container's header ends with its sync marker (Avro specification, "Object Container Files")
    probe = polars_table(header)
    try:
        if probe is None or to_output(probe).type != struct:
            return None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None

    def read(payloads: list[bytes]) -> Any:
        body = marker.join(payloads) + marker
        table = polars_table(b"".join((header, long(len(payloads)), long(len(body)), body, sync)))
        if table is None or table.num_rows != len(payloads):
            return None
        ends = table.column(_END_OF_DATUM).cast(pa.binary(8))
        if not pc.all(pc.fill_null(pc.equal(ends, expected), False)).as_py():
            return None
        try:
            return to_output(table)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None

    return read


def _proto_reader(schema: str, message: str) -> Callable[[bytes], Any]:
    """One serialized message parsed (protobuf's C implementation) and walked into a dict: a
    field with presence that is unset is null; enums by name; ``Timestamp`` as a datetime."""
    from google.protobuf import message_factory

    descriptor = proto_descriptor(schema, message)
    cls = message_factory.GetMessageClass(descriptor)
    walk = _proto_walker(descriptor)

    def read(payload: bytes) -> Any:
        msg = cls()
        try:
            msg.ParseFromString(payload)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError
            raise DecodeError("malformed_payload", f"protobuf {message}: {err}") from err
        return walk(msg)

    return read


def _proto_walker(descriptor: Any) -> Callable[[Any], Any]:
    from datetime import timezone

    from google.protobuf.descriptor import FieldDescriptor as F

    if descriptor.full_name == "google.protobuf.Timestamp":
        return lambda m: m.ToDatetime(tzinfo=timezone.utc)
    steps: list[tuple[str, bool, Callable[[Any], Any] | None, bool]] = []
    for fd in descriptor.fields:
        convert: Callable[[Any], Any] | None = None
        is_map = fd.type == F.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry
        if is_map:
            value_fd = fd.message_type.fields_by_name["value"]
            inner = _scalar_or_message(value_fd)
            convert = (lambda m, inner=inner: [(k, inner(v) if inner else v) for k, v in m.items()])
        else:
            convert = _scalar_or_message(fd)
        presence = bool(getattr(fd, "has_presence", False)) and not is_repeated(fd)
        steps.append((fd.name, presence, convert, is_repeated(fd) and not is_map))

    def walk(msg: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, presence, convert, repeated in steps:
            if presence and not msg.HasField(name):
                out[name] = None
                continue
            value = getattr(msg, name)
            if repeated:
                out[name] = [convert(v) for v in value] if convert else list(value)
            else:
                out[name] = convert(value) if convert else value
        return out

    return walk


def _scalar_or_message(fd: Any) -> Callable[[Any], Any] | None:
    from google.protobuf.descriptor import FieldDescriptor as F

    if fd.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
        return _proto_walker(fd.message_type)
    if fd.type == F.TYPE_ENUM:
        names = {v.number: v.name for v in fd.enum_type.values}
        return lambda v: names.get(v, str(v))
    return None
