"""Payload decoders: one schema's user records (JSON, Avro, Protobuf) into Arrow, a page at a time.

:func:`schema_decoder` gives, for one schema, a function that decodes a page of payloads into a
``pyarrow.StructArray`` of the output's struct type and lists the payloads that do not decode
(:class:`DecodeError` kinds, ``core.records.DEAD_LETTER_KINDS``). ``core.records.RecordDecoder``
builds one per inline schema or registry version and splits each page among them. The formats:

* JSON: pyarrow's JSON reader with the output schema as its explicit schema (strict: a field of
  another JSON type fails the record);
* Avro: polars' Avro reader for a whole page where polars is installed, else (and for a page it
  does not take whole) fastavro's ``schemaless_reader`` one datum at a time;
* Protobuf: the message class of the ``FileDescriptorSet`` (``core.record_schemas.proto_descriptor``),
  its messages walked into Python values.

Split from ``core.records`` (settings, registry, wire format, the page decoder), which imports
this module; this module does not import it.

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

from airflow_kinesis_spark.core.record_schemas import is_repeated, json_required, proto_descriptor, schema_type, spark_compatible

__all__ = ["DecodeError", "PageDecoder", "schema_decoder"]

#: A page decoder: payloads -> (a ``pyarrow.StructArray``, one row per payload; the failures
#: ``[(index, kind, message)]``).
PageDecoder = Callable[[list[bytes]], tuple[Any, list[tuple[int, str, str]]]]


class DecodeError(Exception):
    """One record does not decode; ``kind`` is one of ``core.records.DEAD_LETTER_KINDS``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def schema_decoder(fmt: str, schema: str, message: str | None, struct: Any) -> PageDecoder:
    """A function decoding payloads of one schema into a StructArray of ``struct`` (the merged
    output type, ``pyarrow.StructType``) and the failures ``[(index, kind, message)]`` (index
    into the payloads; ``kind`` one of ``core.records.DEAD_LETTER_KINDS``).

    :param fmt: ``json``, ``avro`` or ``protobuf`` (``core.records.RECORD_FORMATS`` but ``raw``).
    :param schema: the schema (JSON Schema or Spark DDL; Avro schema JSON; base64 ``FileDescriptorSet``).
    :param message: Protobuf only: the message's full name.
    """
    if fmt == "json":
        return _json_decoder(schema, struct)
    if fmt == "avro":
        return _avro_decoder(schema, struct)
    return _python_decoder(_proto_reader(schema, message or ""), struct)


def _json_decoder(schema: str, struct: Any) -> PageDecoder:
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


def _python_decoder(reader: Callable[[bytes], Any], struct: Any) -> PageDecoder:
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


def _avro_decoder(schema: str, struct: Any) -> PageDecoder:
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
