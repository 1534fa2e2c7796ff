"""list_shards paging against fake clients (the real API's rules and moto's quirk)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.exceptions import StreamNotFoundError


class ResourceNotFoundException(ClientError):
    pass


def api_shard(n: int) -> dict[str, Any]:
    return {
        "ShardId": f"shardId-{n:012d}",
        "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"},
        "SequenceNumberRange": {"StartingSequenceNumber": str(n)},
    }


class PagingKinesis:
    """ListShards in pages of ``page_size``.

    ``name_with_token``: "reject" (the real API: StreamName next to NextToken is an error),
    "require" (moto: NextToken alone is refused).
    """

    class exceptions:  # noqa: N801
        ClientError = ClientError
        ResourceNotFoundException = ResourceNotFoundException

    class meta:  # noqa: N801
        region_name = "eu-central-1"
        endpoint_url = "http://127.0.0.1:1"

    def __init__(self, count: int, page_size: int, name_with_token: str, stream: str = "s") -> None:
        self.shards = [api_shard(i) for i in range(count)]
        self.page_size = page_size
        self.name_with_token = name_with_token
        self.stream = stream
        self.calls: list[dict[str, Any]] = []

    def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        token = kwargs.get("NextToken")
        if token is None:
            if kwargs.get("StreamName") != self.stream:
                raise ResourceNotFoundException({"Error": {"Code": "ResourceNotFoundException"}}, "ListShards")
            start = 0
        else:
            if "StreamName" in kwargs and self.name_with_token == "reject":
                raise ClientError({"Error": {"Code": "InvalidArgumentException"}}, "ListShards")
            if "StreamName" not in kwargs and self.name_with_token == "require":
                raise ClientError({"Error": {"Code": "InvalidToken"}}, "ListShards")
            start = int(token)
        end = start + self.page_size
        page: dict[str, Any] = {"Shards": self.shards[start:end]}
        if end < len(self.shards):
            page["NextToken"] = str(end)
        return page


@pytest.mark.parametrize("mode", ["reject", "require"])
def test_list_shards_pages_through_every_shard(mode):
    client = PagingKinesis(count=2500, page_size=1000, name_with_token=mode)
    shards = list_shards(client, "s")
    assert [s.shard_id for s in shards] == [f"shardId-{i:012d}" for i in range(2500)]


def test_real_api_gets_the_token_alone():
    client = PagingKinesis(count=25, page_size=10, name_with_token="reject")
    list_shards(client, "s")
    assert client.calls == [{"StreamName": "s"}, {"NextToken": "10"}, {"NextToken": "20"}]


def test_moto_quirk_resends_the_name_once_refused():
    client = PagingKinesis(count=25, page_size=10, name_with_token="require")
    list_shards(client, "s")
    assert client.calls == [
        {"StreamName": "s"},
        {"NextToken": "10"},
        {"NextToken": "10", "StreamName": "s"},
        {"NextToken": "20", "StreamName": "s"},
    ]


def test_missing_stream_names_stream_region_and_endpoint():
    client = PagingKinesis(count=1, page_size=10, name_with_token="reject")
    with pytest.raises(StreamNotFoundError) as info:
        list_shards(client, "nope")
    err = info.value
    assert "'nope'" in str(err) and "eu-central-1" in str(err) and "http://127.0.0.1:1" in str(err)
    assert (err.stream_name, err.region, err.endpoint) == ("nope", "eu-central-1", "http://127.0.0.1:1")


def test_other_errors_propagate():
    class Broken(PagingKinesis):
        def list_shards(self, **kwargs: Any) -> dict[str, Any]:
            raise ClientError({"Error": {"Code": "AccessDeniedException"}}, "ListShards")

    with pytest.raises(ClientError) as info:
        list_shards(Broken(1, 1, "reject"), "s")
    assert not isinstance(info.value, StreamNotFoundError)
    assert info.value.response["Error"]["Code"] == "AccessDeniedException"
