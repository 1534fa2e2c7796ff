"""``make bench`` section "typed": records decoded by schema in the Spark job (``RecordSettings``).

The backlogs are orders of a web shop, one user record each, with inline schemas (no registry,
so no header before the payload):

* ``json``: one JSON object per record (UTF-8), a JSON Schema (draft 2020-12) with a
  ``date-time`` string, a nested object and an array of objects;
* ``avro``: Avro binary encoding of one datum (``fastavro.schemaless_writer``, no container
  file), the Avro schema's JSON: ``timestamp-millis``, an enum, a nested record, an array of records.

An order has 8 top-level fields: ``order_id``, ``customer_id``, ``placed_at``, ``status``,
``currency``, ``total``, ``shipping_address`` (5 strings) and ``items`` (``sku``, ``name``,
``qty``, ``unit_price`` each). The item count is drawn so that each format's records are of
about 300 to 500 bytes encoded (JSON spells every field name, Avro none): 1 to 3 items in JSON,
2 to 6 in Avro. 1,024 orders are drawn once (seeded); user record ``i`` is order ``i % 1024``
with its own ``order_id`` and ``placed_at``, so every record is distinct.

Two measurements per format (``benchmarks/run.py``, ``section_typed``):

* **throttled**: behind the limits proxy, exactly as the ``throttled`` section reads raw records
  (spark-submit, default settings: paced to the per-shard limits); the read rate is the bytes the
  proxy served over the job's read phase. Decoding runs in the read (``mapInArrow``), so a
  decoder slower than the stream would show as a read rate below the limit. Target: >= 0.85 of
  the per-shard limit (2 MiB/s per shard).
* **unthrottled**: on one backlog, two consumers with their own checkpoints, one raw
  (``RecordSettings(format="raw")``) and one typed, each warm over Spark Connect as the ``unthrottled``
  section runs ours (a previous small batch of the consumer, not measured), end to end (the
  ``execute`` wall time); the typed consumer's records/s over the raw one's on the same records.
  Repeated on fresh streams, which consumer runs first alternating; the median of the ratios.
  Target: >= 0.7.
"""

from __future__ import annotations

import io
import json
import random
import statistics
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from benchmarks.report import row

__all__ = ["FORMATS", "AVRO_SCHEMA", "JSON_SCHEMA", "Orders", "record_settings", "typed_headline", "typed_targets",
           "typed_markdown", "add_to_report"]  # fmt: skip

MIB = 1024 * 1024
FORMATS = ("json", "avro")
#: Targets: the throttled read rate's fraction of the per-shard limit, the typed/raw end-to-end rate.
THROTTLED_MIN = 0.85
VS_RAW_MIN = 0.7
#: Items per order, by format (about 300 to 500 bytes a record, encoded).
ITEMS = {"json": (1, 3), "avro": (2, 6)}
#: Distinct orders drawn; record ``i`` is order ``i % POOL`` with its own id and time.
POOL = 1024

_ADDRESS_FIELDS = ("name", "street", "city", "postcode", "country")

JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Order",
    "type": "object",
    "properties": {
        "order_id": {"type": "integer"},
        "customer_id": {"type": "string"},
        "placed_at": {"type": "string", "format": "date-time"},
        "status": {"type": "string"},
        "currency": {"type": "string"},
        "total": {"type": "number"},
        "shipping_address": {"type": "object", "properties": {name: {"type": "string"} for name in _ADDRESS_FIELDS}},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "name": {"type": "string"}, "qty": {"type": "integer"},
                               "unit_price": {"type": "number"}},  # fmt: skip
            },
        },
    },
    "required": ["order_id", "customer_id", "placed_at", "items"],
}

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "bench.shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer_id", "type": "string"},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["PLACED", "PAID", "SHIPPED", "CANCELLED"]}},
        {"name": "currency", "type": "string"},
        {"name": "total", "type": "double"},
        {"name": "shipping_address",
         "type": {"type": "record", "name": "Address", "fields": [{"name": n, "type": "string"} for n in _ADDRESS_FIELDS]}},
        {"name": "items", "type": {"type": "array", "items": {
            "type": "record", "name": "Item",
            "fields": [{"name": "sku", "type": "string"}, {"name": "name", "type": "string"}, {"name": "qty", "type": "int"},
                       {"name": "unit_price", "type": "double"}]}}},
    ],
}  # fmt: skip

_CITIES = (("Paris", "FR", "750"), ("Lyon", "FR", "690"), ("Berlin", "DE", "101"), ("Hamburg", "DE", "201"),
           ("Madrid", "ES", "280"), ("Lisbon", "PT", "110"), ("Milan", "IT", "201"), ("Amsterdam", "NL", "101"),
           ("Vienna", "AT", "101"), ("Dublin", "IE", "D02"))  # fmt: skip
_STREETS = ("Main Street", "Station Road", "Church Lane", "Rue de la Paix", "Hauptstrasse", "Calle Mayor", "Via Roma",
            "Kerkstraat", "Ringstrasse", "Grafton Street")  # fmt: skip
_PRODUCTS = (("Stainless steel water bottle, 750 ml", 19.9), ("Organic cotton T-shirt, navy, size M", 24.5),
             ("Wireless earbuds with charging case", 79.0), ("Ceramic pour-over coffee dripper", 32.0),
             ("Running socks, 3-pack, size 39-42", 14.95), ("Paperback: A Field Guide to Birds", 18.0),
             ("LED desk lamp with USB-C port", 45.99), ("Yoga mat, 6 mm, recycled rubber", 39.0))  # fmt: skip
_FIRST = ("Anna", "Lukas", "Marie", "Jonas", "Sofia", "Mateo", "Emma", "Noah", "Lea", "Hugo")
_LAST = ("Schmidt", "Dubois", "Garcia", "Rossi", "Silva", "de Vries", "Novak", "Murphy", "Keller", "Martin")
_EPOCH = datetime(2026, 3, 1, tzinfo=timezone.utc)


def record_settings(fmt: str) -> dict[str, Any]:
    """The operator's arguments for ``fmt`` (inline schema): ``{"record_settings": RecordSettings(...)}``."""
    from airflow_kinesis_spark.operators.settings import RecordSettings

    return {"record_settings": RecordSettings(format=fmt, schema=json.dumps(JSON_SCHEMA if fmt == "json" else AVRO_SCHEMA))}


class Orders:
    """User record payloads of format ``fmt``: ``orders(i)`` is record ``start + i``'s bytes
    (``benchmarks.workload.load_backlog``'s ``payload``)."""

    def __init__(self, fmt: str, start: int = 0, seed: int = 17) -> None:
        import fastavro

        self.fmt, self.start = fmt, start
        rng = random.Random(seed)
        lo, hi = ITEMS[fmt]
        self.pool = [self._order(rng, lo, hi) for _ in range(POOL)]
        self._avro = fastavro.parse_schema(AVRO_SCHEMA)
        self._write = fastavro.schemaless_writer

    @staticmethod
    def _order(rng: random.Random, lo: int, hi: int) -> dict[str, Any]:
        city, country, postcode = rng.choice(_CITIES)
        items = []
        for _ in range(rng.randint(lo, hi)):
            name, price = rng.choice(_PRODUCTS)
            items.append({"sku": f"SKU-{rng.randrange(100_000):05d}", "name": name, "qty": rng.randint(1, 3), "unit_price": price})
        return {
            "customer_id": f"C-{rng.randrange(10**7):07d}",
            "status": rng.choice(("PLACED", "PAID", "SHIPPED")),
            "currency": "EUR",
            "total": round(sum(item["qty"] * item["unit_price"] for item in items), 2),
            "shipping_address": {"name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
                                 "street": f"{rng.randint(1, 200)} {rng.choice(_STREETS)}", "city": city,
                                 "postcode": f"{postcode}{rng.randrange(100):02d}", "country": country},  # fmt: skip
            "items": items,
        }

    def value(self, i: int) -> dict[str, Any]:
        """Record ``start + i`` as a Python value (``placed_at`` an aware datetime)."""
        n = self.start + i
        order = self.pool[n % POOL]
        return {"order_id": 10_000_000 + n, "customer_id": order["customer_id"],
                "placed_at": _EPOCH + timedelta(milliseconds=37 * n), **{k: order[k] for k in
                ("status", "currency", "total", "shipping_address", "items")}}  # fmt: skip

    def __call__(self, i: int) -> bytes:
        value = self.value(i)
        if self.fmt == "json":
            value["placed_at"] = value["placed_at"].isoformat(timespec="milliseconds").replace("+00:00", "Z")
            return json.dumps(value, separators=(",", ":")).encode()
        out = io.BytesIO()
        self._write(out, self._avro, value)
        return out.getvalue()


# -- report ------------------------------------------------------------------------------------


def typed_headline(typed: dict[str, Any]) -> dict[str, Any]:
    """``typed`` of the headline: per format its throttled fraction and typed/raw ratio."""
    h: dict[str, Any] = {}
    for fmt in FORMATS:
        h[f"{fmt}_throttled_fraction"] = round(typed["throttled"][fmt]["fraction_of_limit"], 3)
    for fmt in FORMATS:
        h[f"{fmt}_vs_raw"] = round(typed["unthrottled"][fmt]["ratio_median"], 2)
    return h


def typed_targets(typed: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The section's targets: ``(target, measured, met)``."""
    h = typed_headline(typed)
    out = []
    for fmt in FORMATS:
        x = h[f"{fmt}_throttled_fraction"]
        out.append((f"typed records, {fmt}: throttled read rate >= {THROTTLED_MIN} x the limit", f"{x:.3f}", x >= THROTTLED_MIN))
    for fmt in FORMATS:
        x = h[f"{fmt}_vs_raw"]
        out.append((f"typed records, {fmt}: unthrottled end to end >= {VS_RAW_MIN} x raw on the same backlog", f"{x:.2f}x",
                    x >= VS_RAW_MIN))  # fmt: skip
    return out


def typed_markdown(typed: dict[str, Any], heading: str, raw_throttled_fraction: float | None = None) -> list[str]:
    """The report's section (``heading``: its title line), from ``results["typed"]``.

    :param raw_throttled_fraction: the ``throttled`` section's figure of the same run, if it ran.
    """
    h = typed_headline(typed)
    t, u = typed["throttled"], typed["unthrottled"]
    sizes = typed["record_bytes"]
    lines = [
        heading,
        "",
        "Records decoded by schema in the Spark job (`RecordSettings`: `format`, inline `schema`), two backlogs of web-shop "
        "orders (`benchmarks/typed.py`): 8 top-level fields (`order_id`, `customer_id`, `placed_at`, `status`, `currency`, "
        "`total`, a nested `shipping_address` of 5 strings, an `items` array of objects with 4 fields each). "
        f"**JSON**: one object per record, a JSON Schema (draft 2020-12, `date-time`, `required`), {ITEMS['json'][0]} to "
        f"{ITEMS['json'][1]} items, {sizes['json']['mean']:.0f} bytes a record on average ({sizes['json']['min']} to "
        f"{sizes['json']['max']}), decoded with pyarrow's JSON reader. **Avro**: Avro binary of one datum, no registry header "
        f"(`fastavro.schemaless_writer`), the Avro schema's JSON (`timestamp-millis`, an enum, nested records), "
        f"{ITEMS['avro'][0]} to {ITEMS['avro'][1]} items (Avro spells no field names), {sizes['avro']['mean']:.0f} bytes a "
        f"record on average ({sizes['avro']['min']} to {sizes['avro']['max']}), decoded with fastavro's `schemaless_reader`. "
        "Both KPL-aggregated as the access-log lines are; the output is Parquet with the decoded columns (`data` dropped). "
        "Every run is checked: all records read, no dead letters.",
        "",
        "**Throttled**: each backlog behind the limits proxy, read exactly as section 1 reads raw records (spark-submit, "
        "default settings: paced to the per-shard limits). Decoding runs inside the read (`mapInArrow`, each GetRecords "
        "page as it arrives), so a decoder slower than the stream shows as a read rate below the limit. Target: "
        f">= {THROTTLED_MIN} of the limit.",
        "",
        row("format", "backlog (MiB)", "user records", "read rate (MiB/s)", "fraction of the limit", "GetRecords calls",
             "throttled calls", "expired iterators", "wall time (s)"),  # fmt: skip
        row(*["---"] * 9),
        *[
            row(fmt, f"{t[fmt]['backlog_mib']:.1f}", f"{t[fmt]['user_records']:,}", f"{t[fmt]['read_bytes_per_second'] / MIB:.2f}",
                 f"**{t[fmt]['fraction_of_limit']:.3f}**", t[fmt]["get_records"], t[fmt]["throttled"], t[fmt]["expired"],
                 f"{t[fmt]['wall_s']:.1f} (end to end)")  # fmt: skip
            for fmt in FORMATS
        ],
        "",
    ]
    if raw_throttled_fraction is not None:
        lines += [f"Raw records in the same run (section 1): {raw_throttled_fraction:.3f} of the limit.", ""]
    lines += [
        "**Unthrottled**: typed against raw on the same records. Each repeat: a fresh stream of "
        f"{u[FORMATS[0]]['backlog_mib']:.0f} MiB, two consumers with their own checkpoints, one raw (`RecordSettings(format='raw')`) "
        "and one typed, each warm over Spark Connect as section 2 runs ours (the consumer's session ran its previous batch, "
        "a small one, not measured), no byte pacing; each figure end to end (the `execute` wall time: plan, read and "
        "decode, Parquet write, commit); which consumer runs first alternates. The ratio is the typed consumer's "
        f"records/s over the raw one's; the figure is the median of the ratios. Target: >= {VS_RAW_MIN}.",
        "",
        row("format", "run", "raw records/s", "typed records/s", "raw wall time (s)", "typed wall time (s)", "typed vs raw"),
        row(*["---"] * 7),
        *[
            row(fmt, i + 1, f"{r['raw']['records_per_second']:,.0f}", f"{r['typed']['records_per_second']:,.0f}",
                 f"{r['raw']['wall_s']:.1f}", f"{r['typed']['wall_s']:.1f}", f"{r['ratio']:.2f}x")  # fmt: skip
            for fmt in FORMATS
            for i, r in enumerate(u[fmt]["runs"])
        ],
        "",
        "Medians of the ratios: " + ", ".join(f"{fmt} **{h[fmt + '_vs_raw']}x**" for fmt in FORMATS) + ". Headline: `"
        + json.dumps({"typed": h}) + "`.",
        "",
    ]
    if all("cpu_s" in r["raw"] for fmt in FORMATS for r in u[fmt]["runs"]):
        lines += _cpu_table(u)
    if typed.get("decode_cost"):
        c = typed["decode_cost"]
        limit = t[FORMATS[0]]["limit_bytes_per_second"]
        cores = {fmt: limit / sizes[fmt]["mean"] * c[fmt]["us_per_record"] / 1e6 for fmt in FORMATS}
        lines += [
            "Decoding alone, in the benchmark's process (`RecordDecoder.decode` on one page of "
            f"{c['records']:,} records, best of {c['repeat']}): "
            + "; ".join(f"{fmt} {c[fmt]['us_per_record']:.1f} µs a record ({c[fmt]['mib_per_second']:.1f} MiB/s on one core)"
                        for fmt in FORMATS)
            + f". At the limit ({limit / MIB:.0f} MiB/s) that is "
            + ", ".join(f"{limit / sizes[fmt]['mean']:,.0f} {fmt} records/s, {cores[fmt]:.2f} of a core" for fmt in FORMATS)
            + " for decoding alone (a Spark task decodes in its Python worker, one core at most; the job runs as many "
            "tasks as the machine has cores).",
            "",
        ]  # fmt: skip
    return lines


def _cpu_table(u: dict[str, Any]) -> list[str]:
    """The unthrottled runs' CPU seconds by process, medians per format and consumer."""
    parts = ("spark_jvm", "spark_python", "operator")

    def med(fmt: str, kind: str, part: str | None = None) -> float:
        runs = u[fmt]["runs"]
        return statistics.median(sum(r[kind]["cpu_s"].values()) if part is None else r[kind]["cpu_s"][part] for r in runs)

    return [
        "Where the time goes, unthrottled: CPU seconds of each run (medians over the repeats) by process: the Spark "
        "Connect server's JVM (Arrow to rows, Parquet write), the Python processes under it (pyspark's workers: "
        "the read, de-aggregation and decoding) and the benchmark's process (the operator: plan, probes, commit). "
        "The Kinesis emulator and the proxy serve the same bytes to both consumers (not counted). Wall time is "
        "less than CPU time where the cores work at once, more where the processes wait or other work takes the cores.",
        "",
        row("format", "consumer", "Spark JVM (s)", "Spark Python workers (s)", "operator (s)", "total CPU (s)",
             "CPU µs a record"),  # fmt: skip
        row(*["---"] * 7),
        *[
            row(fmt, kind, *(f"{med(fmt, kind, part):.1f}" for part in parts), f"{med(fmt, kind):.1f}",
                 f"{med(fmt, kind) / u[fmt]['user_records'] * 1e6:.1f}")  # fmt: skip
            for fmt in FORMATS
            for kind in ("raw", "typed")
        ],
        "",
    ]


def decode_cost(records: int = 10_000, repeat: int = 5) -> dict[str, Any]:
    """``RecordDecoder.decode`` alone on one page of ``records`` orders per format, in this
    process (no Spark): the best of ``repeat`` timings, per record and in MiB/s on one core."""
    import time

    from airflow_kinesis_spark.core.records import RecordDecoder

    out: dict[str, Any] = {"records": records, "repeat": repeat}
    for fmt in FORMATS:
        orders = Orders(fmt)
        page = [orders(i) for i in range(records)]
        decoder = RecordDecoder(record_settings(fmt)["record_settings"].to_dict())
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter()
            result = decoder.decode(page)
            best = min(best, time.perf_counter() - started)
        if result.dead_letters:
            raise SystemExit(f"typed, {fmt}: {result.dead_letters} of the decode-cost page's records did not decode")
        out[fmt] = {"us_per_record": best / records * 1e6, "mib_per_second": sum(map(len, page)) / MIB / best,
                    "records_per_second": records / best}  # fmt: skip
    return out


def record_sizes(n: int = 10_000) -> dict[str, dict[str, float]]:
    """Encoded bytes of the first ``n`` records of each format: mean, min, max."""
    out = {}
    for fmt in FORMATS:
        orders = Orders(fmt)
        sizes = [len(orders(i)) for i in range(n)]
        out[fmt] = {"mean": statistics.mean(sizes), "min": min(sizes), "max": max(sizes)}
    return out


def add_to_report(path: Path, results: dict[str, Any]) -> None:
    """Put the typed section and its targets into a report ``benchmarks/report.py`` wrote."""
    from benchmarks.report import add_section

    raw = None
    if results.get("throttled"):
        t = results["throttled"]
        raw = t["ours"]["read_bytes_per_second"] / t["limit_bytes_per_second"]
    add_section(path, "Typed records", lambda heading: typed_markdown(results["typed"], heading, raw),
                typed_targets(results["typed"]))
