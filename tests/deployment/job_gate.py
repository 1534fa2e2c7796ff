"""A transform that holds the deferred batch's Spark job until the deployment test lets it go.

``hold_until_released`` returns its DataFrame unchanged. The job calls it in its driver after
the read and before the write, while the driver holds the batch's lease. When the environment
names a gate file (:data:`GATE_ENV`), it first writes ``{gate}.reached`` and then waits until
the file ``{gate}`` exists (at most :data:`GATE_TIMEOUT` seconds, so a test that failed half
way does not leave the driver waiting for ever). The test can so look at the deployment while
the job certainly runs, instead of racing a job of a few seconds.

No Airflow import: it runs in the Spark driver, which gets none of the worker's ``AIRFLOW_*``
variables (the gate's variable is not one of them).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["GATE_ENV", "GATE_TIMEOUT", "hold_until_released", "reached_marker"]

#: Environment variable naming the gate file.
GATE_ENV = "KINESIS_DEFERRED_JOB_GATE"
#: Seconds the job waits for the gate at most.
GATE_TIMEOUT = 600.0

log = logging.getLogger(__name__)


def reached_marker(gate: str | Path) -> Path:
    """The file the job writes when it reaches the gate: ``{gate}.reached``."""
    return Path(f"{gate}.reached")


def hold_until_released(data: Any) -> Any:
    """Wait at the gate (see the module doc), then return ``data`` unchanged."""
    gate = os.environ.get(GATE_ENV)
    if not gate:
        return data
    reached_marker(gate).write_text(str(os.getpid()))
    log.info("job gate: waiting for %s", gate)
    deadline = time.monotonic() + GATE_TIMEOUT
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    log.info("job gate: %s", "released" if Path(gate).exists() else f"not released within {GATE_TIMEOUT:g} s; going on")
    return data
