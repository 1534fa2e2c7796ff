"""``python -m benchmarks.emulators`` (the evidence behind the local stack's emulator for
thousands of shards, docs/scale.md) runs on both emulators: every figure present, every shard
listed and probed."""

from __future__ import annotations

import pytest

from benchmarks.emulators import EMULATORS, run_emulators

pytestmark = pytest.mark.integration


def test_both_emulators_are_measured_on_the_same_calls():
    lines: list[str] = []
    result = run_emulators(8, 1, log=lines.append)
    assert sorted(result["emulators"]) == sorted(EMULATORS) == ["kinesalite", "moto"]
    for figures in result["emulators"].values():
        assert set(figures) == {"create_s", "list_shards_s", "list_shards_cpu_s", "probe_round_s", "probe_round_cpu_s",
                                "probe_cpu_ms_per_shard"}  # fmt: skip
        assert figures["probe_round_s"] > 0 and figures["probe_cpu_ms_per_shard"] >= 0
    assert len(lines) == 2
