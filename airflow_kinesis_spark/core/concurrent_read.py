"""Read many shard ranges at once: :func:`read_concurrently` runs one
:class:`~airflow_kinesis_spark.core.reader.ShardReader` per thread and interleaves their pages,
with a read-ahead bounded in pages and in bytes per reader.

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from airflow_kinesis_spark.core.pages import Page
from airflow_kinesis_spark.core.read_options import TARGET_RESPONSE_BYTES
from airflow_kinesis_spark.core.reader import ShardReader

__all__ = ["read_concurrently"]


def read_concurrently(
    readers: list[ShardReader], pages_per_reader: int = 3, bytes_per_reader: int = 2 * TARGET_RESPONSE_BYTES
) -> Iterator[tuple[ShardReader, Page | None]]:
    """Run several readers at once, one thread each, and interleave their pages.

    Reading Kinesis is waiting (each shard's read budget, network round trips), so one process
    keeps every shard of its ranges busy with threads, whatever the number of CPU cores. Yields
    ``(reader, page)`` for each page and ``(reader, None)`` once a reader finished (its
    ``report`` is then set). Pages of one reader come in order.

    Memory is bounded in pages and in bytes: a page is outstanding from when its reader made it
    until the consumer asks for the next item after taking it, and a reader calls GetRecords
    again only while it has fewer than ``pages_per_reader`` pages and fewer than
    ``bytes_per_reader`` bytes of user record data outstanding (default: two responses of
    ``TARGET_RESPONSE_BYTES``). So a reader of 10 MiB records (one record is a whole GetRecords
    response, Kinesis API reference) holds one page at a time, and one of small records reads
    ahead while the consumer works.

    :raises Exception: the first error of any reader, after the other readers were told to stop.
    """
    if not readers:
        return
    pending: queue.Queue = queue.Queue()  # bounded by the readers' outstanding pages
    stop = threading.Event()
    done = object()
    room = threading.Condition()
    #: id(reader) -> [pages, bytes] outstanding
    outstanding: dict[int, list[int]] = {id(r): [0, 0] for r in readers}

    def work(reader: ShardReader) -> None:
        held = outstanding[id(reader)]
        try:
            for page in reader.pages():
                size = sum(map(len, page.datas))
                with room:
                    held[0] += 1
                    held[1] += size
                pending.put((reader, page, size))
                with room:  # before the next GetRecords: wait for the consumer to catch up
                    while not stop.is_set() and (held[0] >= pages_per_reader or held[1] >= bytes_per_reader):
                        room.wait(0.1)
                if stop.is_set():
                    return
            pending.put((reader, done, 0))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, which raises it
            pending.put((reader, err, 0))

    threads = [threading.Thread(target=work, args=(r,), name=f"read-{r.range.shard_id}", daemon=True) for r in readers]
    for thread in threads:
        thread.start()
    running = len(readers)
    taken: tuple[int, int] | None = None  # (id(reader), bytes) of the page the consumer holds
    try:
        while running:
            if taken is not None:  # the consumer is done with the page it took last
                with room:
                    held = outstanding[taken[0]]
                    held[0] -= 1
                    held[1] -= taken[1]
                    room.notify_all()
                taken = None
            reader, item, size = pending.get()
            if item is done:
                running -= 1
                yield reader, None
            elif isinstance(item, BaseException):
                raise item
            else:
                taken = (id(reader), size)
                yield reader, item
    finally:
        stop.set()
        with room:
            room.notify_all()
        for thread in threads:
            thread.join(timeout=5)
