"""The benchmark's peers section reads what it measures: its async-kinesis and kcl-rs adapters hand
over every user record of a backlog exactly once (``benchmarks/peers.py``), so the section cannot time a read
that skipped or repeated records."""

from __future__ import annotations

import pytest

from benchmarks.kinesis_limits import ThrottlingProxy
from benchmarks.peers import peers_headline, peers_targets, read_async_kinesis, read_kcl_rs
from benchmarks.workload import access_log_lines, load_backlog
from tests.conftest import DATA_DIR, REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = [pytest.mark.integration]

#: User records of the backlog: several KPL aggregates (of about 50 KiB) per shard.
USER_RECORDS = 3_000


@pytest.fixture(scope="module")
def lines():
    return access_log_lines(DATA_DIR / "apache_access_log.gz")


def expected_payloads(lines: list[bytes], n: int) -> list[bytes]:
    """User record ``i``'s data as the backlog loader writes it: a log line and ``#i``."""
    return [lines[i % len(lines)] + b" #%d" % i for i in range(n)]


@pytest.mark.parametrize("emulator", ["moto behind the limits proxy", "kinesalite"])
def test_async_kinesis_adapter_reads_every_record_once(request, emulator, unique_name, lines):
    if emulator == "kinesalite":
        kinesis, upstream = request.getfixturevalue("kinesalite"), request.getfixturevalue("kinesalite_endpoint")
    else:
        kinesis, upstream = request.getfixturevalue("kinesis"), request.getfixturevalue("moto_endpoint")
    create_stream(kinesis, unique_name, 2)
    loaded = load_backlog(kinesis, unique_name, 0, lines, user_records=USER_RECORDS)
    assert loaded["kinesis_records"] > 2  # more than one aggregate per shard: the reads page
    got: list[bytes] = []
    try:
        if emulator == "kinesalite":
            out = read_async_kinesis(upstream, unique_name, USER_RECORDS, region=REGION, access_key=TEST_ACCESS_KEY,
                                     secret_key=TEST_SECRET_KEY, keep=got, stall_seconds=30)  # fmt: skip
        else:
            with ThrottlingProxy(upstream) as proxy:
                out = read_async_kinesis(proxy.endpoint, unique_name, USER_RECORDS, region=REGION, access_key=TEST_ACCESS_KEY,
                                         secret_key=TEST_SECRET_KEY, keep=got, stall_seconds=30)  # fmt: skip
                assert proxy.stats[f"bytes:{unique_name}"] == loaded["bytes"]  # each Kinesis record served once
    finally:
        kinesis.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)
    assert out["records"] == USER_RECORDS
    assert len(got) == USER_RECORDS
    assert sorted(got) == sorted(expected_payloads(lines, USER_RECORDS))  # every one, none twice


@pytest.mark.slow
def test_kcl_rs_adapter_reads_every_record_once(kinesis, moto_endpoint, unique_name, lines):
    """kcl-rs behind the limits proxy (its lease tables in moto through it): the KCL de-aggregates
    the KPL records and hands each user record over once."""
    create_stream(kinesis, unique_name, 2)
    loaded = load_backlog(kinesis, unique_name, 0, lines, user_records=USER_RECORDS)
    got: list[bytes] = []
    try:
        with ThrottlingProxy(moto_endpoint) as proxy:
            out = read_kcl_rs(proxy.endpoint, unique_name, USER_RECORDS, application=f"{unique_name}-kcl", region=REGION,
                              access_key=TEST_ACCESS_KEY, secret_key=TEST_SECRET_KEY, keep=got, stall_seconds=60)  # fmt: skip
            assert proxy.stats[f"bytes:{unique_name}"] >= loaded["bytes"]
    finally:
        kinesis.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)
    assert out["records"] == USER_RECORDS
    assert sorted(got) == sorted(expected_payloads(lines, USER_RECORDS))  # every one, none twice


def test_async_kinesis_adapter_fails_loudly_when_records_are_missing(kinesis, moto_endpoint, unique_name, lines):
    """Asked for more records than the stream holds, it stops with an error instead of measuring."""
    create_stream(kinesis, unique_name, 1)
    load_backlog(kinesis, unique_name, 0, lines, user_records=50)
    try:
        with pytest.raises(TimeoutError, match="50 of 51 records"):
            read_async_kinesis(moto_endpoint, unique_name, 51, region=REGION, access_key=TEST_ACCESS_KEY,
                               secret_key=TEST_SECRET_KEY, stall_seconds=3)  # fmt: skip
    finally:
        kinesis.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)


def test_headline_and_targets_compare_ours_with_each_peer():
    def run(fraction: float) -> dict:
        return {"throttled": {"fraction_of_limit": fraction, "records_per_s": 1000.0, "cpu_s": 2.0},
                "unthrottled": {"records_per_s": 5000.0, "cpu_s": 3.0}}  # fmt: skip

    peers = {"consumers": {"ours": run(0.9), "async_kinesis": run(0.95), "naive": run(0.2)}}
    headline = peers_headline(peers)
    assert headline["async_kinesis"] == {"throttled_fraction_of_limit": 0.95, "records_per_s": 1000, "cpu_s": 2.0,
                                         "unthrottled_records_per_s": 5000, "unthrottled_cpu_s": 3.0}  # fmt: skip
    met = {name.split(">= ")[1]: ok for name, _, ok in peers_targets(peers)}
    assert met == {"async_kinesis's": False, "naive's": True}
