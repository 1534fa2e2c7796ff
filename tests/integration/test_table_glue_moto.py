"""Tables on AWS, locally: Iceberg in the Glue Data Catalog and Delta on S3, against a moto
server over HTTP (Glue and S3 on 127.0.0.1), through the sinks as the operators use them.

What pyiceberg needs of Glue and moto (5.2.5) implements: CreateDatabase, CreateTable, GetTable,
UpdateTable, and S3 for the metadata and data files. What moto lacks: UpdateTable ignores
``VersionId``, the optimistic-concurrency check the real Glue makes (a stale version is refused
with ConcurrentModificationException). pyiceberg also compares the table's metadata location
before it updates, so a writer that loaded an older version still conflicts and retries on moto;
only a race between that check and the update goes undetected here (never on the real service).
The xfail below records it and turns into a failure (strict) once moto checks ``VersionId``."""

from __future__ import annotations

import io
from datetime import datetime, timezone
from types import SimpleNamespace

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError

from airflow_kinesis_spark.sinks.iceberg import SUMMARY_BATCH, IcebergSink

pytestmark = [pytest.mark.integration]

CREATED = datetime(2024, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def glue(moto_endpoint, unique_name):
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")  # fmt: skip
    s3.create_bucket(Bucket=unique_name)
    storage = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": moto_endpoint}  # fmt: skip
    catalog = {"type": "glue", "glue.endpoint": moto_endpoint, "glue.region": "us-east-1", "glue.access-key-id": "testing",
               "glue.secret-access-key": "testing"}  # fmt: skip
    sink = IcebergSink(f"{unique_name}.events", catalog, f"s3://{unique_name}/events", storage_options=storage)
    return s3, sink, unique_name


def put_batch(s3, bucket: str, batch_id: int, day: int, rows: int) -> None:
    arrival = pa.array([datetime(2024, 1, day, 1, i, tzinfo=timezone.utc) for i in range(rows)], pa.timestamp("us", tz="UTC"))
    table = pa.table({"stream_name": ["s"] * rows, "sequence_number": [f"{batch_id}-{i}" for i in range(rows)],
                      "approximate_arrival_timestamp": arrival})  # fmt: skip
    body = io.BytesIO()
    pq.write_table(table, body)
    s3.put_object(Bucket=bucket, Key=f"events/batch_id={batch_id}/_p0=2024-01-{day:02d}/part-0.parquet", Body=body.getvalue())


def plan(bucket: str, batch_id: int) -> SimpleNamespace:
    return SimpleNamespace(batch_id=batch_id, stream_name="s", consumer_name="c", created_at=CREATED, mode="incremental",
                           output_location=f"s3://{bucket}/events/batch_id={batch_id}")  # fmt: skip


def test_batches_commit_to_a_glue_table_once_each(glue):
    s3, sink, bucket = glue
    for batch_id in (1, 2):
        put_batch(s3, bucket, batch_id, batch_id, 5)
        first = sink.commit_batch(plan(bucket, batch_id), [])
        again = sink.commit_batch(plan(bucket, batch_id), [])  # a re-run: found in the table
        assert not first.already_committed and again.already_committed and again.snapshot_id == first.snapshot_id
    table = sink.load()
    assert [s.summary.additional_properties[SUMMARY_BATCH] for s in table.metadata.snapshots] == ["1", "2"]
    assert table.scan().to_arrow().num_rows == 10
    assert table.metadata.location == f"s3://{bucket}/events"
    glue_table = boto3.client("glue", endpoint_url=sink.catalog_properties["glue.endpoint"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing").get_table(
        DatabaseName=bucket, Name="events")["Table"]  # fmt: skip
    assert glue_table["Parameters"]["table_type"].upper() == "ICEBERG"


@pytest.mark.xfail(strict=True, reason="moto 5.2.5: Glue UpdateTable ignores VersionId (the real service refuses a stale "
                   "one with ConcurrentModificationException)")
def test_glue_refuses_an_update_from_a_stale_version(glue):
    s3, sink, bucket = glue
    put_batch(s3, bucket, 1, 1, 3)
    sink.commit_batch(plan(bucket, 1), [])
    client = boto3.client("glue", endpoint_url=sink.catalog_properties["glue.endpoint"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
    current = client.get_table(DatabaseName=bucket, Name="events")["Table"]
    stale = current["VersionId"]
    put_batch(s3, bucket, 2, 2, 3)
    sink.commit_batch(plan(bucket, 2), [])  # moves the table to a new version
    table_input = {"Name": "events", "TableType": current.get("TableType", "EXTERNAL_TABLE"), "Parameters": current["Parameters"]}
    with pytest.raises(ClientError, match="ConcurrentModification"):
        client.update_table(DatabaseName=bucket, TableInput=table_input, VersionId=stale)


def test_two_writers_of_one_version_conflict_and_the_second_retries(glue, caplog):
    s3, sink, bucket = glue
    put_batch(s3, bucket, 1, 1, 3)
    sink.commit_batch(plan(bucket, 1), [])
    put_batch(s3, bucket, 2, 2, 3)
    sink.commit_batch(plan(bucket, 2), [])
    # Two writers that loaded the same version: the second commit conflicts, pyiceberg retries it
    # on the refreshed table, and both batches' files are in the table once.
    t1, t2 = sink.load(), sink.load()
    put_batch(s3, bucket, 3, 3, 2)
    put_batch(s3, bucket, 4, 4, 2)
    t1.add_files([f"s3://{bucket}/events/batch_id=3/_p0=2024-01-03/part-0.parquet"])
    with caplog.at_level("WARNING"):
        t2.add_files([f"s3://{bucket}/events/batch_id=4/_p0=2024-01-04/part-0.parquet"])  # loaded before t1's commit
    assert "concurrent update" in caplog.text  # pyiceberg saw the conflict and retried on the refreshed table
    assert sorted(sink.load().scan().to_arrow().column("sequence_number").to_pylist()) == sorted(
        [f"{b}-{i}" for b, n in ((1, 3), (2, 3), (3, 2), (4, 2)) for i in range(n)]
    )


def test_a_delta_table_on_s3_commits_each_batch_once(moto_endpoint, unique_name):
    """DeltaSink on moto's S3 with delta-rs's conditional writes (``aws_conditional_put``: the
    library's safe concurrent commits on S3, no lock table): a re-run finds its batch in the
    table's log (read directly: delta-rs's ``history()`` never returned on moto's S3)."""
    from deltalake import DeltaTable

    from airflow_kinesis_spark.sinks.delta import DeltaSink

    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")  # fmt: skip
    s3.create_bucket(Bucket=unique_name)
    storage = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": moto_endpoint, "AWS_ALLOW_HTTP": "true", "aws_conditional_put": "etag"}  # fmt: skip
    sink = DeltaSink(f"s3a://{unique_name}/delta", storage_options=storage)
    for batch_id in (1, 2):
        arrival = pa.array([datetime(2024, 1, 1, 1, i, tzinfo=timezone.utc) for i in range(4)], pa.timestamp("us", tz="UTC"))
        rows = pa.table({"stream_name": ["s"] * 4, "sequence_number": [f"{batch_id}-{i}" for i in range(4)],
                         "approximate_arrival_timestamp": arrival, "arrival_date": pa.array([arrival[0].as_py().date()] * 4, pa.date32())})  # fmt: skip
        body = io.BytesIO()
        pq.write_table(rows, body)
        s3.put_object(Bucket=unique_name, Key=f"delta/batch_id={batch_id}/_p0=2024-01-01/part-0.parquet", Body=body.getvalue())
        batch = SimpleNamespace(batch_id=batch_id, stream_name="s", consumer_name="c", created_at=CREATED, mode="incremental",
                                output_location=f"s3a://{unique_name}/delta/batch_id={batch_id}")  # fmt: skip
        first, again = sink.commit_batch(batch, []), sink.commit_batch(batch, [])
        assert (first.version, first.already_committed, again.version, again.already_committed) == (batch_id - 1, False, batch_id - 1, True)
    table = DeltaTable(f"s3://{unique_name}/delta", storage_options=storage)
    assert table.version() == 1 and pa.table(table.to_pyarrow_table()).num_rows == 8
    assert table.transaction_version("airflow-kinesis-spark:s:c") == 2
