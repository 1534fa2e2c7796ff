"""The enhanced fan-out driver of a :class:`~airflow_kinesis_spark.core.reader.ShardReader`:
``SubscribeToShard``, each event through the reader's stop rules, renewed subscriptions.

:meth:`ShardReader.pages <airflow_kinesis_spark.core.reader.ShardReader.pages>` calls
:func:`subscribed_pages` when the reader has a ``consumer_arn``; the stop rules, counts and
report stay the reader's (the polling driver is :class:`~airflow_kinesis_spark.core.reader.ShardReader`'s own).

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

import urllib3.exceptions
from botocore.exceptions import HTTPClientError

from airflow_kinesis_spark.core.pages import Page
from airflow_kinesis_spark.core.read_options import THROTTLING_ERRORS

if TYPE_CHECKING:
    from airflow_kinesis_spark.core.reader import ShardReader

# The reader's logger, as before the fan-out driver left core.reader (core.reader imports this
# module, so its name is written out): a logging configuration that selects the reader's lines
# by its logger's name keeps working.
log = logging.getLogger("airflow_kinesis_spark.core.reader")

__all__ = ["SUBSCRIBE_RETRY_ERRORS", "SUBSCRIPTION_RENEW_ERRORS", "SUBSCRIPTION_CONNECTION_ERRORS", "subscribed_pages"]

#: SubscribeToShard errors retried with backoff: another subscription of the consumer to the shard
#: is still open (a renewed one within seconds of the last), or the consumer's subscription rate
#: (Kinesis API reference, SubscribeToShard).
SUBSCRIBE_RETRY_ERRORS = ("ResourceInUseException", *sorted(THROTTLING_ERRORS))
#: Exception events that end a subscription and are renewed with backoff: another subscription
#: of the consumer to the shard took it over, the service failed, or KMS throttled decryption
#: (Kinesis API reference, SubscribeToShardEventStream).
SUBSCRIPTION_RENEW_ERRORS = ("ResourceInUseException", "InternalFailureException", "KMSThrottlingException")
#: A subscription's connection that broke while its events streamed in (botocore reads the event
#: stream from urllib3 as it arrives and does not wrap these): renewed with backoff, as the
#: service's own subscriptions end after 5 minutes.
SUBSCRIPTION_CONNECTION_ERRORS = (urllib3.exceptions.HTTPError, HTTPClientError)


def subscribed_pages(reader: ShardReader) -> Iterator[Page]:
    """Subscribe, apply each event with ``reader.accept``, renew ended subscriptions; yields the
    pages that added user records, until a stop rule holds.

    A refused call (``SUBSCRIBE_RETRY_ERRORS``), a subscription that fails with an exception
    event (``SUBSCRIPTION_RENEW_ERRORS``) and one whose connection breaks
    (``SUBSCRIPTION_CONNECTION_ERRORS``) are retried with backoff from just after
    the last Kinesis record read; ``reader.max_throttle_retries`` of them in a row without an
    event between them raise the last error."""
    attempt = 0
    p = reader._p
    while not reader.done:
        try:
            response = reader.client.subscribe_to_shard(**reader.subscription_request())
            events = response["EventStream"]
        except reader.client.exceptions.ClientError as err:
            attempt = _subscription_failed(reader, err, SUBSCRIBE_RETRY_ERRORS, attempt, "on SubscribeToShard")
            continue
        try:
            for event in events:
                if "SubscribeToShardEvent" not in event:
                    continue
                attempt = 0
                p.calls += 1
                page = reader.accept(reader.event_response(event["SubscribeToShardEvent"]))
                if page:
                    yield page
                if reader.done:
                    break
        except reader.client.exceptions.ClientError as err:  # an exception event (botocore's EventStreamError)
            attempt = _subscription_failed(reader, err, SUBSCRIPTION_RENEW_ERRORS, attempt, "ended the subscription")
            continue
        except SUBSCRIPTION_CONNECTION_ERRORS as err:
            attempt = _subscription_failed(reader, err, (), attempt, "ended the subscription", code=type(err).__name__)
            continue
        finally:
            events.close()
        if not reader.done:
            p.expired += 1  # the subscription ended (after 5 minutes) before a stop rule held
            log.info("shard %s: subscription ended; renewing after %s", reader.range.shard_id, p.last_kinesis_sequence)


def _subscription_failed(
    reader: ShardReader, err: Exception, retried: tuple[str, ...], attempt: int, what: str, *, code: str | None = None
) -> int:
    """Back off before renewing a subscription that was refused or failed; returns the next
    attempt number. Re-raises ``err`` when retries are spent, or when it is an error response
    whose code is not in ``retried`` (``code`` given: a broken connection, always retried)."""
    if code is None:
        code = getattr(err, "response", {}).get("Error", {}).get("Code", "")
        if code not in retried:
            raise err
    if attempt >= reader.max_throttle_retries:
        raise err
    reader._p.throttled += 1
    delay = random.uniform(0, min(reader.backoff_cap, max(1.0, reader.backoff_base * 2**attempt)))
    log.info("shard %s: %s %s, renewing after %s (retry %d in %.2fs)", reader.range.shard_id, code, what,
             reader._p.last_kinesis_sequence, attempt + 1, delay)  # fmt: skip
    reader._sleep(delay)
    return attempt + 1
