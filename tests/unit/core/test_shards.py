"""Shard listing against fake clients: one pager (ListShardsPager), driven sync (boto3) and async
(aiobotocore) — the real API's paging rules, moto's quirk, a missing stream."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from botocore.exceptions import ClientError

from airflow_kinesis_spark.core import aio
from airflow_kinesis_spark.core.shards import ListShardsPager, Shard, describe_stream_summary, list_shards
from airflow_kinesis_spark.exceptions import StreamAccessDeniedError, StreamNotFoundError


def error(code: str, operation: str = "ListShards") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, operation)


def api_shard(n: int) -> dict[str, Any]:
    return {
        "ShardId": f"shardId-{n:012d}",
        "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"},
        "SequenceNumberRange": {"StartingSequenceNumber": str(n)},
    }


class _Meta:
    region_name = "eu-central-1"
    endpoint_url = "http://127.0.0.1:1"


class PagingKinesis:
    """ListShards in pages of ``page_size``, as a boto3 client.

    ``name_with_token``: "reject" (the real API: StreamName next to NextToken is an error),
    "require" (moto's server: NextToken alone is "inconsistent with page token", InvalidToken).
    """

    meta = _Meta()

    def __init__(self, count: int, page_size: int, name_with_token: str, stream: str = "s") -> None:
        self.shards = [api_shard(i) for i in range(count)]
        self.page_size = page_size
        self.name_with_token = name_with_token
        self.stream = stream
        self.calls: list[dict[str, Any]] = []
        self.fail_on_call: dict[int, ClientError] = {}  # call index -> error to raise instead

    def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        if len(self.calls) - 1 in self.fail_on_call:
            raise self.fail_on_call[len(self.calls) - 1]
        token = kwargs.get("NextToken")
        if token is None:
            if kwargs.get("StreamName") != self.stream:
                raise error("ResourceNotFoundException")
            start = 0
        else:
            if "StreamName" in kwargs and self.name_with_token == "reject":
                raise error("InvalidArgumentException")
            if "StreamName" not in kwargs and self.name_with_token == "require":
                raise error("InvalidToken")
            if "StreamName" in kwargs and kwargs["StreamName"] != self.stream:
                raise error("ResourceNotFoundException")
            start = int(token)
        end = start + self.page_size
        page: dict[str, Any] = {"Shards": self.shards[start:end]}
        if end < len(self.shards):
            page["NextToken"] = str(end)
        return page

    def describe_stream_summary(self, StreamName: str) -> dict[str, Any]:  # noqa: N803 - the API's name
        if StreamName != self.stream:
            raise error("ResourceNotFoundException", "DescribeStreamSummary")
        return {"StreamDescriptionSummary": {"StreamName": StreamName, "RetentionPeriodHours": 24}}


class AsyncKinesis:
    """The same fake as an aiobotocore client (coroutine methods)."""

    def __init__(self, fake: PagingKinesis) -> None:
        self.fake = fake
        self.meta = fake.meta

    async def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return self.fake.list_shards(**kwargs)

    async def describe_stream_summary(self, **kwargs: Any) -> dict[str, Any]:
        return self.fake.describe_stream_summary(**kwargs)


def sync_list(fake: PagingKinesis, stream: str, shard_filter: Mapping[str, Any] | None = None) -> list[Shard]:
    return list_shards(fake, stream, shard_filter)


def async_list(fake: PagingKinesis, stream: str, shard_filter: Mapping[str, Any] | None = None) -> list[Shard]:
    return asyncio.run(aio.list_shards(AsyncKinesis(fake), stream, shard_filter))


DRIVERS: dict[str, Callable[..., list[Shard]]] = {"sync": sync_list, "async": async_list}


@pytest.fixture(params=sorted(DRIVERS))
def lister(request) -> Callable[..., list[Shard]]:
    return DRIVERS[request.param]


@pytest.mark.parametrize("mode", ["reject", "require"])
def test_list_shards_pages_through_every_shard(lister, mode):
    client = PagingKinesis(count=2500, page_size=1000, name_with_token=mode)
    shards = lister(client, "s")
    assert [s.shard_id for s in shards] == [f"shardId-{i:012d}" for i in range(2500)]


def test_real_api_gets_the_token_alone(lister):
    client = PagingKinesis(count=25, page_size=10, name_with_token="reject")
    lister(client, "s")
    assert client.calls == [{"StreamName": "s"}, {"NextToken": "10"}, {"NextToken": "20"}]


def test_moto_quirk_resends_the_name_once_refused(lister):
    client = PagingKinesis(count=25, page_size=10, name_with_token="require")
    assert len(lister(client, "s")) == 25
    assert client.calls == [
        {"StreamName": "s"},
        {"NextToken": "10"},
        {"NextToken": "10", "StreamName": "s"},
        {"NextToken": "20", "StreamName": "s"},
    ]


def test_shard_filter_goes_with_the_first_request_only(lister):
    client = PagingKinesis(count=15, page_size=10, name_with_token="reject")
    shard_filter = {"Type": "AT_LATEST"}
    lister(client, "s", shard_filter)
    assert client.calls == [{"StreamName": "s", "ShardFilter": {"Type": "AT_LATEST"}}, {"NextToken": "10"}]


def test_missing_stream_names_stream_region_and_endpoint(lister):
    client = PagingKinesis(count=1, page_size=10, name_with_token="reject")
    with pytest.raises(StreamNotFoundError) as info:
        lister(client, "nope")
    err = info.value
    assert "'nope'" in str(err) and "eu-central-1" in str(err) and "http://127.0.0.1:1" in str(err)
    assert (err.stream_name, err.region, err.endpoint) == ("nope", "eu-central-1", "http://127.0.0.1:1")
    assert isinstance(err.__cause__, ClientError)
    assert client.calls == [{"StreamName": "nope"}]


def test_a_stream_gone_between_pages_on_moto_is_not_found_after_one_retry(lister):
    client = PagingKinesis(count=25, page_size=10, name_with_token="require")
    client.fail_on_call[2] = error("ResourceNotFoundException")  # the retry with the name: deleted meanwhile
    with pytest.raises(StreamNotFoundError):
        lister(client, "s")
    assert len(client.calls) == 3


def test_a_stream_gone_between_pages_on_the_real_api_is_not_found_at_once(lister):
    client = PagingKinesis(count=25, page_size=10, name_with_token="reject")
    client.fail_on_call[1] = error("ResourceNotFoundException")
    with pytest.raises(StreamNotFoundError):
        lister(client, "s")
    assert client.calls == [{"StreamName": "s"}, {"NextToken": "10"}]  # no retry with the name


@pytest.mark.parametrize("call", [0, 1], ids=["first page", "token page"])
def test_other_errors_propagate_unretried(lister, call):
    client = PagingKinesis(count=25, page_size=10, name_with_token="reject")
    client.fail_on_call[call] = error("LimitExceededException")
    with pytest.raises(ClientError) as info:
        lister(client, "s")
    assert not isinstance(info.value, StreamNotFoundError)
    assert info.value.response["Error"]["Code"] == "LimitExceededException"
    assert len(client.calls) == call + 1


def test_access_denied_on_another_accounts_stream_names_the_account_and_the_policy(lister):
    arn = "arn:aws:kinesis:eu-west-1:111122223333:stream/shared"
    client = PagingKinesis(count=5, page_size=10, name_with_token="reject")
    client.fail_on_call[0] = error("AccessDeniedException")
    with pytest.raises(StreamAccessDeniedError, match="account 111122223333.*resource-based policy"):
        lister(client, arn)
    assert client.calls == [{"StreamARN": arn, "StreamName": "shared"}]  # the call addressed the stream by its ARN


def test_pager_decides_the_requests_without_a_client():
    pager = ListShardsPager("s")
    assert pager.request == {"StreamName": "s"}
    pager.accept({"Shards": [api_shard(0)], "NextToken": "t1"})
    assert pager.request == {"NextToken": "t1"}
    pager.refused(error("InvalidToken"), PagingKinesis(0, 1, "require"))  # moto: retried with the name
    assert pager.request == {"NextToken": "t1", "StreamName": "s"}
    pager.accept({"Shards": [api_shard(1)], "NextToken": "t2"})
    assert pager.request == {"NextToken": "t2", "StreamName": "s"}  # the name goes with every later token
    pager.accept({"Shards": [api_shard(2)]})
    assert pager.request is None
    assert [s.shard_id for s in pager.shards] == [f"shardId-{i:012d}" for i in range(3)]


def test_describe_stream_summary_raises_stream_not_found_sync_and_async():
    fake = PagingKinesis(count=1, page_size=1, name_with_token="reject")
    assert describe_stream_summary(fake, "s")["RetentionPeriodHours"] == 24
    assert asyncio.run(aio.describe_stream_summary(AsyncKinesis(fake), "s"))["RetentionPeriodHours"] == 24
    with pytest.raises(StreamNotFoundError, match="'nope'.*eu-central-1"):
        describe_stream_summary(fake, "nope")
    with pytest.raises(StreamNotFoundError, match="'nope'.*eu-central-1"):
        asyncio.run(aio.describe_stream_summary(AsyncKinesis(fake), "nope"))
