"""Registering a stream consumer under the service's limits (core.consumers): refusals that pass
(5 consumers CREATING at once, 5 calls per second) are retried with backoff; the limit of
registered consumers fails at once, naming it. A fake Kinesis client (one module's unit test; moto
enforces none of these limits) answers as the service documents."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from airflow_kinesis_spark.core.consumers import ensure_stream_consumer

ARN = "arn:aws:kinesis:eu-west-1:123456789012:stream/clicks"


def refused(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "RegisterStreamConsumer")


class FakeKinesis:
    """RegisterStreamConsumer refused ``refusals`` times; ``creating`` consumers listed as CREATING meanwhile."""

    def __init__(self, refusals: int, creating: int) -> None:
        self.refusals, self.creating, self.calls = refusals, creating, []

    def describe_stream_consumer(self, **kwargs):
        self.calls.append("DescribeStreamConsumer")
        if "ConsumerARN" in kwargs:
            return {"ConsumerDescription": {"ConsumerARN": kwargs["ConsumerARN"], "ConsumerStatus": "ACTIVE"}}
        raise refused("ResourceNotFoundException")

    def register_stream_consumer(self, **kwargs):
        self.calls.append("RegisterStreamConsumer")
        if self.refusals:
            self.refusals -= 1
            self.creating = max(0, self.creating - 1)
            raise refused("LimitExceededException")
        return {"Consumer": {"ConsumerARN": f"{ARN}/consumer/{kwargs['ConsumerName']}:1", "ConsumerStatus": "CREATING"}}

    def get_paginator(self, name):
        assert name == "list_stream_consumers"
        consumers = [{"ConsumerName": f"other{i}", "ConsumerStatus": "CREATING"} for i in range(self.creating)]
        return type("P", (), {"paginate": lambda _self, **kw: [{"Consumers": consumers}]})()


def test_a_refusal_while_consumers_are_creating_is_waited_out_with_backoff():
    kinesis, slept = FakeKinesis(refusals=4, creating=5), []
    arn = ensure_stream_consumer(kinesis, ARN, "lake", poll_seconds=0.5, sleep=slept.append)
    assert arn.endswith("/consumer/lake:1") and kinesis.calls.count("RegisterStreamConsumer") == 5
    assert slept[:4] == [0.5, 1.0, 2.0, 4.0]


def test_the_limit_of_registered_consumers_fails_at_once_naming_it():
    kinesis = FakeKinesis(refusals=100, creating=0)
    with pytest.raises(RuntimeError, match=r"limit of registered consumers \(20; 50 with On-Demand Advantage\)"):
        ensure_stream_consumer(kinesis, ARN, "lake", sleep=lambda s: None)
    assert kinesis.calls.count("RegisterStreamConsumer") == 3  # two retries: a rate refusal passes by then


def test_still_refused_at_the_deadline_says_so():
    kinesis = FakeKinesis(refusals=100, creating=100)
    with pytest.raises(RuntimeError, match=r"still refused after 0 s \(\d+ consumers CREATING\)"):
        ensure_stream_consumer(kinesis, ARN, "lake", wait_seconds=0, sleep=lambda s: None)


class ListingRefused(FakeKinesis):
    """ListStreamConsumers refused too (5 calls per second per stream), ``list_refusals`` times."""

    def __init__(self, refusals: int, creating: int, list_refusals: int) -> None:
        super().__init__(refusals, creating)
        self.list_refusals = list_refusals

    def get_paginator(self, name):
        if self.list_refusals:
            self.list_refusals -= 1

            def paginate(**kwargs):
                raise ClientError({"Error": {"Code": "LimitExceededException", "Message": "Rate exceeded"}}, "ListStreamConsumers")

            return type("P", (), {"paginate": lambda _self, **kw: paginate(**kw)})()
        return super().get_paginator(name)


def test_a_refused_listing_is_not_taken_for_the_limit_of_registered_consumers():
    """Registration and the listing both refused while 5 consumers are CREATING: the cause is
    unknown, so the registration is retried (it used to fail at the third refusal, naming the
    limit of registered consumers, as if none were CREATING)."""
    kinesis, slept = ListingRefused(refusals=4, creating=5, list_refusals=4), []
    arn = ensure_stream_consumer(kinesis, ARN, "lake", poll_seconds=0.5, sleep=slept.append)
    assert arn.endswith("/consumer/lake:1") and kinesis.calls.count("RegisterStreamConsumer") == 5
    assert slept[:4] == [0.5, 1.0, 2.0, 4.0]


class CreatingConsumer(FakeKinesis):
    """The consumer is registered already (by a concurrent run) and CREATING for ``polls`` more
    DescribeStreamConsumer calls; with ``in_use``, RegisterStreamConsumer races it
    (``ResourceInUseException``) after a first DescribeStreamConsumer found nothing."""

    def __init__(self, polls: int, in_use: bool = False) -> None:
        super().__init__(refusals=0, creating=0)
        self.polls, self.in_use, self.first = polls, in_use, True

    def describe_stream_consumer(self, **kwargs):
        self.calls.append("DescribeStreamConsumer")
        if self.in_use and self.first:
            self.first = False
            raise refused("ResourceNotFoundException")
        status = "CREATING" if self.polls > 0 else "ACTIVE"
        self.polls -= 1
        return {"ConsumerDescription": {"ConsumerARN": f"{ARN}/consumer/lake:7", "ConsumerStatus": status}}

    def register_stream_consumer(self, **kwargs):
        self.calls.append("RegisterStreamConsumer")
        raise refused("ResourceInUseException")


@pytest.mark.parametrize("in_use", [False, True], ids=["found_creating", "registered_meanwhile"])
def test_a_consumer_creating_is_waited_for_until_active(in_use):
    kinesis, slept = CreatingConsumer(polls=3, in_use=in_use), []
    assert ensure_stream_consumer(kinesis, ARN, "lake", poll_seconds=0.5, sleep=slept.append) == f"{ARN}/consumer/lake:7"
    assert slept == [0.5, 0.5, 0.5]  # three polls CREATING, the fourth ACTIVE
    assert kinesis.calls.count("RegisterStreamConsumer") == (1 if in_use else 0)


def test_a_consumer_still_creating_at_the_deadline_says_so():
    with pytest.raises(RuntimeError, match=r"is not ACTIVE after 0 s \(status CREATING\)"):
        ensure_stream_consumer(CreatingConsumer(polls=100), ARN, "lake", wait_seconds=0, sleep=lambda s: None)


class SummaryCounting(FakeKinesis):
    """A registered, ACTIVE consumer; counts ``DescribeStreamSummary`` (the stream's ARN by name)."""

    meta = type("Meta", (), {"endpoint_url": "https://kinesis.eu-west-1.amazonaws.com", "region_name": "eu-west-1"})()

    def __init__(self) -> None:
        super().__init__(refusals=0, creating=0)

    def describe_stream_summary(self, **kwargs):
        self.calls.append("DescribeStreamSummary")
        return {"StreamDescriptionSummary": {"StreamName": kwargs["StreamName"], "StreamARN": ARN, "StreamStatus": "ACTIVE",
                                             "RetentionPeriodHours": 24, "OpenShardCount": 1}}  # fmt: skip

    def describe_stream_consumer(self, **kwargs):
        self.calls.append("DescribeStreamConsumer")
        assert kwargs.get("StreamARN", ARN) == ARN
        return {"ConsumerDescription": {"ConsumerARN": f"{ARN}/consumer/lake:1", "ConsumerStatus": "ACTIVE"}}

    def deregister_stream_consumer(self, **kwargs):
        self.calls.append("DeregisterStreamConsumer")


def test_the_stream_arn_of_a_stream_name_goes_through_the_hosts_describe_stream_summary_budget(tmp_path):
    """Registering (each EFO batch's plan), checking a pending plan's consumer and deregistering
    look the stream's ARN up with DescribeStreamSummary. With the host's budget, the first call is
    paced and the answer cached: the others make no call (the ARN of a name never changes).
    Without one, each makes its own call, as before."""
    from airflow_kinesis_spark.core.consumers import deregister_stream_consumer, stream_consumer_arn
    from airflow_kinesis_spark.core.stream_summary import SummaryBudget

    budget = SummaryBudget(state_dir=str(tmp_path))
    kinesis = SummaryCounting()
    assert ensure_stream_consumer(kinesis, "clicks", "lake", sleep=lambda s: None, budget=budget) == f"{ARN}/consumer/lake:1"
    assert ensure_stream_consumer(kinesis, "clicks", "lake", sleep=lambda s: None, budget=budget) == f"{ARN}/consumer/lake:1"
    assert stream_consumer_arn(kinesis, "clicks", "lake", budget=budget) == f"{ARN}/consumer/lake:1"
    assert deregister_stream_consumer(kinesis, "clicks", "lake", budget=budget) is True
    assert kinesis.calls.count("DescribeStreamSummary") == 1, kinesis.calls

    unpaced = SummaryCounting()
    ensure_stream_consumer(unpaced, "clicks", "lake", sleep=lambda s: None)
    ensure_stream_consumer(unpaced, "clicks", "lake", sleep=lambda s: None)
    assert unpaced.calls.count("DescribeStreamSummary") == 2
