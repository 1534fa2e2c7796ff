"""The output schema: the columns every batch writes before the transform's, in one place.

The Spark job builds its Arrow schema and its Spark DDL from :data:`OUTPUT_COLUMNS`; the demo's
verifier and the docs check against the same list.

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OUTPUT_COLUMNS", "arrow_schema", "spark_ddl"]

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
