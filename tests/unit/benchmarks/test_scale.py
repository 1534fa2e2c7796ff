"""The scale benchmark's call counting and report section (no emulator: botocore's Stubber, and a
result as run_scale returns it)."""

from __future__ import annotations

import boto3
from botocore.stub import Stubber

from benchmarks.scale import _CallCounter, scale_headline, scale_markdown, scale_targets

RESULT = {
    "records_per_shard": 20, "repeat": 1, "pool_full_warnings": 0,
    "median_s": {"4": {"no_data": 0.5, "small": 2.0}, "256": {"no_data": 3.0, "small": 5.0}},
    "runs": {
        "4": {"no_data": [0.5], "no_data_emulator_cpu": [0.1], "small": [2.0], "records": [80],
              "no_data_calls": [{"dynamodb.GetItem": 1, "dynamodb.Query": 1, "kinesis.GetRecords": 4, "kinesis.GetShardIterator": 4}],
              "small_calls": [{"dynamodb.PutItem": 3, "kinesis.GetRecords": 4, "kinesis.GetShardIterator": 4}],
              "small_kinesis_reads": [20]},
        "256": {"no_data": [3.0], "no_data_emulator_cpu": [1.5], "small": [5.0], "records": [5120],
                "no_data_calls": [{"dynamodb.GetItem": 1, "kinesis.GetRecords": 256, "kinesis.GetShardIterator": 256}],
                "small_calls": [{"dynamodb.PutItem": 258, "kinesis.GetRecords": 10, "kinesis.GetShardIterator": 10}],
                "small_kinesis_reads": [788]},
    },
}  # fmt: skip


def test_the_call_counter_counts_each_clients_calls_while_entered_only():
    kinesis = boto3.client("kinesis", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    with Stubber(kinesis) as stub:
        for _ in range(3):
            stub.add_response("list_streams", {"StreamNames": [], "HasMoreStreams": False})
        counter = _CallCounter()
        with counter:
            kinesis.list_streams()
            kinesis.list_streams()
        kinesis.list_streams()  # after the exit: not counted
    assert counter.take() == {"kinesis.ListStreams": 2}
    assert counter.take() == {}


def test_the_report_gives_each_shard_counts_calls_and_the_targets():
    text = "\n".join(scale_markdown(RESULT))
    assert "| 4 | 8 / 2 | 8 / 3 | 20 | 2 |" in text
    assert "| 256 | 512 / 1 | 20 / 258 | 788 | 2 |" in text
    assert scale_targets(RESULT) == [
        ("no-data run at 256 shards < 2 s", "3.00 s", False),
        ("warm small batch at 256 shards <= 3x the 4-shard one", "2.50x", True),
        ("no connection-pool warnings", "0", True),
        ("fewer than 2 Kinesis calls per idle shard (no-data run, every shard count)", "2 (at 4 shards)", False),
    ]


def test_larger_counts_are_held_to_the_time_per_shard_at_256_and_give_calls_per_idle_shard():
    result = {**RESULT, "median_s": {**RESULT["median_s"], "4096": {"no_data": 40.0, "small": 96.0}},
              "runs": {**RESULT["runs"], "4096": {"no_data": [40.0], "small": [96.0], "records": [81920],
                                                  "no_data_calls": [{"kinesis.GetRecords": 4096, "kinesis.ListShards": 5}],
                                                  "small_calls": [{}], "small_kinesis_reads": [9000]}}}  # fmt: skip
    targets = scale_targets(result)
    # per shard: 40/4096 against 3/256 is 0.83x; 96/4096 against 5/256 is 1.20x
    assert ("no-data run: time per shard at 4096 shards <= 1.2x that at 256", "0.83x", True) in targets
    assert ("warm small batch: time per shard at 4096 shards <= 1.2x that at 256", "1.20x", True) in targets
    assert targets[-1] == ("fewer than 2 Kinesis calls per idle shard (no-data run, every shard count)", "2 (at 4 shards)", False)
    assert scale_headline(result)["4096"] == {"no_data_s": 40.0, "small_batch_s": 96.0, "kinesis_calls_per_idle_shard": 1.001}
