"""Registered stream consumers for enhanced fan-out (EFO): register or reuse, wait until ACTIVE,
deregister.

A registered consumer gets its own 2 MiB/s per shard, pushed through ``SubscribeToShard``,
instead of sharing each shard's 2 MiB/s and 5 ``GetRecords`` calls per second with every other
polling reader. It is billed per consumer-shard-hour while registered, and per GB pushed
(Kinesis pricing), so deregistering is an explicit action (:func:`deregister_stream_consumer`,
``kinesis-spark deregister-consumer``), never a side effect of a run.

No Airflow import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_result,
    stop_after_delay,
    wait_exponential,
    wait_fixed,
)

from airflow_kinesis_spark.core.names import parse_stream_arn, stream_name_of
from airflow_kinesis_spark.core.shards import describe_stream_summary
from airflow_kinesis_spark.core.stream_summary import ARN_MAX_AGE_S, SummaryBudget

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

log = logging.getLogger(__name__)

__all__ = ["CONSUMER_TYPES", "ensure_stream_consumer", "deregister_stream_consumer", "stream_arn_of", "stream_consumer_arn"]

#: ``consumer_type`` values: ``polling`` (GetRecords, the shard's shared read budget) or ``efo``
#: (enhanced fan-out: a registered stream consumer, SubscribeToShard).
CONSUMER_TYPES = ("polling", "efo")


def stream_arn_of(client: KinesisClient, stream: str, *, budget: SummaryBudget | None = None) -> str:
    """The stream's ARN: ``stream`` itself when it is one, else from ``DescribeStreamSummary``.

    :param budget: the host's ``DescribeStreamSummary`` budget (``core.stream_summary``): a summary
        of the stream in the host's cache answers (up to :data:`ARN_MAX_AGE_S` old: the ARN never
        changes), else the call waits for its slot of the host's pacer; ``None``: one call, unpaced.
    """
    if parse_stream_arn(stream):
        return stream
    return str(describe_stream_summary(client, stream, budget=budget, max_age=ARN_MAX_AGE_S)["StreamARN"])


def _code(err: ClientError) -> str:
    return err.response.get("Error", {}).get("Code", "")


def ensure_stream_consumer(
    client: KinesisClient, stream: str, consumer_name: str, *, wait_seconds: float = 120.0, poll_seconds: float = 1.0,
    sleep: Callable[[float], None] = time.sleep, budget: SummaryBudget | None = None,
) -> str:  # fmt: skip
    """Register ``consumer_name`` as a stream consumer of ``stream`` (or reuse it) and wait until
    it is ``ACTIVE`` (registration takes seconds; Kinesis API reference, RegisterStreamConsumer).

    Calls: ``DescribeStreamSummary`` (a stream given by name), ``DescribeStreamConsumer``, and,
    for a consumer not registered yet, ``RegisterStreamConsumer``; then ``DescribeStreamConsumer``
    every ``poll_seconds`` while it is ``CREATING``.

    :param budget: the host's ``DescribeStreamSummary`` budget for the stream's ARN (:func:`stream_arn_of`).
    :returns: the consumer's ARN (what ``SubscribeToShard`` takes).
    :raises RuntimeError: the consumer is being deleted, or not ACTIVE within ``wait_seconds``.
    :raises StreamNotFoundError: the stream does not exist.
    :raises botocore.exceptions.ClientError: another error (e.g. the stream's limit of 20
        registered consumers: ``LimitExceededException``).
    """
    stream_arn = stream_arn_of(client, stream, budget=budget)
    try:
        description: dict[str, Any] = dict(client.describe_stream_consumer(StreamARN=stream_arn, ConsumerName=consumer_name)["ConsumerDescription"])
    except ClientError as err:
        if _code(err) != "ResourceNotFoundException":
            raise
        description = _register(client, stream, stream_arn, consumer_name, wait_seconds, poll_seconds, sleep)
    arn = description["ConsumerARN"]
    described = iter([description])  # the first check is of the description in hand

    def status() -> str:
        current = next(described, None) or client.describe_stream_consumer(ConsumerARN=arn)["ConsumerDescription"]
        state = str(current.get("ConsumerStatus"))
        if state == "DELETING":
            raise RuntimeError(f"stream consumer {consumer_name} of stream {stream_name_of(stream)} is being deregistered; "
                               "retry once it is gone (it is then registered anew)")  # fmt: skip
        return state

    def late(state: RetryCallState) -> None:
        raise RuntimeError(f"stream consumer {consumer_name} of stream {stream_name_of(stream)} is not ACTIVE after "
                           f"{wait_seconds:g} s (status {state.outcome.result() if state.outcome else None})")  # fmt: skip

    # tenacity: DescribeStreamConsumer every poll_seconds while CREATING (botocore has no waiter for stream consumers)
    Retrying(retry=retry_if_result(lambda state: state != "ACTIVE"), wait=wait_fixed(poll_seconds),
             stop=stop_after_delay(wait_seconds), sleep=sleep, retry_error_callback=late)(status)  # fmt: skip
    return arn


#: Longest wait between two ``RegisterStreamConsumer`` calls refused with ``LimitExceededException``.
REGISTER_BACKOFF_MAX_S = 10.0


def _register(
    client: KinesisClient, stream: str, stream_arn: str, consumer_name: str, wait_seconds: float, poll_seconds: float,
    sleep: Callable[[float], None],
) -> dict[str, Any]:  # fmt: skip
    """``RegisterStreamConsumer``, retried while the service refuses it with ``LimitExceededException``
    for a reason that passes: at most 5 consumers of a stream may be ``CREATING`` at once, and the
    call is limited to 5 per second per stream (Kinesis API reference, RegisterStreamConsumer).
    Backoff doubles from ``poll_seconds`` up to :data:`REGISTER_BACKOFF_MAX_S`, so the wait lasts
    while consumers of the stream are ``CREATING`` (``ListStreamConsumers``; registering takes
    seconds) and ends at the deadline. When the listing shows none ``CREATING``, a refusal that
    repeats is the stream's limit of registered consumers (20; 50 with On-Demand Advantage):
    failed at once, naming it. When the listing itself is refused (``ListStreamConsumers``: 5
    calls per second per stream, Kinesis API reference) the cause stays unknown and the
    registration is retried, never reported as that limit.

    :raises RuntimeError: the limit of registered consumers, or still refused after ``wait_seconds``.
    """
    creating: list[str] | None = None  # of the last refusal
    attempts = 0

    def register() -> dict[str, Any]:
        nonlocal creating, attempts
        attempts += 1
        try:
            description = dict(client.register_stream_consumer(StreamARN=stream_arn, ConsumerName=consumer_name)["Consumer"])
        except ClientError as err:
            if _code(err) == "ResourceInUseException":  # registered meanwhile by a concurrent run
                return dict(client.describe_stream_consumer(StreamARN=stream_arn, ConsumerName=consumer_name)["ConsumerDescription"])
            if _code(err) == "LimitExceededException":
                creating = _creating_consumers(client, stream_arn)
                if creating == [] and attempts >= 3:
                    raise RuntimeError(
                        f"cannot register stream consumer {consumer_name} of stream {stream_name_of(stream)}: the service "
                        f"refuses it (LimitExceededException) and no consumer of the stream is being created, so the stream "
                        "has its limit of registered consumers (20; 50 with On-Demand Advantage). Deregister one "
                        "(kinesis-spark deregister-consumer), or read this consumer by polling (consumer_type='polling')"
                    ) from err  # fmt: skip
            raise
        log.info("Registered stream consumer %s of stream %s for enhanced fan-out (billed per shard-hour while "
                 "registered; deregister with kinesis-spark deregister-consumer)", consumer_name, stream_name_of(stream))  # fmt: skip
        return description

    def refused(state: RetryCallState) -> None:
        log.info("RegisterStreamConsumer of %s refused (LimitExceededException; %s consumers of the stream CREATING): "
                 "retrying in %.1f s", consumer_name, _count(creating), state.next_action.sleep if state.next_action else 0.0)  # fmt: skip

    def still_refused(state: RetryCallState) -> dict[str, Any]:
        err = state.outcome.exception() if state.outcome else None
        raise RuntimeError(f"stream consumer {consumer_name} of stream {stream_name_of(stream)}: RegisterStreamConsumer "
                           f"still refused after {wait_seconds:g} s ({_count(creating)} consumers CREATING): {err}") from err  # fmt: skip

    # tenacity: again on LimitExceededException, the wait doubling from poll_seconds up to REGISTER_BACKOFF_MAX_S
    retrying = Retrying(retry=retry_if_exception(lambda err: isinstance(err, ClientError) and _code(err) == "LimitExceededException"),
                        wait=wait_exponential(multiplier=poll_seconds, max=REGISTER_BACKOFF_MAX_S), stop=stop_after_delay(wait_seconds),
                        sleep=sleep, before_sleep=refused, retry_error_callback=still_refused)  # fmt: skip
    return retrying(register)


def _creating_consumers(client: KinesisClient, stream_arn: str) -> list[str] | None:
    """Names of the stream's consumers in ``CREATING`` (``ListStreamConsumers``, paginated); ``None``
    when the call is refused (the refusal's cause then stays unknown)."""
    try:
        pages = client.get_paginator("list_stream_consumers").paginate(StreamARN=stream_arn)
        return [c["ConsumerName"] for page in pages for c in page.get("Consumers", []) if c.get("ConsumerStatus") == "CREATING"]
    except ClientError as err:
        log.info("ListStreamConsumers refused (%s): how many consumers are CREATING is unknown", _code(err))
        return None


def _count(creating: list[str] | None) -> str:
    return "an unknown number of" if creating is None else str(len(creating))


def stream_consumer_arn(client: KinesisClient, stream: str, consumer_name: str, *, budget: SummaryBudget | None = None) -> str | None:
    """The ARN of stream consumer ``consumer_name`` of ``stream`` (``DescribeStreamConsumer``), or
    ``None`` when no such consumer is registered. Registers nothing. ``budget``: as :func:`stream_arn_of`."""
    try:
        description = client.describe_stream_consumer(StreamARN=stream_arn_of(client, stream, budget=budget),
                                                      ConsumerName=consumer_name)  # fmt: skip
    except ClientError as err:
        if _code(err) == "ResourceNotFoundException":
            return None
        raise
    return str(description["ConsumerDescription"]["ConsumerARN"])


def deregister_stream_consumer(client: KinesisClient, stream: str, consumer_name: str, *, budget: SummaryBudget | None = None) -> bool:
    """Deregister the stream consumer ``consumer_name`` of ``stream`` (its billing stops; its
    checkpoints are untouched, and the next EFO run registers it again). ``budget``: as
    :func:`stream_arn_of`.

    :returns: whether a consumer was registered (and is now being deregistered).
    """
    stream_arn = stream_arn_of(client, stream, budget=budget)
    try:
        client.deregister_stream_consumer(StreamARN=stream_arn, ConsumerName=consumer_name)
    except ClientError as err:
        if _code(err) == "ResourceNotFoundException":
            return False
        raise
    log.info("Deregistered stream consumer %s of stream %s", consumer_name, stream_name_of(stream))
    return True
