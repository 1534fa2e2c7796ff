"""A read that outlives its shard iterator renews it after the last record read and loses nothing."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.shards import list_shards
from demo.producer import put_aggregated, put_plain, verify
from tests.conftest import create_stream, make_client
from tests.reliability.fault_proxy import FaultProxy

pytestmark = pytest.mark.reliability


def test_expired_iterators_are_renewed_without_loss_or_duplicates(moto_endpoint, kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"plain {i}".encode()) for i in range(300)])
    produced += put_aggregated(kinesis, unique_name, [(f"a{i % 3}", f"agg {i}".encode()) for i in range(200)])
    proxy = FaultProxy(moto_endpoint).start()
    proxy.expire_every = 4  # every 4th GetRecords: the iterator "expired"
    try:
        client = make_client("kinesis", proxy.endpoint)
        now = datetime.now(timezone.utc)
        (rng,) = plan_incremental(batch_id=1, stream_name=unique_name, consumer_name="c", shards=list_shards(client, unique_name),
                                  checkpoints={}, cutoff=now, now=now, output_location="x").ranges  # fmt: skip
        records, report = ShardReader(client, unique_name, rng, limit=25, min_call_interval=0).read_all()
    finally:
        proxy.stop()
    assert report.expired_iterators >= 3 and proxy.injected["ExpiredIteratorException"] == report.expired_iterators
    rows = [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, r.data) for r in records]
    assert verify(produced, rows).ok and len(rows) == 500
