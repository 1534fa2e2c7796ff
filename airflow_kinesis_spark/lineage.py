"""What a batch reads and writes, named for Airflow Assets and for OpenLineage.

* **Asset.** The operator's output root is an Airflow Asset: a local path becomes a ``file://``
  URI, ``s3://``, ``s3a://`` and ``s3n://`` become ``s3://`` (the URI the amazon provider's S3
  assets use), any other URI is kept. Batches are partitions of that one asset
  (``{output_path}/batch_id=N``); each asset event says which batch it was.
* **OpenLineage.** The input is the stream: namespace ``kinesis://{region}``, name the stream
  name (the OpenLineage naming spec has no Kinesis entry and the amazon provider defines none).
  The output is the output root, named per the spec: namespace ``file`` and the absolute path
  for local files, ``s3://{bucket}`` and the key for S3, ``{scheme}://{authority}`` and the path
  otherwise.

The OpenLineage client is imported only when lineage is built, so the provider works without the
``openlineage`` extra.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Asset

__all__ = ["output_uri", "asset_for_output", "asset_event_extra", "output_dataset_name", "stream_dataset_name", "operator_lineage"]

#: Object stores whose OpenLineage dataset name is the key, without a leading slash.
_OBJECT_STORE_SCHEMES = frozenset({"s3", "gs", "wasbs", "abfss"})


def output_uri(output_path: str) -> str | None:
    """The Asset URI of an output root, or ``None`` when it cannot be known before the run.

    ``/data/out`` and ``file:///data/out`` give ``file:///data/out``; ``s3a://lake/x/`` gives
    ``s3://lake/x``; other URIs are kept (without a trailing slash). ``None`` for a templated
    path (``{{ ... }}``, rendered only at run time) and for a relative path (it would depend on
    the worker's working directory).
    """
    if not isinstance(output_path, str) or not output_path.strip() or "{{" in output_path or "{%" in output_path:
        return None
    parts = urlsplit(output_path)
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        path = parts.path if scheme else output_path
        if not path.startswith("/"):
            return None
        return f"file://{parts.netloc if scheme else ''}{posixpath.normpath(path)}"
    if scheme in ("s3", "s3a", "s3n"):
        scheme = "s3"
    path = parts.path.rstrip("/")
    return f"{scheme}://{parts.netloc}{path}"


def asset_for_output(output_path: str) -> Asset:
    """The Airflow Asset of an output root (name and URI: :func:`output_uri`).

    Downstream DAGs schedule on it: ``schedule=[asset_for_output("s3a://lake/access_log")]``.

    :raises ValueError: the path is templated or relative.
    """
    from airflow.sdk import Asset

    uri = output_uri(output_path)
    if uri is None:
        raise ValueError(f"output_path {output_path!r} has no asset: use an absolute local path or a URI, not a template")
    return Asset(name=uri, uri=uri)


def asset_event_extra(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The asset event's ``extra`` for a run's summary (the operator's return value).

    Shape: ``batch_id`` (``None`` for window runs and runs without a batch), ``status``,
    ``stream_name``, ``consumer_name``, ``records``, ``bytes``, ``output_path`` (the batch's or
    window's directory; ``None`` when nothing was written), ``shards`` (shard id -> user records),
    ``quarantined`` and ``cutoff``; window runs add ``window_start`` and ``window_end``. A run
    that committed to a table adds ``output_format`` and ``table`` (``format``, ``table``: the
    identifier, ``snapshot_id`` (Iceberg) or ``version`` (Delta), ``files``, ``already_committed``).
    """
    extra: dict[str, Any] = {
        "batch_id": summary.get("batch_id"),
        "status": summary.get("status"),
        "stream_name": summary.get("stream_name"),
        "consumer_name": summary.get("consumer_name"),
        "records": summary.get("records", 0),
        "bytes": summary.get("bytes", 0),
        "output_path": summary.get("output_path"),
        "shards": {shard_id: shard.get("records", 0) for shard_id, shard in (summary.get("shards") or {}).items()},
        "quarantined": summary.get("quarantined", 0),
        "dead_letters": summary.get("dead_letters", 0),
        "cutoff": summary.get("cutoff"),
    }
    if summary.get("mode") == "window":
        extra.update(window_start=summary.get("window_start"), window_end=summary.get("window_end"))
    if summary.get("output_format", "parquet") != "parquet":
        extra.update(output_format=summary["output_format"], table=summary.get("table"))
    return extra


def output_dataset_name(uri: str) -> tuple[str, str]:
    """OpenLineage ``(namespace, name)`` of an output root's URI (see :func:`output_uri`)."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return (f"file://{parts.netloc}" if parts.netloc else "file"), parts.path
    name = parts.path.lstrip("/") if parts.scheme in _OBJECT_STORE_SCHEMES else parts.path
    return f"{parts.scheme}://{parts.netloc}", name or "/"


def stream_dataset_name(stream_name: str, region: str | None) -> tuple[str, str]:
    """OpenLineage ``(namespace, name)`` of a Kinesis stream: ``kinesis://{region}`` and the stream
    name (for a stream ARN: its own region and name)."""
    from airflow_kinesis_spark.core.names import parse_stream_arn

    arn = parse_stream_arn(stream_name)
    if arn:
        region, stream_name = arn.region, arn.name
    return f"kinesis://{region}" if region else "kinesis", stream_name


def operator_lineage(
    *, stream_name: str, region: str | None, output_path: str, summary: Mapping[str, Any] | None,
    table: str | None = None, output_format: str = "parquet",
) -> OperatorLineage:
    """The OpenLineage datasets of one run: the stream in, the output root out.

    A table output (``output_format`` ``iceberg`` or ``delta``) is the output dataset by its
    location, with a ``symlinks`` facet naming the table (type ``TABLE``; Iceberg: its
    ``namespace.table`` identifier), as OpenLineage's Spark integration names catalog tables.

    With a summary (the run succeeded), the input carries ``inputStatistics`` (``rowCount``:
    user records read, ``size``: their bytes) and the output ``outputStatistics``
    (``rowCount``: records written; 0 for a run without new records).
    """
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.generated.output_statistics_output_dataset import OutputStatisticsOutputDatasetFacet

    input_facets: dict[str, Any] = {}
    output_facets: dict[str, Any] = {}
    if summary is not None:
        records, size = int(summary.get("records") or 0), int(summary.get("bytes") or 0)
        output_facets["outputStatistics"] = OutputStatisticsOutputDatasetFacet(rowCount=records)
        try:
            from openlineage.client.generated.input_statistics_input_dataset import InputStatisticsInputDatasetFacet
        except ImportError:  # older openlineage-python without the input statistics facet
            pass
        else:
            input_facets["inputStatistics"] = InputStatisticsInputDatasetFacet(rowCount=records, size=size)
    namespace, name = stream_dataset_name(stream_name, region)
    inputs = [InputDataset(namespace=namespace, name=name, inputFacets=input_facets)]
    uri = output_uri(output_path)
    outputs = []
    if uri is not None:
        namespace, name = output_dataset_name(uri)
        facets: dict[str, Any] = {}
        if table and output_format != "parquet":
            from openlineage.client.generated.symlinks_dataset import Identifier, SymlinksDatasetFacet

            facets["symlinks"] = SymlinksDatasetFacet(identifiers=[Identifier(namespace=namespace, name=table, type="TABLE")])
        outputs.append(OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets=output_facets))
    return OperatorLineage(inputs=inputs, outputs=outputs)


def emit_asset_events(outlets: Any, output_path: str, context: Mapping[str, Any], summary: Mapping[str, Any], log: Any) -> None:
    """Put a batch summary on the output asset's event (an :class:`Asset` outlet of
    :func:`output_uri`), and add the output asset's event to each :class:`AssetAlias` outlet when
    the batch wrote records (``asset_event_extra`` is the event's ``extra``)."""
    from airflow.sdk import Asset, AssetAlias

    events = context.get("outlet_events")
    uri = output_uri(output_path)
    if events is None or uri is None:
        return
    extra = asset_event_extra(summary)
    for outlet in outlets:
        if isinstance(outlet, Asset) and outlet.uri == uri:
            events[outlet].extra = extra
            log.info("Asset event for %s: batch %s, %d records", uri, extra["batch_id"], extra["records"])
        elif isinstance(outlet, AssetAlias) and extra["records"]:
            events[outlet].add(asset_for_output(output_path), extra=extra)
            log.info("Asset event for %s through alias %s: batch %s, %d records", uri, outlet.name,
                     extra["batch_id"], extra["records"])  # fmt: skip
