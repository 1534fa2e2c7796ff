"""Example: typed records. Each record's bytes are decoded by a schema into columns, and the
records that do not decode are kept aside as dead letters.

``record_settings=RecordSettings(format=...)`` says what a record's bytes hold:

* ``"raw"`` (the default): nothing is decoded; the output has the record's bytes in ``data``.
* ``"json"``: one JSON object. Schema: a JSON Schema or a Spark DDL string
  (``"order_id bigint, customer string"``).
* ``"avro"``: one Avro datum in binary encoding (no container file). Schema: the Avro schema JSON.
* ``"protobuf"``: one serialized message. Schema: base64 of a serialized ``FileDescriptorSet``
  (``protoc --include_imports --descriptor_set_out=click.desc click.proto``, then
  ``base64 -w0 click.desc``) plus ``message``, the message's full name.

The schema is given inline (``RecordSettings(schema=...)``) or read from AWS Glue Schema Registry
(``RecordSettings(registry={"registry_name": ..., "schema_name": ...})`` or ``{"schema_arn": ...}``,
with ``aws_conn_id``'s credentials). A registry record is in the registry's wire format (the
serializers of ``awslabs/aws-glue-schema-registry``: an 18-byte header naming the schema
version, then the payload, zlib-compressed or not). Each record is decoded with the version it
names. The versions are read once per batch plan, so a retry decodes with the same versions.

Each output row has the metadata columns (``stream_name``, ``shard_id``, ``sequence_number``,
``sub_sequence_number``, ``partition_key``, ``explicit_hash_key``,
``approximate_arrival_timestamp``), then one column per top-level field of the schema. Nested
records and arrays stay structs and lists. ``data`` is kept only with ``RecordSettings(keep_raw_data=True)``.
When a new registry version adds a field, an Iceberg or Delta table gets a new nullable column
with the first batch that reads it (``OutputSettings.schema_evolution`` defaults to ``"add_columns"`` for
typed records). Older rows hold null there.

A record that does not decode is a **dead letter** (malformed payload, bad compression, a
schema version the registry does not hold, a field of the wrong type). It is written raw, with
its ``error_kind`` and ``reason``, as Parquet under the batch's (or window's)
``_quarantine`` folder inside ``output_path``. The task's XCom summary counts the dead letters
(``dead_letters``) and says where they went (``quarantine_path``). If a batch has more dead
letters than ``RecordSettings.max_dead_letter_fraction`` of its records (default 0.01), the batch fails and
nothing is committed, because a rate that high usually means a wrong schema or format.

``kinesis_typed`` (scheduled) has three consumers, each with its own checkpoints:

* ``ingest_orders_json``: stream ``orders-json``, registry JSON Schema ``orders-json``, into the
  Iceberg table ``lake.orders_json``;
* ``ingest_orders_avro``: stream ``orders-avro``, registry Avro schema ``orders-avro``, into a
  Delta table;
* ``ingest_clicks``: stream ``clicks-proto``, plain protobuf ``demo.Click`` messages (no
  registry header), with the descriptor inline, into the Iceberg table ``lake.clicks``.

``kinesis_typed_window`` (manual) reads ``[window_start, window_end)`` of ``orders-json`` again
into ``lake.orders_json_window``. A re-run replaces the window's rows.

Settings come from environment variables, so the same file runs locally and on AWS:

=================================  ===============================================  ======================================
variable                           meaning                                          default
=================================  ===============================================  ======================================
KINESIS_ORDERS_JSON_STREAM         stream of GSR JSON orders                        orders-json
KINESIS_ORDERS_AVRO_STREAM         stream of GSR Avro orders                        orders-avro
KINESIS_CLICKS_STREAM              stream of protobuf clicks                        clicks-proto
KINESIS_SCHEMA_REGISTRY            Glue Schema Registry holding both order schemas  demo-registry
KINESIS_CLICK_DESCRIPTOR           base64 FileDescriptorSet holding ``demo.Click``  built below with descriptor_pb2
KINESIS_MAX_DEAD_LETTER_FRACTION   dead letters a batch may hold, as a fraction     0.01
KINESIS_CHECKPOINT_TABLE           DynamoDB table of the checkpoints                kinesis_spark_checkpoints
KINESIS_TABLES_ROOT                where the tables' files go (local, s3a://...)    /tmp/kinesis_spark_tables
KINESIS_ICEBERG_CATALOG_URI        pyiceberg SQL catalog URI                        sqlite:///{KINESIS_TABLES_ROOT}/catalog.db
KINESIS_SPARK_CONN_ID              Spark connection (spark or spark_connect)        spark_default
KINESIS_LEASE_SECONDS              the batches' lease (keep it below retry_delay)   120
KINESIS_WINDOW_START / _END        the window of ``kinesis_typed_window`` (UTC)     the last hour
=================================  ===============================================  ======================================
"""

from __future__ import annotations

import base64
import os
from datetime import datetime, timedelta

from airflow.sdk import dag

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import OutputSettings, RecordSettings, SparkSettings
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator

ORDERS_JSON = os.environ.get("KINESIS_ORDERS_JSON_STREAM", "orders-json")
ORDERS_AVRO = os.environ.get("KINESIS_ORDERS_AVRO_STREAM", "orders-avro")
CLICKS = os.environ.get("KINESIS_CLICKS_STREAM", "clicks-proto")
REGISTRY = os.environ.get("KINESIS_SCHEMA_REGISTRY", "demo-registry")
MAX_DEAD_LETTERS = float(os.environ.get("KINESIS_MAX_DEAD_LETTER_FRACTION", "0.01"))
CHECKPOINTS = os.environ.get("KINESIS_CHECKPOINT_TABLE", "kinesis_spark_checkpoints")
ROOT = os.environ.get("KINESIS_TABLES_ROOT", "/tmp/kinesis_spark_tables")
CATALOG = {"type": "sql", "uri": os.environ.get("KINESIS_ICEBERG_CATALOG_URI", f"sqlite:///{ROOT}/catalog.db")}
SPARK = os.environ.get("KINESIS_SPARK_CONN_ID", "spark_default")
LEASE = float(os.environ.get("KINESIS_LEASE_SECONDS", "120"))


def click_descriptor() -> str:
    """base64 of a ``FileDescriptorSet`` holding ``demo/click.proto``::

        syntax = "proto3";
        package demo;
        message Meta { string browser = 1; int32 width = 2; }
        message Click { int64 id = 1; string page = 2; repeated string tags = 3; Meta meta = 4; }

    Built with ``descriptor_pb2`` so this example needs no ``protoc``. With a ``.proto`` file,
    use ``protoc --include_imports --descriptor_set_out`` and put its base64 in
    ``KINESIS_CLICK_DESCRIPTOR`` (or an Airflow Variable).
    """
    from google.protobuf import descriptor_pb2

    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="demo/click.proto", package="demo", syntax="proto3")
    meta = proto.message_type.add(name="Meta")
    meta.field.add(name="browser", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    meta.field.add(name="width", number=2, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    click = proto.message_type.add(name="Click")
    click.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    click.field.add(name="page", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    click.field.add(name="tags", number=3, type=f.TYPE_STRING, label=f.LABEL_REPEATED)
    click.field.add(name="meta", number=4, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL, type_name=".demo.Meta")
    return base64.b64encode(descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString()).decode("ascii")


CLICK_DESCRIPTOR = os.environ.get("KINESIS_CLICK_DESCRIPTOR") or click_descriptor()


# [START howto_operator_kinesis_typed_records]
@dag(
    dag_id="kinesis_typed",
    schedule=timedelta(minutes=10),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=3)},  # above the 120 s lease
    tags=["kinesis", "spark", "iceberg", "delta", "typed", "example"],
)
def kinesis_typed():
    # JSON in the Glue Schema Registry's wire format: each record names its schema version.
    KinesisToSparkOperator(
        task_id="ingest_orders_json",
        stream_name=ORDERS_JSON,
        consumer_name="orders-json-iceberg",
        checkpoint_table=CHECKPOINTS,
        output_settings=OutputSettings(format="iceberg", table="lake.orders_json", catalog_properties=CATALOG),
        output_path=f"{ROOT}/iceberg/orders_json",
        record_settings=RecordSettings(format="json", registry={"registry_name": REGISTRY, "schema_name": "orders-json"},
                                       max_dead_letter_fraction=MAX_DEAD_LETTERS),
        spark_settings=SparkSettings(conn_id=SPARK),
        lease_seconds=LEASE,
    )
    # Avro in the same wire format, into a Delta table.
    KinesisToSparkOperator(
        task_id="ingest_orders_avro",
        stream_name=ORDERS_AVRO,
        consumer_name="orders-avro-delta",
        checkpoint_table=CHECKPOINTS,
        output_settings=OutputSettings(format="delta"),
        output_path=f"{ROOT}/delta/orders_avro",
        record_settings=RecordSettings(format="avro", registry={"registry_name": REGISTRY, "schema_name": "orders-avro"},
                                       max_dead_letter_fraction=MAX_DEAD_LETTERS),
        spark_settings=SparkSettings(conn_id=SPARK),
        lease_seconds=LEASE,
    )
    # Plain protobuf messages (no registry header): the schema inline.
    KinesisToSparkOperator(
        task_id="ingest_clicks",
        stream_name=CLICKS,
        consumer_name="clicks-iceberg",
        checkpoint_table=CHECKPOINTS,
        output_settings=OutputSettings(format="iceberg", table="lake.clicks", catalog_properties=CATALOG),
        output_path=f"{ROOT}/iceberg/clicks",
        record_settings=RecordSettings(format="protobuf", schema=CLICK_DESCRIPTOR, message="demo.Click",
                                       max_dead_letter_fraction=MAX_DEAD_LETTERS),
        spark_settings=SparkSettings(conn_id=SPARK),
        lease_seconds=LEASE,
    )


# [END howto_operator_kinesis_typed_records]


@dag(dag_id="kinesis_typed_window", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
     tags=["kinesis", "spark", "iceberg", "typed", "example", "backfill"])  # fmt: skip
def kinesis_typed_window():
    KinesisWindowToSparkOperator(
        task_id="window_orders_json",
        stream_name=ORDERS_JSON,
        consumer_name="orders-json-backfill",
        output_settings=OutputSettings(format="iceberg", table="lake.orders_json_window", catalog_properties=CATALOG),
        output_path=f"{ROOT}/iceberg/orders_json_window",
        record_settings=RecordSettings(format="json", registry={"registry_name": REGISTRY, "schema_name": "orders-json"},
                                       max_dead_letter_fraction=MAX_DEAD_LETTERS),
        spark_settings=SparkSettings(conn_id=SPARK),
        window_start=os.environ.get("KINESIS_WINDOW_START", "{{ (data_interval_end - macros.timedelta(hours=1)).isoformat() }}"),
        window_end=os.environ.get("KINESIS_WINDOW_END", "{{ data_interval_end.isoformat() }}"),
    )


kinesis_typed()
kinesis_typed_window()
