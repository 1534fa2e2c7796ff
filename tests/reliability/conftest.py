"""Shared pieces of the reliability suite."""

from __future__ import annotations

import pytest


@pytest.fixture
def connections(monkeypatch, aws_conn, spark_connect_conn):
    """aws_default to moto and spark_connect_test to the Spark Connect server; returns monkeypatch."""
    return monkeypatch
