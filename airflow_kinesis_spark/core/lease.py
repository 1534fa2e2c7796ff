"""The lease on a pending batch: taking it (take-over, hand-off claims), renewing it, giving it back.

A pending batch is held by one writer at a time (the head's ``pending_owner``), for as long as it
renews its heartbeat (``pending_heartbeat``, epoch milliseconds): a holder that sent none for
``lease_seconds`` (:data:`DEFAULT_LEASE_SECONDS`) may be taken over, and is fenced from then on (its
heartbeat, report and commit are refused). Every step is one conditional update of the head.

* :data:`DEFAULT_LEASE_SECONDS`, :data:`HEARTBEATS_PER_LEASE`, :func:`heartbeat_interval` and
  :func:`lease_held_error` (the :class:`~airflow_kinesis_spark.exceptions.BatchLeaseHeldError`
  that says who holds a batch and when it may be taken over);
* :class:`LeaseHolding`: the store's lease methods (``take_over``, ``claim``, ``heartbeat``,
  ``release``, ``release_handed``, ``hold_lease``, ``hold_hand_off``), a mixin of
  ``DynamoDBCheckpointStore`` (``core.store``): its class docstring lists what it takes from the
  store.

Log lines keep the store's logger (``airflow_kinesis_spark.core.store``), where they were written
before this module held them: logging configurations and tests filter on it. This module does not
import ``core.store``.

No Airflow import.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.head import Head, _now
from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.exceptions import BatchLeaseHeldError, CheckpointConflictError

# The store's logger, not this module's: see the module docstring.
log = logging.getLogger("airflow_kinesis_spark.core.store")

__all__ = ["DEFAULT_LEASE_SECONDS", "HEARTBEATS_PER_LEASE", "heartbeat_interval", "lease_held_error", "LeaseHolding"]

#: The lease on a pending batch by default (seconds): a holder that sent no heartbeat for this
#: long may be taken over. It bounds how long a retry after a run that died without a word (kill
#: -9, OOM, a lost machine) waits; a run that fails gives its lease back at once. 60 s: four
#: renewals (:data:`HEARTBEATS_PER_LEASE`) 15 s apart, each one conditional ``UpdateItem`` of a
#: few milliseconds, so a holder keeps its lease through two failed renewals in a row with a
#: quarter of the lease to spare, and loses it only when DynamoDB refused or lost its renewals for
#: 45 s or more. Losing it is safe (the holder is fenced: its report and commit are refused, a
#: driver publishes nothing), never a double write; the cost is a re-run. It must stay well above
#: the clock difference between workers and Spark drivers (the heartbeat's age is the reader's
#: clock minus the holder's) and, over Spark Connect, above the time a batch's job runs (a killed
#: worker's job goes on running on the server: docs/guarantees.md).
DEFAULT_LEASE_SECONDS = 60.0

#: Renewals per lease: a holder renews its lease every ``lease_seconds / 4`` (:func:`heartbeat_interval`).
HEARTBEATS_PER_LEASE = 4


def heartbeat_interval(lease_seconds: float) -> float:
    """Seconds between two renewals of a lease of ``lease_seconds`` (a quarter of it)."""
    return lease_seconds / HEARTBEATS_PER_LEASE


def lease_held_error(
    what: str, batch_id: int, holder: str | None, heartbeat_ms: int, lease_seconds: float, *, now_ms: int, advice: str,
) -> BatchLeaseHeldError:  # fmt: skip
    """The error for ``what`` (e.g. ``batch 7 of stream 's', consumer 'c'``) held by ``holder``
    whose last heartbeat was at ``heartbeat_ms`` (epoch milliseconds): who holds it, its last
    heartbeat (age and time), the lease, and in how many seconds (and when) it may be taken over
    if the holder does not renew it. ``advice`` (what the caller should do) ends the message.

    Fields: ``batch_id``, ``holder``, ``heartbeat_age_seconds``, ``heartbeat_at`` and
    ``takeover_at`` (ISO 8601 UTC), ``lease_seconds``, ``seconds_left``.
    """
    age = max(0.0, (now_ms - heartbeat_ms) / 1000)
    left = max(0.0, lease_seconds - age)
    beat_at = format_timestamp(datetime.fromtimestamp(heartbeat_ms / 1000, timezone.utc))
    takeover_at = format_timestamp(datetime.fromtimestamp(heartbeat_ms / 1000 + lease_seconds, timezone.utc))
    return BatchLeaseHeldError(
        f"{what} is being run by {holder} (last heartbeat {age:.1f}s ago, lease {lease_seconds:g}s): it may be taken "
        f"over in {left:.0f}s (at {takeover_at}) if that holder does not renew its lease; its last heartbeat was at "
        f"{beat_at}, and a live holder renews it every {heartbeat_interval(lease_seconds):g}s. {advice}",
        batch_id=batch_id, holder=holder, heartbeat_age_seconds=age, heartbeat_at=beat_at, takeover_at=takeover_at,
        lease_seconds=lease_seconds, seconds_left=left,
    )  # fmt: skip


class LeaseHolding:
    """The lease methods of :class:`~airflow_kinesis_spark.core.store.DynamoDBCheckpointStore`, a
    mixin of that class only (``core.store``; not meant to be used alone).

    What they take from the store, declared below and defined there: the attributes
    ``stream_name`` and ``consumer_name`` (set by ``DynamoDBCheckpointStore.__init__``, named in
    errors), ``clock`` (the heartbeats' time), and its methods ``head()`` (the head, read strongly consistent) and ``_update_head()``
    (one conditional update of the head; a lost condition raises
    :class:`~airflow_kinesis_spark.exceptions.CheckpointConflictError`). Nothing else: this class
    keeps no state of its own. ``hold_lease`` and ``hold_hand_off`` renew through
    ``self.heartbeat`` and give the lease back through ``self.release``, looked up on the store's
    class at each call (where tests patch them).
    """

    # Provided by DynamoDBCheckpointStore (core.store): see the class docstring.
    stream_name: str
    consumer_name: str
    #: Seconds since the epoch, the clock of the heartbeats this store writes and compares
    #: (``DynamoDBCheckpointStore(clock=...)``; default ``time.time``): tests move it instead of sleeping.
    clock: Callable[[], float]

    def now_ms(self) -> int:
        """The store's clock in epoch milliseconds (what a heartbeat holds)."""
        return int(self.clock() * 1000)

    if TYPE_CHECKING:

        def head(self) -> Head: ...

        def _update_head(
            self, update: str, condition: str, values: dict[str, Any], *, action: str, owner: str,
            applied: Callable[[Head], bool] | None = None,
        ) -> None: ...  # fmt: skip

    def take_over(self, batch_id: int, owner: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Head:
        """Become the holder of pending batch ``batch_id`` (a retry re-using its plan).

        Only once the holder's lease expired: no heartbeat for ``lease_seconds``. The previous
        holder is fenced off: its heartbeat, report and commit are refused from now on.

        :raises BatchLeaseHeldError: the holder's lease is alive (another run is at work).
        :raises CheckpointConflictError: ``batch_id`` is no longer pending.
        """
        head = self.head()
        self._raise_if_leased(head, batch_id, owner, lease_seconds)
        try:
            self._update_lease(batch_id, owner, lease_seconds)
        except CheckpointConflictError:
            self._raise_if_leased(self.head(), batch_id, owner, lease_seconds)  # renewed meanwhile
            raise
        log.info("took over pending batch %d from %s", batch_id, head.pending_owner)
        return self.head()

    def claim(
        self, batch_id: int, lease_owner: str, writer: str, lease_seconds: float = DEFAULT_LEASE_SECONDS, *,
        before_report: bool = False,
    ) -> Head:
        """Become the holder of pending batch ``batch_id`` as ``writer``, on behalf of ``lease_owner``.

        The hand-off between the run that planned a batch (``lease_owner``: the operator, or the
        plan task of a split task group) and the processes it hands the batch to (a Spark
        driver, the commit task); each of those claims under its own ``writer`` id, by
        convention ``{lease_owner}/{role}-{random}`` (:func:`writer_id`). The claim applies when
        the batch is pending and held

        * by ``lease_owner`` itself (it handed the batch over; its lease need not have expired),
        * by ``writer`` already (a retried request), or
        * by another writer of ``lease_owner`` whose lease expired (a driver that died) or was
          released (:meth:`release`: a driver that finished), or, unless ``before_report``, that
          recorded the batch's report already (it is done; its release may not have landed yet).

        Every earlier writer is fenced off from then on: its heartbeat, report and commit are refused.

        :param before_report: claim only while no report is recorded (a driver: a batch whose
            output another driver published and recorded is never run again, even by a driver
            that found no report before it claimed and stalled meanwhile).
        :returns: the head after the claim.
        :raises BatchLeaseHeldError: another writer of ``lease_owner`` holds a live lease (another
            driver of this batch is at work).
        :raises CheckpointConflictError: ``batch_id`` is not pending, or another run took it over
            (a holder that is not ``lease_owner`` nor one of its writers): this caller's
            arguments are stale; or, with ``before_report``, a report is recorded.
        """
        if writer != lease_owner and not writer.startswith(lease_owner + "/"):
            raise ValueError(f"writer {writer!r} must be {lease_owner!r} or start with {lease_owner + '/'!r}")
        head = self.head()
        # A writer that recorded the report is done with the batch even before it releases its
        # lease (the commit may claim it at once: no race with the release).
        reported = not before_report and head.pending_report_owner is not None and head.pending_report_owner == head.pending_owner
        if head.pending_batch_id == batch_id and head.pending_owner not in (lease_owner, writer) and not reported:
            if (head.pending_owner or "").startswith(lease_owner + "/"):
                self._raise_if_leased(head, batch_id, writer, lease_seconds)
        self._update_head(
            "SET pending_owner = :w, pending_since = :t, pending_heartbeat = :hb",
            ("attribute_not_exists(pending_report_owner) AND " if before_report else "")
            + "pending_batch_id = :n AND (pending_owner = :lo OR pending_owner = :w OR (begins_with(pending_owner, :lop) "
            "AND (attribute_not_exists(pending_heartbeat) OR pending_heartbeat < :stale"
            + ("" if before_report else " OR pending_report_owner = pending_owner")
            + ")))",
            {":n": {"N": str(batch_id)}, ":w": {"S": writer}, ":lo": {"S": lease_owner}, ":lop": {"S": lease_owner + "/"},
             ":t": {"S": _now()}, ":hb": {"N": str(self.now_ms())}, ":stale": {"N": str(self.now_ms() - int(lease_seconds * 1000))}},
            action=f"claim pending batch {batch_id} for {lease_owner}{' before its report is recorded' if before_report else ''}",
            owner=writer,
            applied=lambda h: h.pending_batch_id == batch_id and h.pending_owner == writer,
        )  # fmt: skip
        log.info("writer %s claimed pending batch %d (from %s)", writer, batch_id, head.pending_owner)
        return self.head()

    def _raise_if_leased(self, head: Head, batch_id: int, owner: str, lease_seconds: float) -> None:
        """Raise :class:`BatchLeaseHeldError` when another writer's lease on ``batch_id`` is alive."""
        if head.pending_batch_id == batch_id and head.pending_owner != owner and head.pending_heartbeat is not None:
            now_ms = self.now_ms()
            age = (now_ms - head.pending_heartbeat) / 1000
            if age < lease_seconds:
                raise lease_held_error(
                    f"batch {batch_id} of stream {self.stream_name!r}, consumer {self.consumer_name!r}", batch_id,
                    head.pending_owner, head.pending_heartbeat, lease_seconds, now_ms=now_ms,
                    advice=f"Another run of this consumer is at work, or one that died less than {lease_seconds:g}s ago; "
                    "retry after that (a task's retry_delay longer than lease_seconds does it: docs/troubleshooting.md).",
                )  # fmt: skip

    def _update_lease(self, batch_id: int, owner: str, lease_seconds: float) -> None:
        self._update_head(
            "SET pending_owner = :o, pending_since = :t, pending_heartbeat = :hb",
            "pending_batch_id = :n AND (attribute_not_exists(pending_heartbeat) OR pending_heartbeat < :stale "
            "OR pending_owner = :o)",
            {":n": {"N": str(batch_id)}, ":o": {"S": owner}, ":t": {"S": _now()}, ":hb": {"N": str(self.now_ms())},
             ":stale": {"N": str(self.now_ms() - int(lease_seconds * 1000))}},
            action=f"take over pending batch {batch_id}",
            owner=owner,
            applied=lambda h: h.pending_batch_id == batch_id and h.pending_owner == owner,
        )  # fmt: skip

    def release(self, batch_id: int, owner: str) -> None:
        """Give up the lease on pending batch ``batch_id`` (this run failed and stops): the next
        attempt may take the batch over at once. A no-op if another writer holds it already."""
        try:
            self._update_head(
                "SET pending_heartbeat = :zero",
                "pending_batch_id = :n AND pending_owner = :o",
                {":n": {"N": str(batch_id)}, ":o": {"S": owner}, ":zero": {"N": "0"}},
                action=f"release the lease on batch {batch_id}",
                owner=owner,
            )
        except CheckpointConflictError:
            log.info("lease on batch %d already taken over; nothing to release", batch_id)

    def release_handed(self, batch_id: int, lease_owner: str) -> None:
        """Give up the lease on pending batch ``batch_id`` for ``lease_owner`` and its writers
        (:meth:`claim`): the run that handed the batch to a job knows the job's processes ended
        (its spark-submit returned), so a retry need not wait for the lease to expire. A no-op if
        another run holds the batch."""
        try:
            self._update_head(
                "SET pending_heartbeat = :zero",
                "pending_batch_id = :n AND (pending_owner = :lo OR begins_with(pending_owner, :lop))",
                {":n": {"N": str(batch_id)}, ":lo": {"S": lease_owner}, ":lop": {"S": lease_owner + "/"}, ":zero": {"N": "0"}},
                action=f"release the lease on batch {batch_id}",
                owner=lease_owner,
            )
        except CheckpointConflictError:
            log.info("lease on batch %d is held by another run; nothing to release", batch_id)

    @contextmanager
    def hold_hand_off(self, batch_id: int, lease_owner: str, lease_seconds: float) -> Iterator[None]:
        """Keep ``lease_owner``'s lease on pending batch ``batch_id`` alive while the batch waits for
        its job to claim it (:meth:`claim`): spark-submit, the JVM's start or a cluster's queue may
        take longer than the lease, and another run of the consumer must not take over a batch
        that a live run is handing to its job.

        A daemon thread renews the heartbeat (:meth:`heartbeat` as ``lease_owner``) every
        ``lease_seconds / 4`` (:func:`heartbeat_interval`) and stops at the first renewal that finds another holder: the job's
        driver claimed the batch and renews its own lease from then on (or the batch moved on).
        Any other renewal error is logged as a warning and retried at the next renewal. On exit
        the thread is stopped and joined (at most 10 s); nothing is released (see
        :meth:`release_handed`).

        :raises ValueError: ``lease_seconds`` is not > 0.
        """
        if not lease_seconds or lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0 seconds; got {lease_seconds!r}")
        done = threading.Event()

        def renew() -> None:
            while not done.wait(heartbeat_interval(lease_seconds)):
                try:
                    self.heartbeat(batch_id, lease_owner)
                except CheckpointConflictError:
                    log.info("batch %d is no longer held by %s (its job claimed it): the job renews the lease now",
                             batch_id, lease_owner)  # fmt: skip
                    return
                except Exception as err:  # noqa: BLE001 - a missed heartbeat is retried next time
                    log.warning("could not renew the lease on handed batch %d (writer %s): %s", batch_id, lease_owner, err)

        thread = threading.Thread(target=renew, name=f"hand-off-batch-{batch_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=10)

    def heartbeat(self, batch_id: int, owner: str) -> None:
        """Renew this writer's lease on pending batch ``batch_id``.

        :raises CheckpointConflictError: another writer took the batch over (this one is fenced).
        """
        self._update_head(
            "SET pending_heartbeat = :hb",
            "pending_batch_id = :n AND pending_owner = :o",
            {":n": {"N": str(batch_id)}, ":o": {"S": owner}, ":hb": {"N": str(self.now_ms())}},
            action=f"renew the lease on batch {batch_id}",
            owner=owner,
        )

    @contextmanager
    def hold_lease(
        self,
        batch_id: int,
        owner: str,
        lease_seconds: float,
        on_lost: Callable[[CheckpointConflictError], None] | None = None,
    ) -> Iterator[None]:
        """Hold the lease on pending batch ``batch_id`` while the body runs (e.g. the Spark job).

        A daemon thread renews the lease (:meth:`heartbeat`) every ``lease_seconds / 4``
        (:func:`heartbeat_interval`). If a
        renewal finds that another writer took the batch over (this run stalled past its lease),
        the lease is lost: the error is logged, ``on_lost(err)`` is called from the thread (the
        caller kills its job there: its output must not race the other writer's) and renewing
        stops. Any other renewal error is logged as a warning and retried at the next renewal.

        On exit the thread is stopped and joined (at most 10 s), and:

        - the body raised and the lease was lost: the :class:`CheckpointConflictError` is raised
          (``from None``: the body's failure is a consequence of the take-over);
        - the body raised otherwise: the lease is released (:meth:`release`, best effort), so a
          retry need not wait for it to expire, and the body's exception is re-raised;
        - the body returned but the lease was lost: the :class:`CheckpointConflictError` is raised.

        :param batch_id: the pending batch this writer holds (after
            :meth:`~airflow_kinesis_spark.core.store.DynamoDBCheckpointStore.begin` or :meth:`take_over`).
        :param owner: this writer.
        :param lease_seconds: the lease, seconds (as given to :meth:`take_over`); renewed every
            quarter of it. Must be > 0.
        :param on_lost: called once, from the renewal thread, when the lease is lost; an error it
            raises is logged.
        :raises ValueError: ``lease_seconds`` is not > 0 (before anything starts).
        :raises CheckpointConflictError: the lease was lost while the body ran.
        """
        if not lease_seconds or lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0 seconds; got {lease_seconds!r}")
        done = threading.Event()
        lost: list[CheckpointConflictError] = []

        def renew() -> None:
            while not done.wait(heartbeat_interval(lease_seconds)):
                try:
                    self.heartbeat(batch_id, owner)
                except CheckpointConflictError as err:
                    lost.append(err)
                    log.error("lost the lease on batch %d (writer %s): %s", batch_id, owner, err)
                    if on_lost is not None:
                        try:
                            on_lost(err)
                        except Exception:  # noqa: BLE001 - the loss itself is raised on exit
                            log.exception("on_lost callback for batch %d failed", batch_id)
                    return
                except Exception as err:  # noqa: BLE001 - a missed heartbeat is retried next time
                    log.warning("could not renew the lease on batch %d (writer %s): %s", batch_id, owner, err)

        thread = threading.Thread(target=renew, name=f"lease-batch-{batch_id}", daemon=True)
        thread.start()

        def stop() -> None:
            done.set()
            thread.join(timeout=10)

        try:
            yield
        except Exception:
            stop()
            if lost:
                raise lost[0] from None
            try:
                self.release(batch_id, owner)  # this run stops here: its retry need not wait for the lease
            except Exception as err:  # noqa: BLE001 - the body's error is the one to report; the lease expires
                log.warning("could not release the lease on batch %d (writer %s): %s", batch_id, owner, err)
            raise
        finally:
            stop()
        if lost:
            raise lost[0]
