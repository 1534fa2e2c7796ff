"""``kinesis-spark``: look at and reset a consumer's checkpoints from a shell.

Examples::

    kinesis-spark checkpoints apache-access-log -c parquet-lake -t kinesis_spark_checkpoints
    kinesis-spark rewind apache-access-log -c parquet-lake -t kinesis_spark_checkpoints \\
        --to 2026-11-20T00:00:00Z --dry-run

AWS access comes from the default chain (environment, profile, instance role), or from an
Airflow connection with ``--aws-conn-id``. ``--endpoint-url`` points both Kinesis and DynamoDB at
a local emulator.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from airflow_kinesis_spark.core.admin import rewind as do_rewind
from airflow_kinesis_spark.core.lag import measure_lag
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore


def _console() -> Console:
    """A console sized to the terminal now (``COLUMNS`` is honoured)."""
    return Console()


def _clients(ctx: click.Context) -> tuple[Any, Any]:
    opts = ctx.obj
    if opts["aws_conn_id"]:
        from airflow_kinesis_spark.hooks.dynamodb import DynamoDBCheckpointHook
        from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook

        return (KinesisStreamHook(aws_conn_id=opts["aws_conn_id"], region_name=opts["region"]).conn,
                DynamoDBCheckpointHook(aws_conn_id=opts["aws_conn_id"], region_name=opts["region"]).conn)  # fmt: skip
    import boto3

    session = boto3.session.Session(profile_name=opts["profile"], region_name=opts["region"])
    return (session.client("kinesis", endpoint_url=opts["endpoint_url"]),
            session.client("dynamodb", endpoint_url=opts["endpoint_url"]))  # fmt: skip


def _store(ctx: click.Context, stream: str, consumer: str, table: str) -> tuple[Any, DynamoDBCheckpointStore]:
    kinesis, dynamodb = _clients(ctx)
    return kinesis, DynamoDBCheckpointStore(dynamodb, table, stream, consumer)


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


class _Group(click.Group):
    """Report known errors as one clear line (exit status 1), not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        from airflow_kinesis_spark.exceptions import KinesisSparkError

        try:
            return super().invoke(ctx)
        except (ValueError, KinesisSparkError) as err:
            raise click.ClickException(f"{type(err).__name__}: {err}") from err


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--endpoint-url", default=None, help="Endpoint for Kinesis and DynamoDB (e.g. a local emulator).")
@click.option("--region", default=None, help="AWS region (default: the AWS configuration's).")
@click.option("--profile", default=None, help="AWS profile (default: the default chain).")
@click.option("--aws-conn-id", default=None, help="Use this Airflow connection instead of the default chain.")
@click.option("-v", "--verbose", is_flag=True, help="Log what happens (shard ids, calls, commits).")
@click.pass_context
def main(
    ctx: click.Context, endpoint_url: str | None, region: str | None, profile: str | None, aws_conn_id: str | None, verbose: bool
) -> None:
    """Inspect and reset the checkpoints of airflow-kinesis-spark consumers.

    Example: kinesis-spark --region eu-west-1 checkpoints my-stream -c my-consumer -t my_checkpoints
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ctx.obj = {"endpoint_url": endpoint_url, "region": region, "profile": profile, "aws_conn_id": aws_conn_id}


consumer_options = [
    click.argument("stream"),
    click.option("-c", "--consumer", required=True, help="Consumer (application) name."),
    click.option("-t", "--table", required=True, help="DynamoDB checkpoint table."),
]


def with_consumer(func: Any) -> Any:
    for option in reversed(consumer_options):
        func = option(func)
    return func


@main.command()
@with_consumer
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def checkpoints(ctx: click.Context, stream: str, consumer: str, table: str, as_json: bool) -> None:
    """List a consumer's checkpoints and lag, one row per shard.

    Example: kinesis-spark checkpoints my-stream -c my-consumer -t my_checkpoints
    """
    kinesis, store = _store(ctx, stream, consumer, table)
    head = store.head()
    console = _console()
    with console.status(f"Measuring the lag of {consumer} on {stream}..."):
        lag = measure_lag(kinesis, store)
    if as_json:
        click.echo(json.dumps({"committed_batch_id": head.committed_batch_id, "pending_batch_id": head.pending_batch_id,
                               "lag": lag}, indent=2))  # fmt: skip
        return
    checkpoints_now = store.committed_checkpoints(head)
    grid = Table(title=f"{stream} / {consumer}  (committed batch {head.committed_batch_id}"
                 + (f", pending batch {head.pending_batch_id}" if head.pending_batch_id else "") + ")")  # fmt: skip
    for column in ("shard", "checkpoint", "records waiting", "oldest waiting", "MillisBehindLatest", "state"):
        grid.add_column(column, justify="right" if column in ("oldest waiting", "MillisBehindLatest") else "left")
    for shard_id in sorted(set(checkpoints_now) | set(lag["shards"]) | set(lag["waiting_shards"])):
        row = lag["shards"].get(shard_id)
        checkpoint = str(checkpoints_now[shard_id]) if shard_id in checkpoints_now else (row or {}).get("checkpoint", "-")
        if row:
            state, waiting, behind = "readable", "yes" if row["has_unconsumed"] else "no", row["millis_behind_latest"]
            age = _age(row["age_ms"])
        else:
            state = "waiting for parents" if shard_id in lag["waiting_shards"] else "done (SHARD_END)"
            waiting, age, behind = "-", "-", None
        grid.add_row(shard_id, checkpoint, waiting, age, "-" if behind is None else str(behind), state)
    console.print(grid)


@main.command()
@with_consumer
@click.option("--to", "to", required=True, help="TRIM_HORIZON, LATEST, or an ISO 8601 UTC timestamp.")
@click.option("--dry-run", is_flag=True, help="Show the positions it would set; change nothing.")
@click.option("--discard-pending", is_flag=True, help="Drop a pending (uncommitted) batch first.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def rewind(ctx: click.Context, stream: str, consumer: str, table: str, to: str, dry_run: bool, discard_pending: bool, yes: bool) -> None:
    """Reset a consumer's checkpoints to a time, TRIM_HORIZON or LATEST.

    Example: kinesis-spark rewind my-stream -c my-consumer -t my_checkpoints --to 2026-11-20T00:00:00Z --dry-run
    """
    console = _console()
    kinesis, store = _store(ctx, stream, consumer, table)
    preview = do_rewind(kinesis, store, to, dry_run=True, owner="cli")
    grid = Table(title=f"Rewind {stream} / {consumer} to {to}" + (" (dry run)" if dry_run else ""))
    for column in ("shard", "from", "to"):
        grid.add_column(column)
    for shard_id, change in preview["shards"].items():
        grid.add_row(shard_id, change["from"] or "-", change["to"] or "(removed)")
    console.print(grid)
    if dry_run:
        return
    if not yes:
        click.confirm("Set these checkpoints?", abort=True)
    result = do_rewind(kinesis, store, to, discard_pending=discard_pending, owner=f"cli.{uuid.uuid4().hex[:8]}")
    if result["discarded_batch_id"]:
        console.print(f"Discarded pending batch {result['discarded_batch_id']} ({result['discarded_output'] or 'no output'}).")
    console.print(f"Rewound as batch {result['batch_id']}.")


if __name__ == "__main__":
    main()
