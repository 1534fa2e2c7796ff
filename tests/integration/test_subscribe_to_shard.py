"""The one local SubscribeToShard (demo.subscribe.ShardSubscriptions) over HTTP in front of a moto
server, read with boto3's own ``subscribe_to_shard``: served by the benchmark's Kinesis-limits
proxy (benchmarks.kinesis_limits.ThrottlingProxy) and by demo.subscribe.FanOutProxy."""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlparse

import pytest
from botocore.config import Config
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import ClientError, EventStreamError

from benchmarks.kinesis_limits import MIB, KinesisLimits, ThrottlingProxy
from demo.producer import put_aggregated, put_plain
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = [pytest.mark.integration]


def client(endpoint: str):
    """A client through the proxy that makes one attempt per call (refusals surface as they are)."""
    import boto3

    return boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=TEST_ACCESS_KEY,
                        aws_secret_access_key=TEST_SECRET_KEY,
                        config=Config(retries={"mode": "standard", "total_max_attempts": 1}))  # fmt: skip


@pytest.fixture
def stream(kinesis, unique_name):
    yield unique_name
    kinesis.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)


def register(c, stream: str, name: str = "efo") -> str:
    """A consumer registered through the proxy (moto's); its ARN."""
    arn = c.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    consumer = c.register_stream_consumer(StreamARN=arn, ConsumerName=name)["Consumer"]
    assert c.describe_stream_consumer(ConsumerARN=consumer["ConsumerARN"])["ConsumerDescription"]["ConsumerStatus"] == "ACTIVE"
    return consumer["ConsumerARN"]


def only_shard(kinesis, stream: str) -> str:
    (shard,) = kinesis.list_shards(StreamName=stream)["Shards"]
    return shard["ShardId"]


def polled(kinesis, stream: str, shard_id: str, after: str | None = None) -> list[dict]:
    """The shard's records as GetRecords returns them (straight from moto)."""
    kind = {"ShardIteratorType": "TRIM_HORIZON"}
    if after:
        kind = {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": after}
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id, **kind)["ShardIterator"]
    return kinesis.get_records(ShardIterator=iterator, Limit=10_000)["Records"]


def events(response) -> list[tuple[float, dict]]:
    """Every SubscribeToShardEvent until the stream ends, with the time it arrived."""
    return [(time.monotonic(), e["SubscribeToShardEvent"]) for e in response["EventStream"]]


def pushed(received: list[tuple[float, dict]]) -> list[dict]:
    return [r for _, e in received for r in e["Records"]]


def test_a_subscription_pushes_the_shard_as_get_records_returns_it(kinesis, moto_endpoint, stream):
    create_stream(kinesis, stream, 1)
    put_plain(kinesis, stream, [(f"p{i}", f"plain {i}".encode()) for i in range(30)])
    put_aggregated(kinesis, stream, [(f"a{i % 4}", f"aggregated {i}".encode() * 3) for i in range(60)])
    shard_id = only_shard(kinesis, stream)
    expected = polled(kinesis, stream, shard_id)
    assert len(expected) == 34  # 30 plain, 4 aggregates of 15 user records
    with ThrottlingProxy(moto_endpoint, KinesisLimits(subscription_seconds=2.5)) as proxy:
        c = client(proxy.endpoint)
        arn = register(c, stream)
        assert [x["ConsumerARN"] for x in c.list_stream_consumers(StreamARN=arn.split("/consumer/")[0])["Consumers"]] == [arn]
        started = time.monotonic()
        response = c.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id, StartingPosition={"Type": "TRIM_HORIZON"})
        assert response["ResponseMetadata"]["HTTPHeaders"]["content-type"] == "application/vnd.amazon.eventstream"
        received = events(response)  # ends by itself after 2.5 s
        ended = time.monotonic()
        assert pushed(received) == expected  # same records, same fields, same order
        assert received[0][1]["Records"] and all("ChildShards" not in e for _, e in received)
        continuations = [e["ContinuationSequenceNumber"] for _, e in received]
        assert continuations[0] == expected[-1]["SequenceNumber"] and set(continuations) == {expected[-1]["SequenceNumber"]}
        assert all(e["MillisBehindLatest"] >= 0 for _, e in received)
        # Flushed as produced: the records came at once, then an empty event about every second
        # while caught up, until the subscription ended.
        assert received[0][0] - started < ended - started - 1.5 and len(received) >= 3
        assert ended - started >= 2.5 * 0.95
        data = sum(len(r["Data"]) for r in expected)
        assert proxy.stats[f"SubscribeToShard.subscriptions:{stream}"] == 1
        assert proxy.stats[f"SubscribeToShard.records:{stream}"] == 34 and proxy.stats[f"SubscribeToShard.bytes:{stream}"] == data
        assert proxy.stats[f"SubscribeToShard.expired:{stream}"] == 1
        assert proxy.stats["GetRecords"] == 0  # the proxy's own reads are not the caller's
        assert proxy.subscriptions.open_subscriptions() == 0


def test_the_wire_is_a_chunked_event_stream_that_starts_with_initial_response(kinesis, moto_endpoint, stream):
    create_stream(kinesis, stream, 1)
    put_plain(kinesis, stream, [("k", b"one"), ("k", b"two")])
    with ThrottlingProxy(moto_endpoint, KinesisLimits(subscription_seconds=0.5)) as proxy:
        arn = register(client(proxy.endpoint), stream)
        endpoint = urlparse(proxy.endpoint)
        conn = http.client.HTTPConnection(endpoint.hostname, endpoint.port, timeout=10)
        body = {"ConsumerARN": arn, "ShardId": only_shard(kinesis, stream), "StartingPosition": {"Type": "TRIM_HORIZON"}}
        conn.request("POST", "/", json.dumps(body), {"X-Amz-Target": "Kinesis_20131202.SubscribeToShard",
                                                     "Content-Type": "application/x-amz-json-1.1"})  # fmt: skip
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Transfer-Encoding") == "chunked"
        assert response.getheader("Content-Type") == "application/vnd.amazon.eventstream"
        buffer = EventStreamBuffer()
        buffer.add_data(response.read())  # de-chunked; every message's CRCs are checked here
        messages = list(buffer)
        conn.close()
    heads = [(m.headers[":message-type"], m.headers[":event-type"], m.headers[":content-type"]) for m in messages]
    assert heads[0] == ("event", "initial-response", "application/json") and json.loads(messages[0].payload) == {}
    assert set(heads[1:]) == {("event", "SubscribeToShardEvent", "application/json")}
    first = json.loads(messages[1].payload)
    assert [r["SequenceNumber"] for r in first["Records"]] == ["1", "2"] and first["ContinuationSequenceNumber"] == "2"
    assert isinstance(first["Records"][0]["ApproximateArrivalTimestamp"], float) and first["Records"][0]["Data"] == "b25l"


def test_a_shortened_subscription_ends_mid_shard_and_the_next_continues_without_loss_or_duplicate(kinesis, moto_endpoint, stream):
    create_stream(kinesis, stream, 1)
    put_plain(kinesis, stream, [(f"p{i}", bytes([65 + i % 26]) * 1000) for i in range(50)])
    put_aggregated(kinesis, stream, [(f"a{i % 3}", f"aggregated {i} ".encode() * 40) for i in range(45)])
    put_plain(kinesis, stream, [(f"q{i}", f"tail {i}".encode()) for i in range(10)])
    shard_id = only_shard(kinesis, stream)
    expected = polled(kinesis, stream, shard_id)
    # ~75 KB at 24 KB/s in events of at most 6 KB, subscriptions of 1.2 s: several subscriptions
    limits = KinesisLimits(subscription_seconds=1.2, subscribe_bytes_per_second=24_000, subscribe_event_bytes=6_000)
    with ThrottlingProxy(moto_endpoint, limits) as proxy:
        c = client(proxy.endpoint)
        arn = register(c, stream)
        got: list[dict] = []
        position = {"Type": "TRIM_HORIZON"}
        ends = []
        while len(got) < len(expected) and len(ends) < 15:
            received = events(c.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id, StartingPosition=position))
            got += pushed(received)
            if received:  # (a subscription that ended before its first event leaves the position as it was)
                position = {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": received[-1][1]["ContinuationSequenceNumber"]}
            ends.append(position.get("SequenceNumber", "0"))
        assert got == expected  # nothing lost, nothing twice, in order
        assert len(ends) >= 3 and int(ends[0]) < int(expected[-1]["SequenceNumber"])  # the first ended mid-shard
        assert proxy.stats[f"SubscribeToShard.subscriptions:{stream}"] == len(ends)
        assert proxy.stats[f"SubscribeToShard.expired:{stream}"] == len(ends)
        assert proxy.stats[f"SubscribeToShard.bytes:{stream}"] == sum(len(r["Data"]) for r in expected)


def test_new_records_are_pushed_and_an_idle_continuation_resumes_exactly(kinesis, moto_endpoint, stream):
    create_stream(kinesis, stream, 1)
    before = put_plain(kinesis, stream, [(f"b{i}", f"before {i}".encode()) for i in range(3)])
    shard_id = only_shard(kinesis, stream)
    with ThrottlingProxy(moto_endpoint, KinesisLimits(subscription_seconds=30)) as proxy:
        c = client(proxy.endpoint)
        arn = register(c, stream)
        response = c.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id, StartingPosition={"Type": "LATEST"})
        got: list[dict] = []
        first = None
        for event in response["EventStream"]:
            event = event["SubscribeToShardEvent"]
            if first is None:  # nothing new yet: the continuation is where LATEST started
                first = event
                assert event["Records"] == [] and event["ContinuationSequenceNumber"] == before[-1].sequence_number
                put_plain(kinesis, stream, [(f"n{i}", f"new {i}".encode()) for i in range(4)])
            got += event["Records"]
            if len(got) >= 4:
                break
        response["EventStream"].close()
        continuation = event["ContinuationSequenceNumber"]
        assert got == polled(kinesis, stream, shard_id, after=before[-1].sequence_number)
        assert continuation == got[-1]["SequenceNumber"]

        later = put_plain(kinesis, stream, [(f"l{i}", f"later {i}".encode()) for i in range(2)])
        time.sleep(1.0)  # one call a second (the proxy noticed at once that the subscription was closed)
        response = c.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id,
                                        StartingPosition={"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": continuation})  # fmt: skip
        event = next(iter(response["EventStream"]))["SubscribeToShardEvent"]
        response["EventStream"].close()
        assert [r["SequenceNumber"] for r in event["Records"]] == [p.sequence_number for p in later]
        assert proxy.stats[f"SubscribeToShard.subscriptions:{stream}"] == 2
        assert proxy.stats[f"SubscribeToShard.closed_by_subscriber:{stream}"] >= 1


def test_a_second_concurrent_subscription_is_refused_and_a_late_one_takes_over(kinesis, moto_endpoint, stream):
    create_stream(kinesis, stream, 1)
    put_plain(kinesis, stream, [("k", b"x")])
    shard_id = only_shard(kinesis, stream)
    limits = KinesisLimits(subscription_seconds=30, subscription_takeover_seconds=1.5)
    with ThrottlingProxy(moto_endpoint, limits) as proxy:
        c = client(proxy.endpoint)
        arn, other = register(c, stream), register(c, stream, "other")
        first = c.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id, StartingPosition={"Type": "TRIM_HORIZON"})
        opened = time.monotonic()
        outcome: dict = {"events": 0}

        def hold() -> None:
            try:
                for _ in first["EventStream"]:
                    outcome["events"] += 1
                outcome["ended"] = "cleanly"
            except EventStreamError as error:
                outcome["ended"] = error.response["Error"]["Code"]

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        with pytest.raises(ClientError) as refused:
            c.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id, StartingPosition={"Type": "LATEST"})
        assert refused.value.response["Error"]["Code"] == "ResourceInUseException"
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        # another consumer of the same shard has its own subscription
        parallel = c.subscribe_to_shard(ConsumerARN=other, ShardId=shard_id, StartingPosition={"Type": "TRIM_HORIZON"})
        assert next(iter(parallel["EventStream"]))["SubscribeToShardEvent"]["Records"][0]["Data"] == b"x"
        parallel["EventStream"].close()

        time.sleep(max(0.0, opened + 1.6 - time.monotonic()))  # the first subscription is older than 1.5 s now
        second = c.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id, StartingPosition={"Type": "TRIM_HORIZON"})
        assert next(iter(second["EventStream"]))["SubscribeToShardEvent"]["Records"][0]["Data"] == b"x"
        holder.join(timeout=10)
        assert outcome["ended"] == "ResourceInUseException" and outcome["events"] >= 1  # the old one was taken over
        second["EventStream"].close()
        assert proxy.stats[f"SubscribeToShard.in_use:{stream}"] == 1
        assert proxy.stats[f"SubscribeToShard.taken_over:{stream}"] == 1
        assert proxy.stats[f"SubscribeToShard.subscriptions:{stream}"] == 3


def test_unknown_consumers_and_shards_and_bad_positions_are_refused(kinesis, moto_endpoint, stream):
    create_stream(kinesis, stream, 1)
    shard_id = only_shard(kinesis, stream)
    with ThrottlingProxy(moto_endpoint) as proxy:
        c = client(proxy.endpoint)
        arn = register(c, stream)
        calls = [
            ({"ConsumerARN": arn.replace("/consumer/efo", "/consumer/nobody"), "ShardId": shard_id,
              "StartingPosition": {"Type": "LATEST"}}, "ResourceNotFoundException"),
            ({"ConsumerARN": arn, "ShardId": "shardId-000000000099", "StartingPosition": {"Type": "LATEST"}}, "ResourceNotFoundException"),
            ({"ConsumerARN": arn, "ShardId": shard_id, "StartingPosition": {"Type": "AT_SEQUENCE_NUMBER"}}, "InvalidArgumentException"),
            ({"ConsumerARN": arn, "ShardId": shard_id, "StartingPosition": {"Type": "AT_TIMESTAMP"}}, "InvalidArgumentException"),
        ]  # fmt: skip
        for call, code in calls:
            with pytest.raises(ClientError) as refused:
                c.subscribe_to_shard(**call)
            assert refused.value.response["Error"]["Code"] == code, call
        assert proxy.stats["SubscribeToShard.not_found"] == 2 and proxy.stats["SubscribeToShard.invalid"] == 2
        assert proxy.stats["SubscribeToShard.subscriptions"] == 0


def test_a_split_parent_ends_its_subscription_with_its_child_shards(kinesis, moto_endpoint, stream):
    create_stream(kinesis, stream, 1)
    put_plain(kinesis, stream, [(f"k{i}", f"record {i}".encode()) for i in range(8)])
    parent = only_shard(kinesis, stream)
    expected = polled(kinesis, stream, parent)
    with ThrottlingProxy(moto_endpoint, KinesisLimits(subscription_seconds=30)) as proxy:
        c = client(proxy.endpoint)
        arn = register(c, stream)
        response = c.subscribe_to_shard(ConsumerARN=arn, ShardId=parent, StartingPosition={"Type": "TRIM_HORIZON"})
        received = []
        for event in response["EventStream"]:  # ends by itself at the parent's end
            received.append(event["SubscribeToShardEvent"])
            if len(pushed([(0, e) for e in received])) == 8 and len(received) == 1:
                hash_range = kinesis.list_shards(StreamName=stream)["Shards"][0]["HashKeyRange"]
                middle = (int(hash_range["StartingHashKey"]) + int(hash_range["EndingHashKey"])) // 2
                kinesis.split_shard(StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(middle))
        assert pushed([(0, e) for e in received]) == expected
        last = received[-1]
        children = [{"ShardId": s["ShardId"], "ParentShards": [parent], "HashKeyRange": s["HashKeyRange"]}
                    for s in kinesis.list_shards(StreamName=stream)["Shards"] if s.get("ParentShardId") == parent]  # fmt: skip
        assert len(children) == 2 and last["ChildShards"] == children
        assert "ContinuationSequenceNumber" not in last
        assert all("ChildShards" not in e for e in received[:-1])

        # From after its last record, the parent's end comes at once, as the only event.
        after_last = {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": expected[-1]["SequenceNumber"]}
        (only,) = [e["SubscribeToShardEvent"] for e in c.subscribe_to_shard(ConsumerARN=arn, ShardId=parent,
                                                                            StartingPosition=after_last)["EventStream"]]  # fmt: skip
        assert only["Records"] == [] and only["ChildShards"] == children and "ContinuationSequenceNumber" not in only
        # Subscribed again at once: one call a second per consumer and shard.
        with pytest.raises(ClientError) as limited:
            c.subscribe_to_shard(ConsumerARN=arn, ShardId=parent, StartingPosition=after_last)
        assert limited.value.response["Error"]["Code"] == "LimitExceededException"
        assert proxy.stats[f"SubscribeToShard.shard_end:{stream}"] == 2
        assert proxy.stats[f"SubscribeToShard.limit_exceeded:{stream}"] == 1, dict(proxy.stats)


def test_pushing_is_paced_to_2_mib_per_second_per_consumer_and_shard(kinesis, moto_endpoint, stream):
    create_stream(kinesis, stream, 1)
    blob = bytes(range(256)) * 400  # 100 KiB
    for batch in range(5):  # 5 MiB, 1 MiB per PutRecords
        put_plain(kinesis, stream, [(f"k{batch}-{i}", blob) for i in range(10)])
    total = 50 * len(blob)
    with ThrottlingProxy(moto_endpoint, KinesisLimits(subscription_seconds=60)) as proxy:
        c = client(proxy.endpoint)
        arn = register(c, stream)
        started = time.monotonic()
        response = c.subscribe_to_shard(ConsumerARN=arn, ShardId=only_shard(kinesis, stream), StartingPosition={"Type": "TRIM_HORIZON"})
        sizes, arrivals = [], []
        for event in response["EventStream"]:
            records = event["SubscribeToShardEvent"]["Records"]
            sizes.append(sum(len(r["Data"]) for r in records))
            arrivals.append(time.monotonic())
            if sum(sizes) >= total:
                break
        response["EventStream"].close()
        elapsed = arrivals[-1] - started
        assert sum(sizes) == total and max(sizes) <= 1 * MIB
        # The first event goes at once; every byte after it waits its turn at 2 MiB/s.
        assert elapsed >= 0.9 * (total - sizes[0]) / (2 * MIB), (elapsed, sizes)
        assert arrivals[0] - started < elapsed - 1.0  # and events arrive while the rest is paced
        assert proxy.stats[f"SubscribeToShard.bytes:{stream}"] == total


def test_consumers_reading_one_shard_at_once_get_it_all_from_one_read_of_the_emulator(kinesis, moto_endpoint, stream):
    create_stream(kinesis, stream, 1)
    blob = bytes(range(256)) * 120  # 30 KiB
    put_plain(kinesis, stream, [(f"k{i}", blob + b"%d" % i) for i in range(20)])
    shard_id = only_shard(kinesis, stream)
    expected = polled(kinesis, stream, shard_id)
    total = sum(len(r["Data"]) for r in expected)
    # ~600 KB at 300 KB/s per consumer, in events of at most 60 KB: about 2 s each, side by side
    limits = KinesisLimits(subscription_seconds=30, subscribe_bytes_per_second=300_000, subscribe_event_bytes=60_000)
    with ThrottlingProxy(moto_endpoint, limits) as proxy:
        c = client(proxy.endpoint)
        arns = [register(c, stream, f"team-{i}") for i in range(3)]
        got: dict[str, list[dict]] = {arn: [] for arn in arns}
        took: dict[str, float] = {}

        def read(arn: str) -> None:
            started = time.monotonic()
            response = c.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id, StartingPosition={"Type": "TRIM_HORIZON"})
            for event in response["EventStream"]:
                got[arn] += event["SubscribeToShardEvent"]["Records"]
                if len(got[arn]) >= len(expected):
                    break
            took[arn] = time.monotonic() - started
            response["EventStream"].close()

        threads = [threading.Thread(target=read, args=(arn,), daemon=True) for arn in arns]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        for arn in arns:
            assert got[arn] == expected  # every consumer: every record, once, in order, as GetRecords returns it
            # paced per consumer, not shared: each took about total / rate, not three times that
            assert 0.9 * (total - 60_000) / 300_000 <= took[arn] < 3 * total / 300_000, took
        # Each record was read from the emulator once and pushed to the two other consumers from that read.
        assert proxy.stats[f"SubscribeToShard.shared_records:{stream}"] == 2 * len(expected)
        assert proxy.stats[f"SubscribeToShard.records:{stream}"] == 3 * len(expected)
        deadline = time.monotonic() + 10  # the proxy sees the subscribers go at its next event or check
        while proxy.subscriptions.open_subscriptions() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.subscriptions.open_subscriptions() == 0
        assert proxy.subscriptions.shared == {}  # what was read is dropped with the last subscription


def test_the_proxy_keeps_stream_consumers_for_an_emulator_without_them(kinesalite_endpoint, unique_name):
    """kinesalite has no stream consumers: with ``own_consumers=True`` the proxy answers their four
    calls as the Kinesis API reference describes them, and subscriptions use its consumers."""
    from demo.subscribe import FanOutProxy

    with FanOutProxy(kinesalite_endpoint, own_consumers=True) as proxy:
        c = client(proxy.endpoint)
        create_stream(c, unique_name, 1)
        arn = c.describe_stream_summary(StreamName=unique_name)["StreamDescriptionSummary"]["StreamARN"]
        with pytest.raises(ClientError, match="ResourceNotFoundException"):
            c.register_stream_consumer(StreamARN=arn.replace(unique_name, f"{unique_name}-gone"), ConsumerName="efo")
        consumer = c.register_stream_consumer(StreamARN=arn, ConsumerName="efo")["Consumer"]
        assert consumer["ConsumerStatus"] == "CREATING" and consumer["ConsumerARN"].startswith(f"{arn}/consumer/efo:")
        with pytest.raises(ClientError, match="ResourceInUseException"):
            c.register_stream_consumer(StreamARN=arn, ConsumerName="efo")
        shard_id = c.list_shards(StreamName=unique_name)["Shards"][0]["ShardId"]
        with pytest.raises(ClientError, match="ResourceInUseException"):  # not ACTIVE yet
            c.subscribe_to_shard(ConsumerARN=consumer["ConsumerARN"], ShardId=shard_id, StartingPosition={"Type": "TRIM_HORIZON"})
        time.sleep(0.3)
        described = c.describe_stream_consumer(StreamARN=arn, ConsumerName="efo")["ConsumerDescription"]
        assert (described["ConsumerStatus"], described["StreamARN"]) == ("ACTIVE", arn)
        assert c.describe_stream_consumer(ConsumerARN=consumer["ConsumerARN"])["ConsumerDescription"] == described
        assert [x["ConsumerName"] for x in c.list_stream_consumers(StreamARN=arn)["Consumers"]] == ["efo"]
        put_plain(c, unique_name, [("k", b"pushed")])
        events = c.subscribe_to_shard(ConsumerARN=consumer["ConsumerARN"], ShardId=shard_id,
                                      StartingPosition={"Type": "TRIM_HORIZON"})["EventStream"]  # fmt: skip
        records = next(e for e in events if e.get("SubscribeToShardEvent", {}).get("Records"))["SubscribeToShardEvent"]["Records"]
        events.close()
        assert [r["Data"] for r in records] == [b"pushed"]
        c.deregister_stream_consumer(ConsumerARN=consumer["ConsumerARN"])
        with pytest.raises(ClientError, match="ResourceNotFoundException"):
            c.describe_stream_consumer(ConsumerARN=consumer["ConsumerARN"])
        assert c.list_stream_consumers(StreamARN=arn)["Consumers"] == []
