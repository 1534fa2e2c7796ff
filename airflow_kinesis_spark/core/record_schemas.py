"""Record schemas as column types: an Avro schema, a JSON Schema, a Spark DDL string or a Protobuf
message descriptor turned into an Arrow type (:func:`schema_type`), and the Spark SQL types of
those (:func:`spark_type`, :func:`spark_compatible`). Used by ``core.records`` to decode and by
the sinks to check a table's columns before a run.

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["schema_type", "parse_ddl", "spark_type", "spark_compatible", "json_required", "proto_descriptor", "is_repeated"]


def schema_type(fmt: str, schema: str, message: str | None) -> Any:
    """The Arrow struct type of one schema of ``fmt`` (``json``, ``avro``, ``protobuf``; for
    ``protobuf``, ``schema`` is a base64 ``FileDescriptorSet`` and ``message`` the message's name).

    :raises ValueError: the schema does not parse, its top level is not a record, or a field has
        no column type (naming it).
    """
    if fmt == "avro":
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as err:
            raise ValueError(f"the Avro schema is not JSON: {err}") from err
        struct = _avro_type(parsed, {}, "")
    elif fmt == "json":
        text = schema.strip()
        if text.startswith("{"):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"the JSON Schema is not JSON: {err}") from err
            struct = _json_schema_type(parsed, "")
        else:
            struct = parse_ddl(text)
    else:
        struct = _proto_type(proto_descriptor(schema, message or ""), "")
    import pyarrow as pa

    if not pa.types.is_struct(struct):
        raise ValueError(f"the {fmt} schema's top level must be a record/object/message (one column per field); got {struct}")
    return struct


_AVRO_PRIMITIVES = {"boolean": "bool_", "int": "int32", "long": "int64", "float": "float32", "double": "float64",
                    "bytes": "binary", "string": "string"}  # fmt: skip


def _avro_type(schema: Any, named: dict[str, Any], path: str) -> Any:
    """The Arrow type of an Avro schema (``named``: record, enum and fixed types by full name)."""
    import pyarrow as pa

    where = path or "the schema"
    if isinstance(schema, list):  # a union: only [null, T] has one column type
        branches = [s for s in schema if s != "null"]
        if len(branches) != 1:
            raise ValueError(f"Avro field {where}: a union of {schema} has no one column type (only ['null', T] has)")
        return _avro_type(branches[0], named, path)
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVES:
            return getattr(pa, _AVRO_PRIMITIVES[schema])()
        if schema in named:
            return named[schema]
        raise ValueError(f"Avro field {where}: unknown type {schema!r}")
    if not isinstance(schema, dict):
        raise ValueError(f"Avro field {where}: {schema!r} is not an Avro schema")
    kind, logical = schema.get("type"), schema.get("logicalType")
    if logical == "date" and kind == "int":
        return pa.date32()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return pa.timestamp("us", tz="UTC")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0)))
    if kind == "record":
        name = schema.get("name", "")
        full = name if "." in name or not schema.get("namespace") else f"{schema['namespace']}.{name}"
        fields = [pa.field(f["name"], _avro_type(f["type"], named, f"{path}.{f['name']}".lstrip(".")), nullable=True)
                  for f in schema.get("fields", [])]  # fmt: skip
        struct = pa.struct(fields)
        named[full] = named[name] = struct
        return struct
    if kind == "enum":
        named[schema.get("name", "")] = pa.string()
        return pa.string()
    if kind == "fixed":
        named[schema.get("name", "")] = pa.binary()
        return pa.binary()
    if kind == "array":
        return pa.list_(_avro_type(schema["items"], named, f"{path}[]"))
    if kind == "map":
        return pa.map_(pa.string(), _avro_type(schema["values"], named, f"{path}{{}}"))
    return _avro_type(kind, named, path)


_JSON_PRIMITIVES = {"integer": "int64", "number": "float64", "boolean": "bool_", "string": "string"}


def _json_schema_type(schema: Any, path: str) -> Any:
    """The Arrow type of a JSON Schema (``type`` possibly ``[T, "null"]``)."""
    import pyarrow as pa

    where = path or "the schema"
    if not isinstance(schema, dict):
        raise ValueError(f"JSON Schema {where}: {schema!r} is not a schema object")
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise ValueError(f"JSON Schema field {where}: type {kind} has no one column type (only [T, 'null'] has)")
        kind = kinds[0]
    if kind is None and "properties" in schema:
        kind = "object"
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            raise ValueError(f"JSON Schema field {where}: an object needs 'properties' (its columns)")
        return pa.struct([pa.field(name, _json_schema_type(sub, f"{path}.{name}".lstrip(".")), nullable=True)
                          for name, sub in props.items()])  # fmt: skip
    if kind == "array":
        if not isinstance(schema.get("items"), dict):
            raise ValueError(f"JSON Schema field {where}: an array needs 'items' (one schema)")
        return pa.list_(_json_schema_type(schema["items"], f"{path}[]"))
    if kind == "string" and schema.get("format") == "date-time":
        return pa.timestamp("us", tz="UTC")
    if kind == "string" and schema.get("format") == "date":
        return pa.date32()
    if kind in _JSON_PRIMITIVES:
        return getattr(pa, _JSON_PRIMITIVES[kind])()
    raise ValueError(f"JSON Schema field {where}: type {kind!r} has no column type (give 'type': object, array, string, "
                     "integer, number or boolean)")  # fmt: skip


def json_required(schema: str) -> tuple[str, ...]:
    """The top-level ``required`` fields of a JSON Schema (``()`` for a DDL string)."""
    text = schema.strip()
    if not text.startswith("{"):
        return ()
    return tuple(json.loads(text).get("required") or ())


_DDL_TYPES = {"string": "string", "varchar": "string", "char": "string", "boolean": "bool_", "tinyint": "int8",
              "byte": "int8", "smallint": "int16", "short": "int16", "int": "int32", "integer": "int32", "bigint": "int64",
              "long": "int64", "float": "float32", "real": "float32", "double": "float64", "binary": "binary",
              "date": "date32"}  # fmt: skip
_DDL_TOKEN = re.compile(r"\s*(`[^`]*`|[A-Za-z_][A-Za-z0-9_]*|<|>|\(|\)|,|:|\d+)")


def parse_ddl(ddl: str) -> Any:
    """A Spark DDL column list (``"id bigint, tags array<string>, m struct<a:int>"``) as an Arrow struct.

    Types: ``string``/``varchar(n)``, ``boolean``, ``tinyint``..``bigint``, ``float``, ``double``,
    ``decimal(p,s)``, ``binary``, ``date``, ``timestamp`` (UTC), ``array<T>``, ``map<K,V>``,
    ``struct<name:T,...>`` (Spark's ``DataType.fromDDL`` grammar, without comments or NOT NULL).

    :raises ValueError: naming the token that does not fit.
    """
    import pyarrow as pa

    tokens = [t.strip("`") if t.startswith("`") else t for t in _tokens(ddl)]
    pos = 0

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"Spark DDL {ddl!r}: ends early" + (f", expected {expected!r}" if expected else ""))
        token = tokens[pos]
        if expected is not None and token != expected:
            raise ValueError(f"Spark DDL {ddl!r}: expected {expected!r}, found {token!r}")
        pos += 1
        return token

    def data_type() -> Any:
        name = take().lower()
        if name in ("array", "map", "struct"):
            take("<")
            if name == "array":
                inner = pa.list_(data_type())
            elif name == "map":
                key = data_type()
                take(",")
                inner = pa.map_(key, data_type())
            else:
                inner = pa.struct(fields(">", ":"))
            take(">")
            return inner
        if name in ("decimal", "numeric", "varchar", "char"):
            args = []
            if pos < len(tokens) and tokens[pos] == "(":
                take("(")
                args.append(int(take()))
                if tokens[pos] == ",":
                    take(",")
                    args.append(int(take()))
                take(")")
            if name in ("varchar", "char"):
                return pa.string()
            return pa.decimal128(args[0] if args else 10, args[1] if len(args) > 1 else 0)
        if name in ("timestamp", "timestamp_ltz"):
            return pa.timestamp("us", tz="UTC")
        if name in _DDL_TYPES:
            return getattr(pa, _DDL_TYPES[name])()
        raise ValueError(f"Spark DDL {ddl!r}: unknown type {name!r}")

    def fields(end: str | None, separator: str | None) -> list[Any]:
        out = []
        while True:
            name = take()
            if separator == ":" or (pos < len(tokens) and tokens[pos] == ":"):
                take(":")
            out.append(pa.field(name, data_type(), nullable=True))
            if pos < len(tokens) and tokens[pos] == ",":
                take(",")
                continue
            if end is None and pos < len(tokens):
                raise ValueError(f"Spark DDL {ddl!r}: unexpected {tokens[pos]!r}")
            return out

    struct = pa.struct(fields(None, None))
    return struct


def _tokens(ddl: str) -> list[str]:
    out, pos = [], 0
    text = ddl.strip()
    while pos < len(text):
        match = _DDL_TOKEN.match(text, pos)
        if not match:
            raise ValueError(f"Spark DDL {ddl!r}: cannot read from {text[pos:pos + 20]!r}")
        out.append(match.group(1))
        pos = match.end()
    return out


def proto_descriptor(schema: str, message: str) -> Any:
    """The message descriptor named ``message`` in a base64 ``FileDescriptorSet``.

    :raises ValueError: not base64 of a ``FileDescriptorSet``, or no such message (naming the ones there are).
    """
    from google.protobuf import descriptor_pb2, descriptor_pool

    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(schema, validate=True))
    except (binascii.Error, ValueError, Exception) as err:  # noqa: BLE001 - protobuf's DecodeError is not a ValueError
        raise ValueError(f"RecordSettings.schema for protobuf must be base64 of a serialized FileDescriptorSet "
                         f"(protoc --include_imports --descriptor_set_out=FILE): {err}") from err  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    try:
        return pool.FindMessageTypeByName(message)
    except KeyError as err:
        names = [f"{p.package}.{m.name}".lstrip(".") for p in files.file for m in p.message_type]
        raise ValueError(f"RecordSettings.message {message!r} is not in the descriptor set (messages: {', '.join(names)})") from err


def _proto_type(descriptor: Any, path: str, depth: int = 0) -> Any:
    import pyarrow as pa
    from google.protobuf.descriptor import FieldDescriptor as F

    if depth > 32:
        raise ValueError(f"protobuf message {descriptor.full_name}: recursive message at {path}; a column type needs a finite depth")
    scalars = {F.TYPE_DOUBLE: pa.float64(), F.TYPE_FLOAT: pa.float32(), F.TYPE_INT64: pa.int64(), F.TYPE_UINT64: pa.uint64(),
               F.TYPE_INT32: pa.int32(), F.TYPE_FIXED64: pa.uint64(), F.TYPE_FIXED32: pa.uint32(), F.TYPE_BOOL: pa.bool_(),
               F.TYPE_STRING: pa.string(), F.TYPE_BYTES: pa.binary(), F.TYPE_UINT32: pa.uint32(), F.TYPE_ENUM: pa.string(),
               F.TYPE_SFIXED32: pa.int32(), F.TYPE_SFIXED64: pa.int64(), F.TYPE_SINT32: pa.int32(), F.TYPE_SINT64: pa.int64()}  # fmt: skip
    if descriptor.full_name == "google.protobuf.Timestamp":
        return pa.timestamp("us", tz="UTC")
    out = []
    for fd in descriptor.fields:
        where = f"{path}.{fd.name}".lstrip(".")
        if fd.type == F.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry:
            key, value = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            out.append(pa.field(fd.name, pa.map_(_proto_field(key, where, depth, scalars), _proto_field(value, where, depth, scalars))))
            continue
        kind = _proto_field(fd, where, depth, scalars)
        out.append(pa.field(fd.name, pa.list_(kind) if is_repeated(fd) else kind, nullable=True))
    return pa.struct(out)


def is_repeated(fd: Any) -> bool:
    """Whether a protobuf field is repeated (protobuf 5+ ``is_repeated``, else its label)."""
    flag = getattr(fd, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return fd.label == fd.LABEL_REPEATED


def _proto_field(fd: Any, where: str, depth: int, scalars: Mapping[int, Any]) -> Any:
    from google.protobuf.descriptor import FieldDescriptor as F

    if fd.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
        return _proto_type(fd.message_type, where, depth + 1)
    return scalars[fd.type]


def spark_type(arrow_type: Any) -> str:
    """The Spark SQL type (DDL) of an Arrow type the decoded columns use (unsigned integers
    widen: ``uint32`` -> ``bigint``, ``uint64`` -> ``decimal(20,0)``)."""
    import pyarrow as pa

    t = arrow_type
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"`{f.name}`:{spark_type(f.type)}" for f in t) + ">"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{spark_type(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{spark_type(t.key_type)},{spark_type(t.item_type)}>"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamp"
    simple = {"bool": "boolean", "int8": "tinyint", "int16": "smallint", "int32": "int", "int64": "bigint", "uint8": "smallint",
              "uint16": "int", "uint32": "bigint", "uint64": "decimal(20,0)", "float": "float", "double": "double",
              "string": "string", "binary": "binary", "date32[day]": "date"}  # fmt: skip
    if str(t) not in simple:
        raise ValueError(f"no Spark type for Arrow type {t}")
    return simple[str(t)]


def spark_compatible(arrow_type: Any) -> Any:
    """``arrow_type`` with the unsigned integers Spark has no type for widened (see :func:`spark_type`)."""
    import pyarrow as pa

    t = arrow_type
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, spark_compatible(f.type), nullable=True) for f in t])
    if pa.types.is_list(t):
        return pa.list_(spark_compatible(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(spark_compatible(t.key_type), spark_compatible(t.item_type))
    widened = {"uint8": pa.int16(), "uint16": pa.int32(), "uint32": pa.int64(), "uint64": pa.decimal128(20, 0)}
    return widened.get(str(t), t)
