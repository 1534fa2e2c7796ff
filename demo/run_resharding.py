"""Resharding while ingesting, end to end on a local stack (``make demo-resharding``).

1. kinesalite (Kinesis, with real-looking 56-digit sequence numbers and real split/merge) and
   moto in server mode (DynamoDB, the checkpoint table), both on 127.0.0.1; a 2-shard stream.
2. A producer thread puts records continuously until told to stop: ~40 partition keys, each
   record's data ``{"key": k, "n": <per-key counter>}``, alternately plain (PutRecords) and
   KPL-aggregated (aws_kinesis_agg, one key per aggregate). It logs every user record's shard,
   sequence number, sub-sequence number, partition key and data digest from the put responses.
3. ``KinesisToSparkOperator`` runs in-process, one micro-batch per ``execute``, while the
   producer runs: batch; SplitShard (at the midpoint of a shard's hash range); batch; batch;
   MergeShards (two adjacent open shards); batch; the producer stops; batches until a run finds
   no new records and no shard is waiting for its parents.
4. The committed Parquet output (``batch_id <= committed_batch_id`` of the checkpoint table's
   head) is read back and checked against the producer's log: exactly once, and per partition
   key no record of a child shard committed in the same or an earlier batch than an earlier
   record (smaller counter) of one of its ancestor shards (ORDER).

The last line printed is one JSON object: records_in, records_out, duplicates, missing,
order_violations, splits, merges, batches, and more. Exit code 0 only if the run was exactly
once and in order, and at least one split and one merge happened during ingestion.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import random
import shutil
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import boto3

from demo.producer import Produced, committed_rows, put_aggregated, put_plain, verify
from demo.stack import ACCESS_KEY, BIN, REGION, ROOT, SECRET_KEY, kinesalite_server, moto_server

STREAM = "resharding-demo"
CONSUMER = "resharding-lake"
TABLE = "kinesis_spark_resharding_checkpoints"
KEYS = 40
#: Operator runs in all, a bound on the drain loop too.
MAX_RUNS = 12
KINESALITE_DEFAULT = ROOT / ".cache" / "node" / "node_modules" / ".bin" / "kinesalite"

log = logging.getLogger("demo.resharding")
#: Where say() writes: the console, also while fds 1 and 2 go to the log file.
_console = sys.stdout


def say(message: str) -> None:
    print(f"[resharding] {message}", file=_console, flush=True)


@contextmanager
def console_to_log(log_file: Path) -> Iterator[None]:
    """Send file descriptors 1 and 2 to ``log_file`` (Airflow's task logs and spark-submit's
    output are written there); :func:`say` keeps writing to the console."""
    global _console
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_file, "ab") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
    _console = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        _console.close()
        _console = sys.stdout


# -- the stack -------------------------------------------------------------------------------


def client(service: str, endpoint: str) -> Any:
    return boto3.client(
        service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY
    )


def shards_of(kinesis: Any) -> list[dict[str, Any]]:
    shards: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"StreamName": STREAM}
    while True:
        page = kinesis.list_shards(**kwargs)
        shards.extend(page["Shards"])
        if not page.get("NextToken"):
            return shards
        kwargs = {"NextToken": page["NextToken"]}


def open_shards(kinesis: Any) -> list[dict[str, Any]]:
    """Open shards, by starting hash key."""
    shards = [s for s in shards_of(kinesis) if "EndingSequenceNumber" not in s["SequenceNumberRange"]]
    return sorted(shards, key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))


def wait_active(kinesis: Any, expected_shards: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status = kinesis.describe_stream_summary(StreamName=STREAM)["StreamDescriptionSummary"]["StreamStatus"]
        if status == "ACTIVE" and len(shards_of(kinesis)) == expected_shards:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {STREAM} not ACTIVE with {expected_shards} shards after {timeout}s (status {status})")
        time.sleep(0.05)


def split(kinesis: Any, shard: dict[str, Any]) -> dict[str, Any]:
    """SplitShard at the midpoint of the shard's hash key range; waits for ACTIVE."""
    low, high = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
    midpoint = (low + high + 1) // 2
    before = len(shards_of(kinesis))
    kinesis.split_shard(StreamName=STREAM, ShardToSplit=shard["ShardId"], NewStartingHashKey=str(midpoint))
    wait_active(kinesis, before + 2)
    children = sorted(s["ShardId"] for s in shards_of(kinesis) if s.get("ParentShardId") == shard["ShardId"])
    return {"op": "split", "parents": [shard["ShardId"]], "children": children, "new_starting_hash_key": str(midpoint)}


def merge(kinesis: Any) -> dict[str, Any]:
    """MergeShards of the two adjacent open shards with the highest hash keys; waits for ACTIVE."""
    shards = open_shards(kinesis)
    pairs = [
        (a, b) for a, b in zip(shards, shards[1:])
        if int(a["HashKeyRange"]["EndingHashKey"]) + 1 == int(b["HashKeyRange"]["StartingHashKey"])
    ]  # fmt: skip
    if not pairs:
        raise RuntimeError("no two adjacent open shards to merge")
    a, b = pairs[-1]
    before = len(shards_of(kinesis))
    kinesis.merge_shards(StreamName=STREAM, ShardToMerge=a["ShardId"], AdjacentShardToMerge=b["ShardId"])
    wait_active(kinesis, before + 1)
    children = sorted(
        s["ShardId"] for s in shards_of(kinesis)
        if s.get("ParentShardId") == a["ShardId"] and s.get("AdjacentParentShardId") == b["ShardId"]
    )  # fmt: skip
    return {"op": "merge", "parents": [a["ShardId"], b["ShardId"]], "children": children}


# -- the producer ----------------------------------------------------------------------------


class Producer(threading.Thread):
    """Puts records until stopped; plain and KPL-aggregated rounds alternate."""

    def __init__(self, kinesis: Any, *, per_round: int = 20, pause: float = 0.2, seed: int = 7) -> None:
        super().__init__(name="producer", daemon=True)
        self.kinesis = kinesis
        self.per_round = per_round
        self.pause = pause
        self.random = random.Random(seed)
        self.keys = [f"key-{i:02d}" for i in range(KEYS)]
        self.counters: Counter[str] = Counter()
        self.produced: list[Produced] = []
        self.rounds = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def records(self) -> list[tuple[str, bytes]]:
        out = []
        for _ in range(self.per_round):
            key = self.random.choice(self.keys)
            out.append((key, json.dumps({"key": key, "n": self.counters[key]}).encode()))
            self.counters[key] += 1
        return out

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                batch = self.records()
                if self.rounds % 2 == 0:
                    self.produced.extend(put_plain(self.kinesis, STREAM, batch))
                else:
                    self.produced.extend(put_aggregated(self.kinesis, STREAM, batch, per_aggregate=8))
                self.rounds += 1
                self._halt.wait(self.pause)
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            self.error = err
            log.exception("producer failed")

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        if self.error is not None:
            raise RuntimeError(f"the producer failed: {self.error!r}") from self.error


# -- batches ---------------------------------------------------------------------------------


class Batches:
    """Runs KinesisToSparkOperator in-process, one micro-batch per call."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.runs: list[dict[str, Any]] = []

    def run(self, label: str) -> dict[str, Any]:
        from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
        from airflow_kinesis_spark.operators.settings import ReadOptions

        operator = KinesisToSparkOperator(
            task_id=f"resharding_run_{len(self.runs) + 1}",
            stream_name=STREAM,
            consumer_name=CONSUMER,
            checkpoint_table=TABLE,
            output_path=str(self.output),
            read_options=ReadOptions(min_call_interval=0.0),
        )
        started = time.monotonic()
        summary = operator.execute({})
        summary["seconds"] = round(time.monotonic() - started, 1)
        summary["label"] = label
        self.runs.append(summary)
        say(describe_run(len(self.runs), summary))
        return summary


def describe_run(number: int, summary: dict[str, Any]) -> str:
    shards = ", ".join(
        f"{sid.replace('shardId-', '')}={s['records']}" + (" END" if s["shard_end"] else "")
        for sid, s in sorted(summary["shards"].items())
    )  # fmt: skip
    waiting = ", ".join(s.replace("shardId-", "") for s in sorted(summary["waiting_shards"]))
    batch = f"batch {summary['batch_id']}" if summary["batch_id"] is not None else "no batch"
    return (
        f"run {number} ({summary['label']}): {batch}, {summary['status']}, {summary['records']} records "
        f"in {summary['seconds']}s; per shard: {shards or '-'}" + (f"; waiting: {waiting}" if waiting else "")
    )


# -- the verdict -----------------------------------------------------------------------------


def ancestors_of(shards: list[dict[str, Any]]) -> dict[str, set[str]]:
    parents = {s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p] for s in shards}

    def walk(shard_id: str, seen: set[str]) -> set[str]:
        for parent in parents.get(shard_id, []):
            if parent not in seen:
                seen.add(parent)
                walk(parent, seen)
        return seen

    return {shard_id: walk(shard_id, set()) for shard_id in parents}


def order_violations(rows: list[tuple], ancestors: dict[str, set[str]]) -> tuple[int, int]:
    """Count ORDER violations in committed output.

    Across shards: pairs (r_child, r_parent) of one partition key where r_parent is in an
    ancestor shard of r_child's shard, has a smaller counter ``n``, and r_child's batch id is at
    or before r_parent's. Within a shard: pairs of one key where the record with the larger
    ``n`` was committed in an earlier batch.

    :returns: (across-shard pairs, within-shard pairs).
    """
    by_key: dict[str, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for batch_id, shard_id, _seq, _sub, _pk, data in rows:
        record = json.loads(data)
        by_key[record["key"]][shard_id].append((record["n"], batch_id))
    across = within = 0
    for per_shard in by_key.values():
        for shard_id, records in per_shard.items():
            # Within the shard: a larger n in a strictly earlier batch than a smaller n.
            records.sort()
            latest_batch = 0
            for _n, batch_id in records:
                if batch_id < latest_batch:
                    within += 1
                latest_batch = max(latest_batch, batch_id)
            older = [r for a in ancestors.get(shard_id, ()) for r in per_shard.get(a, ())]
            if not older:
                continue
            # For each batch b of this shard: the ancestors' counters committed in batch >= b.
            for batch_id in {b for _, b in records}:
                counters = sorted(n for n, b in older if b >= batch_id)
                across += sum(bisect.bisect_left(counters, n) for n, b in records if b == batch_id)
    return across, within


def lineage_lines(shards: list[dict[str, Any]], produced: Counter, out: Counter) -> list[str]:
    lines = []
    for s in sorted(shards, key=lambda s: s["ShardId"]):
        parents = [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p]
        closed = "EndingSequenceNumber" in s["SequenceNumberRange"]
        low, high = int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"])
        lines.append(
            f"  {s['ShardId']}  {'closed' if closed else 'open  '}  hash {low / 2**128:.3f}..{(high + 1) / 2**128:.3f}"
            f"  parents: {', '.join(parents) or '-':<43}  produced {produced[s['ShardId']]:>6}, committed {out[s['ShardId']]:>6}"
        )
    return lines


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=str(ROOT / "demo_output" / "resharding"), help="output, log and Airflow's home")
    parser.add_argument("--kinesalite", default=os.environ.get("KINESALITE_BIN") or str(KINESALITE_DEFAULT))
    args = parser.parse_args(argv)

    started = time.monotonic()
    work = Path(args.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "airflow_home").mkdir(parents=True)
    output = work / "parquet"
    log_file = work / "resharding.log"
    # Airflow (in this process) and Spark (spark-submit from this process) need these first.
    os.environ["AIRFLOW_HOME"] = str(work / "airflow_home")
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        os.environ.pop(key, None)

    with ExitStack() as stack:
        stack.enter_context(console_to_log(log_file))
        kinesis_endpoint = stack.enter_context(kinesalite_server(args.kinesalite))
        moto_endpoint = stack.enter_context(moto_server())
        say(f"kinesalite (Kinesis) on {kinesis_endpoint}, moto (DynamoDB) on {moto_endpoint}; log: {log_file}")
        os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(
            {
                "conn_type": "aws",
                "login": ACCESS_KEY,
                "password": SECRET_KEY,
                "extra": {
                    "region_name": REGION,
                    "endpoint_url": moto_endpoint,
                    "service_config": {"kinesis": {"endpoint_url": kinesis_endpoint}},
                },
            }
        )
        import airflow_kinesis_spark.operators.kinesis_to_spark  # noqa: F401 - Airflow configures logging on import

        logging.getLogger().setLevel(logging.INFO)

        kinesis = client("kinesis", kinesis_endpoint)
        dynamodb = client("dynamodb", moto_endpoint)
        kinesis.create_stream(StreamName=STREAM, ShardCount=2)
        wait_active(kinesis, 2)
        say(f"stream {STREAM}: 2 shards; producer starts ({KEYS} keys, plain and KPL-aggregated rounds)")

        producer = Producer(client("kinesis", kinesis_endpoint))
        batches = Batches(output)
        reshards: list[dict[str, Any]] = []
        error: str | None = None
        drained = False
        producer.start()
        try:
            try:
                time.sleep(2.0)
                batches.run("initial production")

                op = split(kinesis, open_shards(kinesis)[0])
                op["produced_before"] = len(producer.produced)
                reshards.append(op)
                say(f"split {op['parents'][0]} -> {', '.join(op['children'])} while producing ({op['produced_before']} records so far)")
                batches.run("after the split")
                batches.run("after the split")

                op = merge(kinesis)
                op["produced_before"] = len(producer.produced)
                reshards.append(op)
                say(f"merged {' + '.join(op['parents'])} -> {', '.join(op['children'])} while producing ({op['produced_before']} records so far)")
                batches.run("after the merge")
                time.sleep(1.0)
            finally:
                producer.stop()
            # kinesalite stamps records put to a shard less than 1 s old with the shard's creation
            # time + 1 s (in the future): let every produced record's arrival time pass.
            time.sleep(1.2)
            say(f"producer stopped: {len(producer.produced)} user records in {producer.rounds} rounds")
            while len(batches.runs) < MAX_RUNS:
                summary = batches.run("draining")
                if summary["status"] == "no_new_records" and not summary["waiting_shards"]:
                    drained = True
                    break
            else:
                error = f"not drained after {MAX_RUNS} operator runs"
        except Exception as err:  # noqa: BLE001 - reported in the verdict; the traceback goes to the log
            traceback.print_exc()
            error = f"{type(err).__name__}: {err}"
        if error:
            say(f"FAILED: {error} (details in {log_file})")

        from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

        store = DynamoDBCheckpointStore(dynamodb, TABLE, STREAM, CONSUMER)
        head = store.head()
        checkpoints = store.committed_checkpoints(head)
        final_shards = shards_of(kinesis)

    produced = producer.produced
    rows = committed_rows(output, head.committed_batch_id, with_batch_id=True)
    verdict = verify(produced, [(r[1], r[2], r[3], r[4], r[5]) for r in rows])
    across, within = order_violations(rows, ancestors_of(final_shards))
    produced_by_shard = Counter(p.shard_id for p in produced)
    out_by_shard = Counter(shard_id for shard_id, _, _ in {(r[1], r[2], r[3]) for r in rows})
    for op in reshards:
        op["records_to_parents"] = sum(produced_by_shard[s] for s in op["parents"])
        op["records_to_children"] = sum(produced_by_shard[s] for s in op["children"])
        # Continuous production: the last record put to a parent and the first put to a child
        # are next to each other in the producer's log (a round or two apart).
        in_parents = [i for i, p in enumerate(produced) if p.shard_id in op["parents"]]
        in_children = [i for i, p in enumerate(produced) if p.shard_id in op["children"]]
        op["last_record_to_parents"] = in_parents[-1] if in_parents else None
        op["first_record_to_children"] = in_children[0] if in_children else None
    splits = sum(1 for op in reshards if op["op"] == "split" and op["records_to_parents"] and op["records_to_children"])
    merges = sum(1 for op in reshards if op["op"] == "merge" and op["records_to_parents"] and op["records_to_children"])

    say("batches:")
    for number, summary in enumerate(batches.runs, 1):
        say("  " + describe_run(number, summary))
    say("shard lineage as the stream ended (hash key range as a fraction of 2^128):")
    for line in lineage_lines(final_shards, produced_by_shard, out_by_shard):
        say(line)
    for op in reshards:
        say(
            f"{op['op']} {' + '.join(op['parents'])} -> {', '.join(op['children'])}: {op['records_to_parents']} records "
            f"put to the parent(s), {op['records_to_children']} to the child(ren); producer log: last record to a "
            f"parent #{op['last_record_to_parents']}, first to a child #{op['first_record_to_children']}"
        )  # fmt: skip
    say(f"committed batch id {head.committed_batch_id}; checkpoints: " + ", ".join(f"{k}={v}" for k, v in sorted(checkpoints.items())))
    say(
        f"user records produced {verdict.records_in}, in committed output {verdict.records_out} (rows {verdict.rows}), "
        f"duplicates {verdict.duplicates}, missing {verdict.missing}, unexpected {verdict.unexpected}, "
        f"data mismatches {verdict.data_mismatches}, order violations {across} across shards, {within} within shards"
    )  # fmt: skip
    result = {
        "records_in": verdict.records_in,
        "records_out": verdict.records_out,
        "duplicates": verdict.duplicates,
        "missing": verdict.missing,
        "unexpected": verdict.unexpected,
        "data_mismatches": verdict.data_mismatches,
        "order_violations": across,
        "in_shard_order_violations": within,
        "splits": splits,
        "merges": merges,
        "batches": head.committed_batch_id,
        "runs": len(batches.runs),
        "shards": len(final_shards),
        "open_shards": sum(1 for s in final_shards if "EndingSequenceNumber" not in s["SequenceNumberRange"]),
        "resharding": [
            {k: op[k] for k in ("op", "parents", "children", "records_to_parents", "records_to_children",
                                "last_record_to_parents", "first_record_to_children")}
            for op in reshards
        ],  # fmt: skip
        "drained": drained,
        "error": error,
        "output_path": str(output),
        "seconds": round(time.monotonic() - started, 1),
    }
    ok = verdict.ok and across == 0 and within == 0 and splits >= 1 and merges >= 1 and drained and not error
    print(json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
