"""Shared pieces of the reliability suite: connections to moto and a Spark Connect server."""

from __future__ import annotations

import json

import pytest

from tests.conftest import aws_connection


@pytest.fixture
def connections(monkeypatch, moto_endpoint, spark_connect_endpoint):
    host, port = spark_connect_endpoint
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_connection(moto_endpoint))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_TEST", json.dumps({"conn_type": "spark_connect", "host": host, "port": port}))
    return monkeypatch
