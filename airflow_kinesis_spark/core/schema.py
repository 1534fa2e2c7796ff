"""The output schema: the columns every batch writes before the transform's, in one place.

The Spark job builds its Arrow schema and its Spark DDL from :data:`OUTPUT_COLUMNS`; the demo's
verifier and the docs check against the same list.

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OUTPUT_COLUMNS", "JOB_COLUMNS", "arrow_schema", "spark_ddl", "schema_changes", "type_name"]

#: ``(name, Spark SQL type, Arrow type name)`` of each output column, in order. Timestamps are
#: UTC with microseconds (``ApproximateArrivalTimestamp`` has milliseconds); ``data`` is the user
#: record's bytes; ``sub_sequence_number`` is null for a record that was not KPL-aggregated.
OUTPUT_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("stream_name", "string", "string"),
    ("shard_id", "string", "string"),
    ("sequence_number", "string", "string"),
    ("sub_sequence_number", "long", "int64"),
    ("partition_key", "string", "string"),
    ("explicit_hash_key", "string", "string"),
    ("approximate_arrival_timestamp", "timestamp", "timestamp[us, tz=UTC]"),
    ("data", "binary", "binary"),
)

#: Columns the Spark job's read (``mapInArrow``, ``airflow_kinesis_spark.job.read``) yields after the
#: output columns and the decoded ones (``core.records``), all filtered out of the output
#: (``sinks.spark_write.output_rows``): why a record is quarantined (a corrupt Kinesis record, or
#: a dead letter: a user record that does not decode), its kind (``core.records.DEAD_LETTER_KINDS``),
#: and the per-range report row.
JOB_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_quarantine_reason", "string"),
    ("_error_kind", "string"),
    ("_report", "string"),
)

_ARROW_TYPES = {
    "string": lambda pa: pa.string(),
    "int64": lambda pa: pa.int64(),
    "binary": lambda pa: pa.binary(),
    "timestamp[us, tz=UTC]": lambda pa: pa.timestamp("us", tz="UTC"),
}


def spark_ddl(*extra: tuple[str, str]) -> str:
    """The output columns as a Spark DDL string (``"stream_name string, ..."``), then ``extra``
    ``(name, Spark SQL type)`` columns."""
    return ", ".join(f"{name} {sql}" for name, sql, _ in OUTPUT_COLUMNS) + "".join(f", {n} {t}" for n, t in extra)


def arrow_schema(*extra: tuple[str, str]) -> Any:
    """The output columns as a ``pyarrow.Schema``, then ``extra`` ``(name, Arrow type name)``
    columns (type names as in :data:`OUTPUT_COLUMNS`)."""
    import pyarrow as pa

    return pa.schema([(name, _ARROW_TYPES[arrow](pa)) for name, _, arrow in OUTPUT_COLUMNS] + [(n, _ARROW_TYPES[t](pa)) for n, t in extra])


def type_name(arrow_type: Any) -> str:
    """An Arrow type's name with the physical variants a table format may hand back folded into
    one (``large_string``/``string_view`` -> ``string``, ``large_binary`` -> ``binary``,
    ``large_list`` -> ``list``; a timestamp's zone ``+00:00`` -> ``UTC``; field names and
    nullability inside nested types ignored)."""
    text = str(arrow_type)
    for variant, name in (("large_string", "string"), ("string_view", "string"), ("large_binary", "binary"),
                          ("binary_view", "binary"), ("large_list", "list"), ("tz=+00:00", "tz=UTC"),
                          ("tz=Etc/UTC", "tz=UTC"), (" not null", "")):  # fmt: skip
        text = text.replace(variant, name)
    import re

    return re.sub(r"<(item|element): ", "<", text)


def schema_changes(table_schema: Any, batch_schema: Any, *, ignore: tuple[str, ...] = ()) -> tuple[list[Any], list[str]]:
    """How a batch's columns differ from a table's (both ``pyarrow.Schema``).

    :param ignore: columns not compared (partition columns a format keeps outside the files).
    :returns: ``(added, changed)``: the batch's fields the table lacks (in the batch's order),
        and one line per column whose type differs, ``"name: table has T, batch has B"``. Columns
        the table has and the batch lacks are neither (readers see them as null).
    """
    table = {f.name: f for f in table_schema}
    added, changed = [], []
    for field in batch_schema:
        if field.name in ignore:
            continue
        have = table.get(field.name)
        if have is None:
            added.append(field)
        elif (old := type_name(have.type)) != (new := type_name(field.type)):
            changed.append(f"{field.name}: table has {old}, batch has {new}")
    return added, changed
