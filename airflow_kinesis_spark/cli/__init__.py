"""``kinesis-spark``: look at and reset a consumer's checkpoints from a shell.

Examples::

    kinesis-spark checkpoints apache-access-log -c parquet-lake -t kinesis_spark_checkpoints
    kinesis-spark rewind apache-access-log -c parquet-lake -t kinesis_spark_checkpoints \\
        --to 2026-11-20T00:00:00Z --dry-run
    kinesis-spark discard-pending apache-access-log -c parquet-lake -t kinesis_spark_checkpoints \\
        --output-path s3a://example-lake/access_log --dry-run

AWS access comes from the default chain (environment, profile, instance role), or from an
Airflow connection with ``--aws-conn-id``. ``--endpoint-url`` points both Kinesis and DynamoDB at
a local emulator. Tables and JSON go to stdout; progress goes to stderr, and only when stderr is
an interactive terminal. Commands that change something ask first, and need ``--yes`` when stdin is
not a terminal. See docs/cli.md.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click
from rich.progress import Progress
from rich.table import Table

from airflow_kinesis_spark.core.admin import CLI_FLAGS, check_endpoint
from airflow_kinesis_spark.core.admin import discard_pending as do_discard_pending
from airflow_kinesis_spark.core.admin import rewind as do_rewind
from airflow_kinesis_spark.core.consumers import deregister_stream_consumer
from airflow_kinesis_spark.core.lag import measure_lag
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import Checkpoint
from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.core.shards import Shard
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.cli import terminal
from airflow_kinesis_spark.cli.leftovers import leftovers

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient


def _clients(ctx: click.Context) -> tuple[Any, Any]:
    """Kinesis and DynamoDB clients whose endpoints answered (see ``core.admin.check_endpoint``).

    :raises EndpointUnreachableError: an endpoint does not answer, within seconds.
    """
    opts = ctx.obj
    if opts["aws_conn_id"]:
        from airflow_kinesis_spark.hooks.dynamodb import DynamoDBCheckpointHook
        from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook

        # Importing Airflow configured its logging (structlog) to stdout: stdout is for the table or the JSON.
        from airflow.sdk.log import configure_logging

        configure_logging(log_level="INFO" if opts["verbose"] else "WARNING", output=sys.stderr)
        # The hooks check their endpoints on first use of ``conn``.
        return (KinesisStreamHook(aws_conn_id=opts["aws_conn_id"], region_name=opts["region"]).conn,
                DynamoDBCheckpointHook(aws_conn_id=opts["aws_conn_id"], region_name=opts["region"]).conn)  # fmt: skip
    import boto3

    from airflow_kinesis_spark.core.read_options import own_throttling

    session = boto3.session.Session(profile_name=opts["profile"], region_name=opts["region"])
    # as the hooks' clients: the probes retry their own throttling (own_throttling)
    clients = (own_throttling(session.client("kinesis", endpoint_url=opts["endpoint_url"])),
               session.client("dynamodb", endpoint_url=opts["endpoint_url"]))  # fmt: skip
    source = "--endpoint-url" if opts["endpoint_url"] else "the AWS configuration" + (f" of profile {opts['profile']!r}" if opts["profile"] else "")
    for client in clients:
        check_endpoint(client, source, hint="Check --endpoint-url, --region and the network path (DNS, proxy, VPC endpoint).")
    return clients


def _store(ctx: click.Context, stream: str, consumer: str, table: str) -> tuple[Any, DynamoDBCheckpointStore]:
    kinesis, dynamodb = _clients(ctx)
    return kinesis, DynamoDBCheckpointStore(dynamodb, table, stream, consumer)


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _measure_lag(
    kinesis: KinesisClient, store: DynamoDBCheckpointStore, checkpoints: dict[str, Checkpoint], progress: Progress
) -> dict[str, Any]:
    """``core.lag.measure_lag`` from the checkpoints already read, showing what it is doing:
    listing the shards, then probing the readable ones (a pulsing bar: the probes run in
    parallel, at most as many as the Kinesis client pools connections)."""
    task = progress.add_task(f"Listing the shards of {store.stream_name}", total=None)

    def probing(plan: BatchPlan, shards: Sequence[Shard]) -> None:
        progress.update(task, description=f"Probing {len(plan.ranges)} of {len(shards)} shards")

    return measure_lag(kinesis, store, checkpoints=checkpoints, on_plan=probing)


class _Group(click.Group):
    """Report known errors as one clear line (exit status 1), not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        from airflow_kinesis_spark.exceptions import KinesisSparkError

        try:
            return super().invoke(ctx)
        except (ValueError, KinesisSparkError, BotoCoreError, ClientError, OSError) as err:
            raise click.ClickException(terminal.printable(f"{type(err).__name__}: {_cli_message(err, ctx.obj)}")) from err


def _cli_message(err: Exception, opts: dict[str, Any] | None) -> str:
    """``err``'s message in the command line's terms where the core phrases it for a DAG author's
    connection: a stream not found names --region, --profile and --endpoint-url (unless the
    clients came from --aws-conn-id's connection, which the message names already)."""
    from airflow_kinesis_spark.exceptions import StreamNotFoundError

    if isinstance(err, StreamNotFoundError) and not (opts or {}).get("aws_conn_id"):
        fields = err.fields
        account = fields.get("account")
        return (
            f"Kinesis stream {fields.get('stream_name')!r} does not exist in region {fields.get('region')!r} at endpoint "
            f"{fields.get('endpoint')!r}. Check the stream name, --region, --profile and --endpoint-url."
            + (f" For a stream of account {account} (another account's), its resource-based policy must allow your "
               "principal: Kinesis answers a stream it may not see as not found." if account else "")
        )  # fmt: skip
    return str(err)


MAIN_EPILOG = """\b
Examples:
  kinesis-spark --region eu-west-1 \\
      checkpoints my-stream -c my-app -t my_checkpoints
  kinesis-spark --aws-conn-id aws_default \\
      rewind my-stream -c my-app -t my_checkpoints --to TRIM_HORIZON --dry-run
  kinesis-spark --endpoint-url http://127.0.0.1:5000 --region us-east-1 \\
      checkpoints my-stream -c my-app -t my_checkpoints --json

\b
Exit status:
  0  success
  1  an error, reported on one line (Error: <type>: <message>),
     or a declined confirmation
  2  a usage error (unknown option, missing argument),
     or no --yes for a command that asks when stdin is not a terminal
"""


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=MAIN_EPILOG)
@click.option("--endpoint-url", default=None, metavar="URL", help="Endpoint for Kinesis and DynamoDB (e.g. a local emulator).")
@click.option("--region", default=None, help="AWS region (default: the AWS configuration's).")
@click.option("--profile", default=None, help="AWS profile (default: the default chain).")
@click.option("--aws-conn-id", default=None, metavar="CONN_ID", help="Use this Airflow aws connection instead of the default chain.")
@click.option("-v", "--verbose", is_flag=True, help="Log what happens (shard ids, calls, commits).")
@click.pass_context
def main(
    ctx: click.Context, endpoint_url: str | None, region: str | None, profile: str | None, aws_conn_id: str | None, verbose: bool
) -> None:
    """Inspect and reset the checkpoints of airflow-kinesis-spark consumers.

    AWS access comes from boto3's default chain (environment, profile, instance role), or from an
    Airflow aws connection with --aws-conn-id. Tables and JSON go to stdout; progress goes to
    stderr when it is an interactive terminal. An endpoint that does not answer fails within
    seconds. Run 'kinesis-spark COMMAND --help' for a command's options and examples.
    """
    # Log records go to stderr (basicConfig's default stream): INFO with --verbose, else warnings only.
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ctx.obj = {"endpoint_url": endpoint_url, "region": region, "profile": profile, "aws_conn_id": aws_conn_id, "verbose": verbose}


consumer_options = [
    click.argument("stream"),
    click.option("-c", "--consumer", required=True, metavar="NAME", help="Consumer (application) name."),
    click.option("-t", "--table", required=True, metavar="NAME", help="DynamoDB checkpoint table."),
]


def with_consumer(func: Any) -> Any:
    for option in reversed(consumer_options):
        func = option(func)
    return func


CHECKPOINTS_EPILOG = """\b
Examples:
  # one row per shard: checkpoint, records waiting, oldest waiting, state
  kinesis-spark checkpoints my-stream -c my-app -t my_checkpoints
  # the same as JSON (the lag sensor's summary), e.g. for jq
  kinesis-spark checkpoints my-stream -c my-app -t my_checkpoints --json \\
      | jq .lag.max_age_ms
"""


@main.command(epilog=CHECKPOINTS_EPILOG)
@with_consumer
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def checkpoints(ctx: click.Context, stream: str, consumer: str, table: str, as_json: bool) -> None:
    """List a consumer's checkpoints and lag, one row per shard.

    The lag of each readable shard is measured from its committed checkpoint with one probe
    (GetShardIterator, GetRecords with Limit 1), as the lag sensor does. Reads only.
    """
    with terminal.progress() as progress:
        task = progress.add_task(f"Reading the checkpoints of {consumer}", total=None)
        kinesis, store = _store(ctx, stream, consumer, table)
        head = store.head()
        checkpoints_now = store.committed_checkpoints(head)
        progress.remove_task(task)
        lag = _measure_lag(kinesis, store, checkpoints_now, progress)
    if as_json:
        click.echo(json.dumps({"committed_batch_id": head.committed_batch_id, "pending_batch_id": head.pending_batch_id,
                               "lag": lag}, indent=2))  # fmt: skip
        return
    grid = Table(show_edge=False, title=f"{stream} / {consumer}  (committed batch {head.committed_batch_id}"
                 + (f", pending batch {head.pending_batch_id}" if head.pending_batch_id else "") + ")")  # fmt: skip
    terminal.add_columns(grid, "shard", "checkpoint", "records waiting", "oldest waiting", "behind latest", "state", right=(3, 4))
    shard_ids = sorted(set(checkpoints_now) | set(lag["shards"]) | set(lag["waiting_shards"]))
    for shard_id in shard_ids:
        row = lag["shards"].get(shard_id)
        checkpoint = str(checkpoints_now[shard_id]) if shard_id in checkpoints_now else (row or {}).get("checkpoint", "-")
        if row:
            state, waiting, behind = "readable", "yes" if row["has_unconsumed"] else "no", row["millis_behind_latest"]
            age = _age(row["age_ms"])
        else:
            state = "waiting for parents" if shard_id in lag["waiting_shards"] else "done (SHARD_END)"
            waiting, age, behind = "-", "-", None
        grid.add_row(shard_id, checkpoint, waiting, age, _age(behind), state)
    waiting_count = len(lag["shards_with_unconsumed"])
    grid.caption = (
        f"{len(shard_ids)} shards, {len(lag['shards'])} readable, {waiting_count} with records waiting"
        + (f", oldest waiting {_age(lag['max_age_ms'])}" if waiting_count else "")
    )
    terminal.console().print(grid)


def _pending_line(result: dict[str, Any]) -> str:
    """``Pending batch N (held by H, last heartbeat 3.1 s ago): would delete /data/out/batch_id=N.``"""
    age = result["heartbeat_age_seconds"]
    beat = f", last heartbeat {_age(int(age * 1000))} ago" if age is not None else ""
    batch = f"Pending batch {result['discarded_batch_id']} (held by {result['holder']}{beat})"
    return terminal.printable(f"{batch}: {result['discarded_output']}.")


def _discard_question(result: dict[str, Any], then: str) -> str:
    """The confirmation of a discard: names the batch and the exact directory deleted, or why none is."""
    batch = f"Discard pending batch {result['discarded_batch_id']}"
    if result["deleted_path"]:
        return f"{batch}, delete {result['deleted_path']}{then}?"
    return f"{batch} ({result['discarded_output']}){then}?"


output_path_option = click.option(
    "--output-path", default=None, metavar="PATH",
    help="The consumer's output root (the operator's output_path): the discarded batch's directory under it, "
         "batch_id=N, is deleted if local. Without it nothing is deleted.",
)  # fmt: skip
lease_option = click.option(
    "--lease-seconds", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_LEASE_SECONDS, show_default=True,
    metavar="SECONDS",
    help="The consumer's lease (the operator's lease_seconds): a pending batch whose holder sent a heartbeat within "
         "it belongs to a live run and is not discarded.",
)  # fmt: skip


REWIND_EPILOG = """\b
Examples:
  # look first: the positions it would set; nothing is written
  kinesis-spark rewind my-stream -c my-app -t my_checkpoints \\
      --to 2026-11-20T00:00:00Z --dry-run
  # re-read everything the stream still holds, without asking
  kinesis-spark rewind my-stream -c my-app -t my_checkpoints \\
      --to TRIM_HORIZON --yes
  # skip the backlog, dropping a pending batch and its directory
  # under the output root first; the result as JSON
  kinesis-spark rewind my-stream -c my-app -t my_checkpoints \\
      --to LATEST --discard-pending --output-path /data/lake/my-app --yes --json
"""


@main.command(epilog=REWIND_EPILOG, short_help="Reset checkpoints to a time, TRIM_HORIZON or LATEST.")
@with_consumer
@click.option("--to", "to", required=True, metavar="TARGET", help="TRIM_HORIZON, LATEST, or an ISO 8601 UTC timestamp.")
@click.option("--dry-run", is_flag=True, help="Show the positions it would set and what it would discard; change nothing.")
@click.option("--discard-pending", is_flag=True, help="Drop a pending (uncommitted) batch first (never one a live run holds).")
@output_path_option
@lease_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required when stdin is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table (the prompt goes to stderr).")
@click.pass_context
def rewind(
    ctx: click.Context, stream: str, consumer: str, table: str, to: str, dry_run: bool, discard_pending: bool,
    output_path: str | None, lease_seconds: float, yes: bool, as_json: bool,
) -> None:  # fmt: skip
    """Reset a consumer's checkpoints to a time, TRIM_HORIZON or LATEST.

    Shows the new positions first, and with --discard-pending the pending batch it drops and the
    directory it deletes, then asks before writing them (unless --yes). The rewind is committed
    like a batch: fenced, one conditional write for every shard.
    """
    console = terminal.console()
    with terminal.progress() as progress:
        progress.add_task(f"Listing the shards of {stream} and reading the checkpoints of {consumer}", total=None)
        kinesis, store = _store(ctx, stream, consumer, table)
        preview = do_rewind(kinesis, store, to, dry_run=True, discard_pending=discard_pending, output_path=output_path,
                            owner="cli", lease_seconds=lease_seconds, names=CLI_FLAGS)  # fmt: skip
    if not as_json:
        # The heading is printed on its own: as the title of a narrow table it would wrap.
        console.print(f"Rewind {stream} / {consumer} to {to}" + (" (dry run)" if dry_run else ""), style="italic", highlight=False)
        grid = Table(show_edge=False)
        terminal.add_columns(grid, "shard", "from", "to")
        for shard_id, change in preview["shards"].items():
            grid.add_row(shard_id, change["from"] or "-", change["to"] or "(removed)")
        console.print(grid)
        if preview["discarded_batch_id"] is not None:
            console.print(_pending_line(preview), soft_wrap=True, markup=False, highlight=False)
    if dry_run:
        if as_json:
            click.echo(json.dumps(preview, indent=2))
        return
    shards = "these checkpoints" if not as_json else f"the checkpoints of {len(preview['shards'])} shards"
    question = _discard_question(preview, f" and set {shards}") if preview["discarded_batch_id"] is not None else f"Set {shards}?"
    terminal.confirm(question, yes=yes, err=as_json, action="rewind")
    with terminal.progress() as progress:
        progress.add_task(f"Rewinding {consumer} on {stream}", total=None)
        result = do_rewind(kinesis, store, to, discard_pending=discard_pending, output_path=output_path,
                           owner=f"cli.{uuid.uuid4().hex[:8]}", lease_seconds=lease_seconds,
                           expected_batch_id=preview["discarded_batch_id"], names=CLI_FLAGS)  # fmt: skip
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    if result["discarded_batch_id"] is not None:
        console.print(terminal.printable(f"Discarded pending batch {result['discarded_batch_id']} ({result['discarded_output']})."),
                      soft_wrap=True, markup=False, highlight=False)  # fmt: skip
    console.print(f"Rewound as batch {result['batch_id']}.", soft_wrap=True)


DISCARD_EPILOG = """\b
Examples:
  # look first: the pending batch, its holder, and what would be deleted
  kinesis-spark discard-pending my-stream -c my-app -t my_checkpoints \\
      --output-path /data/lake/my-app --dry-run
  # drop it and delete its directory under the output root, without asking
  kinesis-spark discard-pending my-stream -c my-app -t my_checkpoints \\
      --output-path /data/lake/my-app --yes --json
"""


@main.command("discard-pending", epilog=DISCARD_EPILOG, short_help="Drop the pending batch; checkpoints stay.")
@with_consumer
@click.option("--dry-run", is_flag=True, help="Show the pending batch and what would be deleted; change nothing.")
@output_path_option
@lease_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required when stdin is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (the prompt goes to stderr).")
@click.pass_context
def discard_pending(
    ctx: click.Context, stream: str, consumer: str, table: str, dry_run: bool, output_path: str | None,
    lease_seconds: float, yes: bool, as_json: bool,
) -> None:  # fmt: skip
    """Drop a consumer's pending (planned, uncommitted) batch; the checkpoints stay as committed.

    For a pending batch that no longer fits its task (its output path or stream changed, or its
    plan was not written by the task): the next run plans that batch anew from the committed
    checkpoints. Refused while a live run holds the batch. With --output-path, the batch's own
    directory under it (batch_id=N) is deleted if local, and never a path read from the table.
    Asks first (unless --yes).
    """
    console = terminal.console()
    with terminal.progress() as progress:
        progress.add_task(f"Reading the pending batch of {consumer}", total=None)
        _, store = _store(ctx, stream, consumer, table)
        preview = do_discard_pending(store, output_path=output_path, dry_run=True, owner="cli", lease_seconds=lease_seconds,
                                     names=CLI_FLAGS)  # fmt: skip
    if preview["discarded_batch_id"] is None:
        if as_json:
            click.echo(json.dumps(preview, indent=2))
        else:
            console.print(f"No pending batch of {stream} / {consumer} (committed batch {preview['committed_batch_id']}): "
                          "nothing to discard.", soft_wrap=True, highlight=False)  # fmt: skip
        return
    if not as_json:
        console.print(_pending_line(preview), soft_wrap=True, markup=False, highlight=False)
    if dry_run:
        if as_json:
            click.echo(json.dumps(preview, indent=2))
        return
    terminal.confirm(_discard_question(preview, ""), yes=yes, err=as_json, action="discard-pending")
    with terminal.progress() as progress:
        progress.add_task(f"Discarding pending batch {preview['discarded_batch_id']} of {consumer}", total=None)
        result = do_discard_pending(store, output_path=output_path, owner=f"cli.{uuid.uuid4().hex[:8]}",
                                    lease_seconds=lease_seconds, expected_batch_id=preview["discarded_batch_id"],
                                    names=CLI_FLAGS)  # fmt: skip
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    console.print(terminal.printable(f"Discarded pending batch {result['discarded_batch_id']} ({result['discarded_output']}). "
                             f"The committed checkpoints (batch {result['committed_batch_id']}) are unchanged."),
                  soft_wrap=True, markup=False, highlight=False)  # fmt: skip


DEREGISTER_EPILOG = """\b
Examples:
  kinesis-spark deregister-consumer my-stream -c my-app --yes
"""


@main.command("deregister-consumer", epilog=DEREGISTER_EPILOG,
              short_help="Deregister the consumer's enhanced fan-out stream consumer (stops its billing).")  # fmt: skip
@click.argument("stream")
@click.option("-c", "--consumer", required=True, metavar="NAME", help="Consumer (application) name.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required when stdin is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (the prompt goes to stderr).")
@click.pass_context
def deregister_consumer(ctx: click.Context, stream: str, consumer: str, yes: bool, as_json: bool) -> None:
    """Deregister the stream consumer that consumer_type="efo" registered for CONSUMER.

    A registered stream consumer is billed per shard-hour while it exists. Its checkpoints are
    untouched: the next enhanced fan-out run registers it again, and polling runs never need it.
    Asks first (unless --yes).
    """
    terminal.confirm(f"Deregister stream consumer {consumer} of stream {stream}?", yes=yes, err=as_json, action="deregister-consumer")
    kinesis, _ = _clients(ctx)
    existed = deregister_stream_consumer(kinesis, stream, consumer)
    result = {"stream": stream, "consumer_name": consumer, "deregistered": existed}
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        terminal.console().print(f"Stream consumer {consumer} of {stream}: "
                         + ("deregistered (billing stops once it is gone)." if existed else "was not registered; nothing to do."),
                         soft_wrap=True, markup=False, highlight=False)  # fmt: skip


PACKAGE_EPILOG = """\b
Examples:
  # the job, its code and its logging configuration, then to S3 for an EMR / Glue / Databricks job task
  kinesis-spark package build/kinesis-spark-job --json > build/kinesis-spark-job.json
  aws s3 cp build/kinesis-spark-job s3://my-bucket/kinesis-spark/0.1.0/ --recursive
"""


@main.command(epilog=PACKAGE_EPILOG, short_help="Write the Spark job, its package zip and log4j 2 file, for a cluster's job task.")
@click.argument("directory", type=click.Path(file_okay=False, writable=True))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def package(directory: str, as_json: bool) -> None:
    """Write kinesis_batch.py (the Spark job), airflow_kinesis_spark_core.zip (its Airflow-free
    code, for --py-files) and kinesis-batch-log4j2.properties (the job's log4j 2 configuration:
    Spark at WARN, for -Dlog4j2.configurationFile) into DIRECTORY, to upload where the job task's
    Spark reads them (S3 for EMR, Glue and Databricks). The cluster's Python also needs the job's
    own dependencies: boto3, aws-kinesis-agg, protobuf and pyarrow (docs/platforms.md)."""
    import shutil

    from airflow_kinesis_spark.hooks.spark_logs import LOG4J_CONFIG, log4j_config_path
    from airflow_kinesis_spark.hooks.spark_package import SPARK_SCRIPT, core_zip, spark_script_path

    os.makedirs(directory, exist_ok=True)
    script = shutil.copy(spark_script_path(), os.path.join(directory, SPARK_SCRIPT))
    archive = core_zip(directory)
    log_config = shutil.copy(log4j_config_path(), os.path.join(directory, LOG4J_CONFIG))
    result = {"script": os.path.abspath(script), "py_files": os.path.abspath(archive), "log4j_config": os.path.abspath(log_config)}
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"Spark job: {result['script']}\n--py-files: {result['py_files']}\nlog4j 2 configuration: {result['log4j_config']}")


main.add_command(leftovers)
