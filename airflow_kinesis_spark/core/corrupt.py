"""Corrupt items of the checkpoint table: the checks of an item's attributes and how to mend it.

Anyone allowed to write the table can plant items, so the store checks every item it reads against
what it writes. This module holds what those checks share:

* :data:`PARSE_ERRORS`: what parsing a malformed item may raise;
* :data:`FIX_RESTORE` and :data:`FIX_PENDING`: the fix that ends the message of
  :class:`~airflow_kinesis_spark.exceptions.CheckpointStoreCorruptError`;
* ``_Malformed``, the internal error of a field that does not parse (the reader that caught it adds
  the item's key and raises :class:`~airflow_kinesis_spark.exceptions.CheckpointStoreCorruptError`),
  and the checks of one attribute (``_attribute``: its DynamoDB type; ``_whole_number``: a batch id
  or heartbeat) with the helpers that quote a value read from the table in a message (``_show``,
  ``_explain``, ``_key_text``).

The underscored names are internal to the store's modules (``core.head``, ``core.payloads``,
``core.chunks``), which import them from here. This module imports no other module of the store.

No Airflow import.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, overload

__all__ = ["PARSE_ERRORS", "FIX_RESTORE", "FIX_PENDING"]

#: What parsing a malformed item may raise (``json.JSONDecodeError`` and ``UnicodeError`` are
#: ``ValueError``s, ``decimal.InvalidOperation`` an ``ArithmeticError``, JSON nested too deeply a
#: ``RecursionError``). The store turns each into :class:`CheckpointStoreCorruptError`, naming the
#: item and the field.
PARSE_ERRORS: tuple[type[Exception], ...] = (
    KeyError, IndexError, ValueError, TypeError, AttributeError, ArithmeticError, RecursionError,
)  # fmt: skip

#: How to mend a corrupt item that a head pointer or the head itself holds (the message of
#: :class:`CheckpointStoreCorruptError` ends with it).
FIX_RESTORE = (
    "restore the table from its point-in-time recovery backup (DynamoDB restores into a new table) to a time before "
    "the item changed, then copy the item back or point checkpoint_table at the restored table"
)
#: How to mend a corrupt item of the pending batch: dropping the batch is enough.
FIX_PENDING = (
    "discard the pending batch (kinesis-spark discard-pending, or KinesisDiscardPendingBatchOperator): the committed "
    "checkpoints stay and the next run plans the batch anew from them; or " + FIX_RESTORE
)

#: DynamoDB's attribute type descriptors (DynamoDB API reference, AttributeValue).
_DYNAMODB_TYPES = {"S": "string", "N": "number", "B": "binary", "BOOL": "boolean", "NULL": "null", "M": "map",
                   "L": "list", "SS": "string set", "NS": "number set", "BS": "binary set"}  # fmt: skip


class _Malformed(Exception):
    """A field of an item that does not parse. Internal: the store adds the item's key and raises
    :class:`CheckpointStoreCorruptError`; ``__cause__`` is the parser's own error, if any."""

    def __init__(self, field: str, problem: str, *, pk: str | None = None, sk: str | None = None) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem, self.pk, self.sk = field, problem, pk, sk


def _show(value: Any, limit: int = 80) -> str:
    """``repr`` of a value read from the table, cut to ``limit`` characters: it is not trusted to
    be short or printable."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _explain(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text if len(text) <= 200 else text[:199] + '…'}"


def _key_text(item: Mapping[str, Any], name: str) -> str:
    """The item's key attribute ``name`` (``pk``, ``sk``: strings by the table's key schema)."""
    value = item.get(name)
    if isinstance(value, Mapping) and isinstance(value.get("S"), str):
        return str(value["S"])
    return _show(value)


@overload
def _attribute(item: Mapping[str, Any], name: str, kind: str, *, required: Literal[True]) -> str: ...


@overload
def _attribute(item: Mapping[str, Any], name: str, kind: str, *, required: bool = False) -> str | None: ...


def _attribute(item: Mapping[str, Any], name: str, kind: str, *, required: bool = False) -> str | None:
    """The value of attribute ``name``, of DynamoDB type ``kind`` (``S`` or ``N``: both come as
    strings); ``None`` when it is absent and not ``required``."""
    if name not in item:
        if required:
            raise _Malformed(name, "missing")
        return None
    value = item[name]
    if isinstance(value, Mapping) and len(value) == 1 and isinstance(value.get(kind), str):
        return str(value[kind])
    if isinstance(value, Mapping) and len(value) == 1:
        ((found, inner),) = value.items()
        shown = f"a DynamoDB {_DYNAMODB_TYPES.get(found, 'value')} ({found}) {_show(inner)}"
    else:
        shown = _show(value)
    raise _Malformed(name, f"expected a DynamoDB {_DYNAMODB_TYPES[kind]} ({kind}), found {shown}")


def _whole_number(text: str, field: str, minimum: int) -> int:
    """A DynamoDB number that must be a whole number ``>= minimum`` (DynamoDB numbers have up to 38
    significant digits: DynamoDB developer guide, "Data types")."""
    try:
        number = Decimal(text)
    except (InvalidOperation, ValueError, TypeError):
        raise _Malformed(field, f"{_show(text)} is not a number") from None
    if not number.is_finite() or number.adjusted() > 38 or number != number.to_integral_value():
        raise _Malformed(field, f"{_show(text)} is not a whole number of at most 38 digits")
    value = int(number)
    if value < minimum:
        raise _Malformed(field, f"{value} is below {minimum}, the least it may be")
    return value
