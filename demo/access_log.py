"""The demos' input and its checks, in one place: the shared access log, the KPL vectors, how they
are put on a stream, and what the committed output must hold."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Callable, Sequence
from typing import Any

from demo.producer import Produced, Verdict, put_aggregated, put_plain, put_raw
from demo.stack import ROOT

#: Columns the demos read back from the committed Parquet output.
ROW_COLUMNS = ("shard_id", "sequence_number", "sub_sequence_number", "partition_key", "explicit_hash_key", "data", "log_parsed")


def log_lines() -> list[tuple[str, bytes]]:
    """The lines of data/apache_access_log.gz as (partition key = client IP, line)."""
    with gzip.open(ROOT / "data" / "apache_access_log.gz", "rt", encoding="utf-8") as fh:
        lines = [line.rstrip("\n") for line in fh if line.strip()]
    return [(line.split(" ", 1)[0], line.encode("utf-8")) for line in lines]


def kpl_vectors() -> list[dict]:
    """The Kinesis records of data/kpl_vectors.json (KPL aggregates with their expected user records)."""
    return json.loads((ROOT / "data" / "kpl_vectors.json").read_text())["vectors"]


def put_lines(kinesis: Any, stream: str, lines: Sequence[tuple[str, bytes]]) -> list[Produced]:
    """Half of ``lines`` as plain puts, half KPL-aggregated (aws_kinesis_agg)."""
    half = len(lines) // 2
    return put_plain(kinesis, stream, lines[:half]) + put_aggregated(kinesis, stream, lines[half:])


def put_vectors(kinesis: Any, stream: str, vectors: list[dict]) -> list[Produced]:
    """The KPL vectors' Kinesis records, as they are."""
    return put_raw(
        kinesis, stream,
        [(v["partition_key"], base64.b64decode(v["data_base64"]),
          [(u["sub_sequence_number"], u["partition_key"], u["data"].encode()) for u in v["expected_user_records"]])
         for v in vectors],
    )  # fmt: skip


def vector_matches(vectors: list[dict], rows: list[tuple]) -> tuple[int, int]:
    """(user records of ``vectors`` found exactly once in ``rows`` with every field as the file says,
    user records of ``vectors``); ``rows`` in :data:`ROW_COLUMNS` order."""
    found = total = 0
    for v in vectors:
        for u in v["expected_user_records"]:
            total += 1
            match = [r for r in rows if r[3] == u["partition_key"] and r[2] == u["sub_sequence_number"]
                     and r[4] == u["explicit_hash_key"] and r[5] == u["data"].encode()]  # fmt: skip
            found += len(match) == 1
    return found, total


def report_verdict(say: Callable[[str], None], verdict: Verdict, vectors: tuple[int, int], parsed: int, log_file: Any) -> dict[str, Any]:
    """Say what the committed output holds against the producer's log; the JSON summary's common fields."""
    say(f"user records produced {verdict.records_in}, in committed output {verdict.records_out} "
        f"(rows {verdict.rows}), duplicates {verdict.duplicates}, missing {verdict.missing}, "
        f"unexpected {verdict.unexpected}, data mismatches {verdict.data_mismatches}")  # fmt: skip
    say(f"kpl_vectors.json user records found exactly as the file says: {vectors[0]}/{vectors[1]}")
    say(f"log lines parsed into columns: {parsed}; Airflow log: {log_file}")
    return {
        "records_in": verdict.records_in,
        "records_out": verdict.records_out,
        "duplicates": verdict.duplicates,
        "missing": verdict.missing,
        "unexpected": verdict.unexpected,
        "data_mismatches": verdict.data_mismatches,
    }
