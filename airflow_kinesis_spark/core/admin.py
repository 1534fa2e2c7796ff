"""Checkpoint administration shared by the rewind operator and the command-line tool, and the
endpoint check shared by the hooks and the command-line tool. No Airflow import."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from airflow_kinesis_spark.core.planner import rewind_checkpoints
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.exceptions import CheckpointConflictError, EndpointUnreachableError

__all__ = ["rewind", "check_endpoint"]

#: Budget of :func:`check_endpoint`: connect timeout (seconds), read timeout (seconds) and
#: attempts. botocore's defaults are 60 s, 60 s and 5 attempts (legacy retry mode): a connection
#: pointing nowhere would take minutes to fail. Real AWS endpoints answer within milliseconds.
CHECK_CONNECT_TIMEOUT = 3.0
CHECK_READ_TIMEOUT = 5.0
CHECK_ATTEMPTS = 2
#: Per service, a call without parameters used as the probe. Sent unsigned, AWS rejects it
#: (``MissingAuthenticationToken``) before any authorization, so it needs no IAM permission.
_PROBES = {"kinesis": ("list_streams", {"Limit": 1}), "dynamodb": ("list_tables", {"Limit": 1}),
           "sts": ("get_caller_identity", {})}  # fmt: skip


#: Probe clients are made from one botocore session per process, under this lock: a new
#: session would load the endpoint rules and service models from disk again (~0.1 s each).
_PROBE_SESSION_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _probe_session() -> Any:
    import botocore.session

    return botocore.session.get_session()


def check_endpoint(client: Any, source: str, *, hint: str = "", verify: bool | str | None = None) -> None:
    """Fail fast when the endpoint of ``client`` does not answer.

    Sends one unsigned request (``ListStreams``, ``ListTables`` or ``GetCallerIdentity``) to the
    client's endpoint, with the client's region, proxies and TLS settings, on a short budget
    (:data:`CHECK_CONNECT_TIMEOUT`, :data:`CHECK_READ_TIMEOUT`, :data:`CHECK_ATTEMPTS`; lower
    timeouts of the client's own config are kept). Any HTTP answer, an error included, means the
    endpoint is reachable; the answer is discarded. Only a failure to connect (refused,
    unresolvable host, connect timeout, proxy or TLS failure) or no answer within the read
    timeout raises. The client itself, and its retry settings, are not touched.

    :param client: a boto3 client of Kinesis, DynamoDB or STS.
    :param source: where the endpoint came from, for the message, e.g. ``aws connection 'aws_default'``.
    :param hint: what to check, appended to the message.
    :param verify: TLS verification of the client (``False`` or a CA bundle path), as given to boto3.
    :raises EndpointUnreachableError: naming the service, the endpoint, the region and ``source``.
    """
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ConnectionError as BotocoreConnectionError
    from botocore.exceptions import ReadTimeoutError

    meta = client.meta
    service = meta.service_model.service_name
    own = meta.config
    config = own.merge(
        Config(
            signature_version=UNSIGNED,
            connect_timeout=min(own.connect_timeout or CHECK_CONNECT_TIMEOUT, CHECK_CONNECT_TIMEOUT),
            read_timeout=min(own.read_timeout or CHECK_READ_TIMEOUT, CHECK_READ_TIMEOUT),
            retries={"mode": "standard", "total_max_attempts": CHECK_ATTEMPTS},
        )
    )
    with _PROBE_SESSION_LOCK:
        probe = _probe_session().create_client(
            service, region_name=meta.region_name, endpoint_url=meta.endpoint_url, config=config, verify=verify
        )
    operation, params = _PROBES[service]
    try:
        getattr(probe, operation)(**params)
    except (BotocoreConnectionError, ReadTimeoutError) as err:
        name = meta.service_model.service_id
        raise EndpointUnreachableError(
            f"Cannot reach {name} at {meta.endpoint_url} ({source}, region {meta.region_name!r}): {err} "
            f"[{CHECK_ATTEMPTS} attempts, connect timeout {config.connect_timeout:g} s, read timeout {config.read_timeout:g} s]."
            + (f" {hint}" if hint else ""),
            service=name,
            endpoint=meta.endpoint_url,
            region=meta.region_name,
            source=source,
        ) from err
    except Exception:  # noqa: BLE001, S110 - any answer, an error included, means the endpoint answered
        pass
    finally:
        probe.close()


def rewind(
    kinesis_client: Any, store: Any, to: str | datetime, *, dry_run: bool = False, discard_pending: bool = False, owner: str
) -> dict[str, Any]:
    """Set a consumer's checkpoints to ``to`` (``TRIM_HORIZON``, ``LATEST`` or a timestamp).

    Shared by the operator and the command-line tool.

    :param kinesis_client: boto3 Kinesis client (for the shard list).
    :param store: the consumer's ``DynamoDBCheckpointStore``.
    :param dry_run: only compute and return the per-shard positions.
    :param discard_pending: drop a pending (planned, uncommitted) batch first; without it a
        pending batch makes the rewind fail, since its retry would re-use the old plan.
    :returns: ``to``, ``dry_run``, ``batch_id`` (of the rewind, ``None`` for a dry run),
        ``discarded_batch_id``, ``discarded_output`` and ``shards`` (shard id -> ``from``, ``to``).
        The rewind commits under the discarded batch's id, so whatever that batch wrote would
        count as committed: a local output directory is deleted (``discarded_output`` says
        ``deleted ...``); a remote one is named for the caller to delete (``delete ...``).
    :raises CheckpointConflictError: a batch is pending (without ``discard_pending``), or another
        writer moved first.
    :raises ValueError: ``to`` is not a valid target.
    """
    now = datetime.now(timezone.utc)
    shards = list_shards(kinesis_client, store.stream_name)
    new = rewind_checkpoints(shards, to, now=now)
    head = store.head()
    current = store.committed_checkpoints(head)
    changes = {
        shard_id: {"from": str(current[shard_id]) if shard_id in current else None, "to": str(new.get(shard_id)) if shard_id in new else None}
        for shard_id in sorted(set(new) | set(current))
    }
    result: dict[str, Any] = {"to": str(to), "dry_run": dry_run, "batch_id": None, "discarded_batch_id": None,
                              "discarded_output": None, "shards": changes}  # fmt: skip
    if dry_run:
        return result
    if head.pending_batch_id is not None:
        if not discard_pending:
            raise CheckpointConflictError(
                f"consumer {store.consumer_name!r} has pending batch {head.pending_batch_id} (held by "
                f"{head.pending_owner}); its retry would re-use the old plan. Wait for it to finish, or rewind "
                "with discard_pending=True.",
                pending_batch_id=head.pending_batch_id,
            )
        discarded = store.pending_plan(head)
        store.discard_pending(head.pending_batch_id, owner)
        result["discarded_batch_id"] = head.pending_batch_id
        result["discarded_output"] = _remove_output(discarded.output_location if discarded else None)
    store.ensure_table()
    result["batch_id"] = store.rewind(new, owner, now=now, open_shards=[s.shard_id for s in shards if not s.is_closed])
    return result


def _remove_output(location: str | None) -> str | None:
    """Delete a discarded batch's local output; name a remote one. ``None`` when there is none."""
    import shutil
    from pathlib import Path
    from urllib.parse import urlparse

    if not location:
        return None
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme else location)
        if not path.exists():
            return None
        shutil.rmtree(path)
        return f"deleted {location}"
    return f"delete {location}: the discarded batch may have written there"
