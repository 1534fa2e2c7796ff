"""``kinesis-spark leftovers``: list (or remove) the output files no committed snapshot, version
or record holds (``sinks.leftovers``). See docs/maintenance.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click
from rich.table import Table

from airflow_kinesis_spark.cli import terminal

__all__ = ["leftovers"]


LEFTOVERS_EPILOG = """\b
Examples:
  # what would be removed, and how many bytes (a dry run: the default)
  kinesis-spark leftovers --output-path s3a://example-lake/access_log
  # an Iceberg table: its catalog as pyiceberg's properties
  kinesis-spark leftovers --output-path s3a://example-lake/clicks \\
      --catalog-property type=glue --catalog-property client.region=eu-west-1
  # remove them without asking; the result as JSON
  kinesis-spark leftovers --output-path /data/lake/clicks --delete --yes --json
"""


def _leftovers_count(count: int) -> str:
    return f"{count} leftover" + ("" if count == 1 else "s")


def _key_values(values: Sequence[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict.

    :raises click.BadParameter: an item without ``=`` (exit status 2).
    """
    result = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint=option)
        result[key.strip()] = value
    return result


def _storage_options(ctx: click.Context, output_path: str, given: dict[str, str]) -> dict[str, str] | None:
    """For an ``s3://`` (``s3a``, ``s3n``) root: credentials and region of the command's AWS access
    (``--aws-conn-id``'s connection, its ``verify`` extra's CA bundle included, or boto3's chain
    with ``--profile``/``--region``, its ``ca_bundle``/``AWS_CA_BUNDLE`` included) in delta-rs's
    key names, under ``given``
    (``--storage-option``, e.g. ``AWS_CA_BUNDLE=ca.pem``); other roots: ``given``."""
    from urllib.parse import urlparse

    if urlparse(output_path).scheme not in ("s3", "s3a", "s3n"):
        return given or None
    from airflow_kinesis_spark.sinks.files import aws_storage_options

    opts = ctx.obj
    if opts["aws_conn_id"]:
        from airflow.sdk.log import configure_logging

        from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook

        configure_logging(log_level="INFO" if opts["verbose"] else "WARNING", output=sys.stderr)
        hook = KinesisStreamHook(aws_conn_id=opts["aws_conn_id"], region_name=opts["region"])
        derived = aws_storage_options(hook.get_credentials(), opts["region"] or hook.conn_region_name,
                                      opts["endpoint_url"] or getattr(hook.conn_config, "endpoint_url", None), hook.verify)  # fmt: skip
    else:
        import boto3
        import botocore.session

        chain = botocore.session.Session(profile=opts["profile"])
        session = boto3.session.Session(botocore_session=chain, region_name=opts["region"])
        found = session.get_credentials()
        derived = aws_storage_options(found.get_frozen_credentials() if found else None, session.region_name, opts["endpoint_url"],
                                      chain.get_config_variable("ca_bundle"))  # fmt: skip
    return {**derived, **given}


def _leftovers_sink(
    output_path: str, output_format: str | None, table: str | None, catalog: dict[str, str], options: dict[str, str] | None,
    stream: str | None, consumer: str | None, shared: bool, ctx: click.Context,
) -> tuple[Any, str | None, str | None]:  # fmt: skip
    """The sink of an output root, from its owner record and the options; with its (stream, consumer).

    :raises ValueError: the options contradict the owner record, or leave something unknown.
    """
    from airflow_kinesis_spark.core.names import stream_name_of
    from airflow_kinesis_spark.sinks.build import build_sink
    from airflow_kinesis_spark.sinks.ownership import OWNER_FILE, owner_location, read_owner

    owner = read_owner(output_path, options)
    if owner is not None:
        where = f"its owner record {owner_location(output_path)}"
        if output_format and output_format != owner.format:
            raise ValueError(f"{output_path} holds {owner.format} output ({where}); --output-format {output_format} does not match")
        if table and owner.table and table != owner.table:
            raise ValueError(f"{output_path} holds the files of Iceberg table {owner.table} ({where}); --table {table} does not match")
        if shared and not owner.shared:
            raise ValueError(f"{output_path} is not a shared output ({where}): leave out --shared-output")
        if not owner.shared:
            if (stream and stream_name_of(stream) != owner.stream) or (consumer and consumer != owner.consumer):
                raise ValueError(f"{output_path} belongs to stream {owner.stream!r}, consumer {owner.consumer!r} ({where}); "
                                 "--stream and --consumer do not match")  # fmt: skip
            stream, consumer = owner.stream, owner.consumer
        output_format, table, shared = owner.format, table or owner.table or None, owner.shared
    if not output_format:
        raise ValueError(f"{output_path} has no owner record ({OWNER_FILE}): give --output-format (and for a table the "
                         "--stream and --consumer that write it)")  # fmt: skip
    if shared and not (stream and consumer):
        raise ValueError(f"{output_path} is a shared output: give --stream and --consumer (their batches are under "
                         "stream=<stream>/consumer=<consumer>)")  # fmt: skip
    if output_format == "iceberg":
        if not catalog:
            raise ValueError("an Iceberg output needs its catalog: --catalog-property KEY=VALUE, pyiceberg's catalog properties "
                             "(e.g. --catalog-property type=glue, or type=sql and uri=...)")  # fmt: skip
        if catalog.get("type") == "glue":
            opts = ctx.obj
            defaults = {"client.region": opts["region"], "client.profile-name": opts["profile"]}
            catalog = {**{k: v for k, v in defaults.items() if v}, **catalog}
    sink = build_sink(output_format, output_path, table=table, catalog_properties=catalog or None, storage_options=options,
                      shared_output=shared, stream_name=stream, consumer_name=consumer)  # fmt: skip
    return sink, stream, consumer


@click.command(epilog=LEFTOVERS_EPILOG, short_help="List (or remove) output files no committed snapshot, version or record holds.")
@click.option("--output-path", required=True, metavar="PATH", help="The output root: the output_path of the consumer's task.")
@click.option("--output-format", type=click.Choice(["parquet", "iceberg", "delta"]), default=None,
              help="The output format (default: the root's owner record's).")  # fmt: skip
@click.option("--table", default=None, metavar="NAMESPACE.TABLE", help="Iceberg: the table (default: the owner record's).")
@click.option("--catalog-property", multiple=True, metavar="KEY=VALUE",
              help="Iceberg: a pyiceberg catalog property, e.g. type=glue (repeat the option for each).")  # fmt: skip
@click.option("--storage-option", multiple=True, metavar="KEY=VALUE",
              help="An s3 storage option in delta-rs's names, e.g. AWS_ENDPOINT_URL=URL (repeat the option for each).")  # fmt: skip
@click.option("--stream", default=None, metavar="NAME", help="The stream (default: the owner record's; needed for a shared output).")
@click.option("--consumer", default=None, metavar="NAME", help="The consumer (default: the owner record's; needed for a shared output).")
@click.option("--shared-output", is_flag=True, help="The root is shared (the task's shared_output=True; the owner record says so too).")
@click.option("--min-age-hours", type=click.FloatRange(min=0), default=24.0, show_default=True, metavar="HOURS",
              help="A window run or a window's staging folder counts only when nothing was written in it for this long.")  # fmt: skip
@click.option("--delete", is_flag=True, help="Remove the leftovers (asks first, unless --yes). Without it: a dry run.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required with --delete when stdin is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (the prompt goes to stderr).")
@click.pass_context
def leftovers(
    ctx: click.Context, output_path: str, output_format: str | None, table: str | None, catalog_property: Sequence[str],
    storage_option: Sequence[str], stream: str | None, consumer: str | None, shared_output: bool, min_age_hours: float,
    delete: bool, yes: bool, as_json: bool,
) -> None:  # fmt: skip
    """List the files and folders under an output root that no committed Iceberg snapshot, Delta
    version or committed Parquet record references and that nothing can still use, with their
    bytes; with --delete, remove them.

    Leftovers are attempts of batches up to the latest committed batch that the output does not
    reference (superseded or retried plans), staging folders of killed drivers, and window runs
    the table does not reference once --min-age-hours old. The pending batch, every file of any
    snapshot or version, the owner record, _committed, _delta_log and metadata are never touched.
    The format, table, stream and consumer come from the root's owner record. See docs/maintenance.md.
    """
    from rich.filesize import decimal

    from airflow_kinesis_spark.sinks.leftovers import remove_leftovers, scan_leftovers

    options = _storage_options(ctx, output_path, _key_values(storage_option, "--storage-option"))
    sink, stream, consumer = _leftovers_sink(output_path, output_format, table, _key_values(catalog_property, "--catalog-property"),
                                             options, stream, consumer, shared_output, ctx)  # fmt: skip
    min_age = min_age_hours * 3600
    with terminal.progress() as progress:
        progress.add_task(f"Reading the committed references of {sink.table or output_path}", total=None)
        scan = scan_leftovers(sink, stream, consumer, min_age=min_age)
    result = {**scan.to_dict(), "output_path": output_path, "table": sink.table, "dry_run": not delete, "removed": [], "removed_bytes": 0}
    console = terminal.console()
    if not as_json:
        committed = f"committed up to batch {scan.latest_batch_id}" if scan.latest_batch_id is not None else "no committed batch found"
        console.print(terminal.printable(f"Leftovers under {scan.root} ({scan.format}, {committed}; {scan.references} committed files)"
                                 + ("" if delete else " (dry run)")), soft_wrap=True, markup=False, highlight=False)  # fmt: skip
        if scan.leftovers:
            grid = Table(show_edge=False)
            terminal.add_columns(grid, "path", "size", "reason", right=(1,))
            for item in scan.leftovers:
                relative = item.path[len(scan.root) + 1 :] + ("/" if item.folder else "")
                grid.add_row(terminal.printable(relative), decimal(item.size), terminal.printable(item.reason))
            console.print(grid)
        for note in scan.kept:
            console.print(terminal.printable(f"kept: {note}"), soft_wrap=True, markup=False, highlight=False)
        summary = f"{_leftovers_count(len(scan.leftovers))}, {decimal(scan.total_size)}"
        if not delete:
            console.print(f"{summary}: nothing removed (dry run); --delete removes them.", soft_wrap=True, highlight=False)
    if not delete or not scan.leftovers:
        if as_json:
            click.echo(json.dumps(result, indent=2))
        elif delete:
            console.print("Nothing to remove.", highlight=False)
        return
    terminal.confirm(f"Remove {_leftovers_count(len(scan.leftovers))} ({decimal(scan.total_size)}) under {scan.root}?", yes=yes, err=as_json,
             action="leftovers --delete", look_first="without --delete")  # fmt: skip
    with terminal.progress() as progress:
        progress.add_task(f"Removing {_leftovers_count(len(scan.leftovers))}", total=None)
        removed = remove_leftovers(sink, scan.leftovers, stream, consumer, min_age=min_age)
    result.update(removed=[item.to_dict() for item in removed], removed_bytes=sum(item.size for item in removed))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    skipped = len(scan.leftovers) - len(removed)
    console.print(f"Removed {_leftovers_count(len(removed))}, {decimal(result['removed_bytes'])}."
                  + (f" {skipped} were no longer leftovers (a commit since the scan) or gone: kept." if skipped else ""),
                  soft_wrap=True, highlight=False)  # fmt: skip
