"""Parse Apache access log lines (combined log format) carried in Kinesis records.

Combined log format (Apache HTTP Server docs, mod_log_config)::

    %h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i"

Only DataFrame expressions (no Python UDF), so it runs in the JVM on every executor.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COMBINED_LOG_PATTERN", "parse_combined_log"]

#: Groups: 1 client_ip, 2 time, 3 method, 4 path, 5 protocol, 6 status, 7 bytes, 8 referrer,
#: 9 user_agent. The closing quote of the user agent is optional: real logs hold truncated lines.
COMBINED_LOG_PATTERN = (
    r'^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+) ?(\S*)" (\d{3}) (\S+) "([^"]*)" "([^"]*)"?\s*$'
)


def parse_combined_log(df: Any) -> Any:
    """Add the columns of a combined-log line held in ``data`` (UTF-8).

    Adds ``client_ip`` string, ``timestamp`` timestamp (UTC), ``method``, ``path``, ``protocol``
    strings, ``status`` int, ``bytes`` long (null for ``-``), ``referrer``, ``user_agent`` strings
    (null for ``-``) and ``log_parsed`` boolean. A line that does not parse keeps its record, with
    null columns and ``log_parsed`` false: nothing is dropped.

    :param df: a DataFrame with the provider's output schema.
    :returns: the same rows with the added columns.
    """
    from pyspark.sql import functions as F

    line = F.decode(F.col("data"), "UTF-8")
    matched = line.rlike(COMBINED_LOG_PATTERN)

    def group(index: int) -> Any:
        value = F.regexp_extract(line, COMBINED_LOG_PATTERN, index)
        return F.when(matched & (value != "-") & (value != ""), value)

    return df.select(
        "*",
        group(1).alias("client_ip"),
        F.to_timestamp(group(2), "dd/MMM/yyyy:HH:mm:ss Z").alias("timestamp"),
        group(3).alias("method"),
        group(4).alias("path"),
        group(5).alias("protocol"),
        group(6).cast("int").alias("status"),
        group(7).cast("long").alias("bytes"),
        group(8).alias("referrer"),
        group(9).alias("user_agent"),
        matched.alias("log_parsed"),
    )
