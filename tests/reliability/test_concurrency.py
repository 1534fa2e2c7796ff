"""Two runs of one consumer at once: exactly one commits; the other fails naming the other writer."""

from __future__ import annotations

import json

import pytest

from demo.producer import put_aggregated, put_plain
from tests.conftest import create_stream
from tests.reliability.fault_proxy import FaultProxy
from tests.reliability.harness import Consumer, wait_until

pytestmark = [pytest.mark.reliability, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def setup(moto_endpoint, kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i % 11}", f"plain {i}".encode()) for i in range(150)])
    produced += put_aggregated(kinesis, unique_name, [(f"a{i % 3}", f"agg {i}".encode()) for i in range(150)])
    proxy = FaultProxy(moto_endpoint).start()
    (tmp_path / "logs").mkdir()
    yield Consumer(unique_name, "lake", f"{unique_name}_t", tmp_path / "out", proxy, dynamodb, tmp_path / "logs"), produced
    proxy.stop()


def outcome(consumer: Consumer, run: int) -> tuple[int, str]:
    text = (consumer.log_dir / f"run{run:03d}.log").read_text()
    return (0 if '"error"' not in text.strip().splitlines()[-1] else 1), text


def test_two_runs_started_together_one_wins(setup):
    consumer, produced = setup
    first, second = consumer.start(), consumer.start()
    codes = [first.wait(timeout=300), second.wait(timeout=300)]
    assert sorted(codes) == [0, 1], codes
    loser = 1 + codes.index(1)
    _, text = outcome(consumer, loser)
    error = json.loads(text.strip().splitlines()[-1])["error"]
    head = consumer.store.head()
    assert head.committed_batch_id == 1 and head.committed_owner
    # The loser names the other batch and the other writer, and is not retried blindly. The
    # batch is committed by the winner's commit writer ({owner}/commit-{random}, core.job.writer_id).
    winner = head.committed_owner.split("/")[0]
    assert "batch 1" in error and winner.rsplit(".", 1)[-1] in error, error
    assert "AirflowFailException" in error or "BatchLeaseHeldError" in error
    assert consumer.check(produced).records_out == 300  # nothing of the loser is visible


def test_a_run_started_while_another_holds_the_batch_fails_naming_it(setup):
    consumer, produced = setup
    holder = consumer.start()
    assert wait_until(lambda: consumer.store.head().pending_batch_id == 1, 120, holder)
    pending_owner = consumer.store.head().pending_owner
    assert consumer.start().wait(timeout=120) == 1  # a second DAG run, or a zombie retry
    _, text = outcome(consumer, 2)
    error = json.loads(text.strip().splitlines()[-1])["error"]
    assert error.startswith("BatchLeaseHeldError") and pending_owner in error and "batch 1" in error
    assert holder.wait(timeout=300) == 0
    assert consumer.check(produced).records_out == 300
