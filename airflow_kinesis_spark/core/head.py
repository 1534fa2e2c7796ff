"""The head item of one (stream, consumer): :class:`Head`, parsed and checked, and the store's clock.

The head (key ``{stream}|{consumer}``, ``HEAD``) says which batch is committed and which one is
pending, and which writer's chunk items count (``committed_owner``, ``pending_plan_owner``, ...).
:meth:`Head.from_item` parses it as ``GetItem`` returns it and refuses an item that is not what the
provider writes (:class:`~airflow_kinesis_spark.exceptions.CheckpointStoreCorruptError`, with the
fix ``FIX_RESTORE`` of ``core.corrupt``). Reading it is the store's (``core.store``:
``DynamoDBCheckpointStore.head``, ``parse_head``; the async reader in ``core.aio``).

``_now`` is the time the store writes into items (ISO 8601 UTC); a lease's heartbeat (epoch
milliseconds) comes from the store's clock (``DynamoDBCheckpointStore(clock=...)``, ``core.lease``).

No Airflow import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from airflow_kinesis_spark.core.corrupt import FIX_RESTORE, _attribute, _key_text, _Malformed, _whole_number
from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.exceptions import CheckpointStoreCorruptError

__all__ = ["Head"]


@dataclass(frozen=True)
class Head:
    """The head item of one (stream, consumer)."""

    committed_batch_id: int = 0
    committed_owner: str | None = None
    pending_batch_id: int | None = None
    pending_plan_owner: str | None = None
    pending_owner: str | None = None
    pending_report_owner: str | None = None
    committed_plan_owner: str | None = None
    #: The writer whose recorded report the committed batch was committed with (``None``: a batch
    #: committed without a job, or by a version before 0.9).
    committed_report_owner: str | None = None
    #: Epoch milliseconds of the pending batch holder's last heartbeat (its lease).
    pending_heartbeat: int | None = None
    #: The committed incremental batch's plan creation time (``format_timestamp``; ``None``: a
    #: rewind, or a commit by a version that did not record it).
    committed_plan_created_at: str | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None, *, table_name: str | None = None) -> Head:
        """Parse the head item as ``GetItem`` returns it (``None``: no head yet).

        :param table_name: the table, named in the error.
        :raises CheckpointStoreCorruptError: ``committed_batch_id`` is missing (the provider
            writes it with the head), an attribute is of another DynamoDB type (a number ``N``
            for a batch id or heartbeat, a string ``S`` for a writer), or a batch id or heartbeat
            is not a whole number ``>= 0`` (a pending batch id: ``>= 1``).
        """
        if not item:
            return cls()

        def num(name: str, minimum: int, *, required: bool = False) -> int | None:
            text = _attribute(item, name, "N", required=required)
            return None if text is None else _whole_number(text, name, minimum)

        def text(name: str) -> str | None:
            return _attribute(item, name, "S")

        try:
            return cls(
                committed_batch_id=num("committed_batch_id", 0, required=True) or 0,
                committed_owner=text("committed_owner"),
                pending_batch_id=num("pending_batch_id", 1),
                pending_plan_owner=text("pending_plan_owner"),
                pending_owner=text("pending_owner"),
                pending_report_owner=text("pending_report_owner"),
                committed_plan_owner=text("committed_plan_owner"),
                committed_report_owner=text("committed_report_owner"),
                pending_heartbeat=num("pending_heartbeat", 0),
                committed_plan_created_at=text("committed_plan_created_at"),
            )
        except _Malformed as bad:
            raise CheckpointStoreCorruptError.for_item(
                table_name, _key_text(item, "pk"), _key_text(item, "sk"), bad.field, bad.problem,
                what="the head: the committed and the pending batch", fix=FIX_RESTORE,
            ) from bad.__cause__  # fmt: skip


def _now() -> str:
    return format_timestamp(datetime.now(timezone.utc))

