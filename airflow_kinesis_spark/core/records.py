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

import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.record_decoders import DecodeError, PageDecoder, schema_decoder
from airflow_kinesis_spark.core.record_schemas import schema_type, spark_compatible

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
    _by_version: dict[str, PageDecoder] = field(init=False)
    _inline: PageDecoder | None = field(init=False)
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
            self._inline = schema_decoder(fmt, self.spec["schema"], self.spec.get("message"), struct)
        else:
            for vid, version in (self.spec.get("versions") or {}).items():
                self._by_version[vid] = schema_decoder(fmt, version["definition"], None, struct)

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
