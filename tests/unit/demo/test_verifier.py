"""The verifier every reliability test ends with: missing, duplicates, unexpected, per shard."""

from __future__ import annotations

from demo.producer import Produced, digest, verify


def produced(shard: str, seq: str, sub: int | None = None, data: bytes = b"x") -> Produced:
    return Produced(shard, seq, sub, "pk", digest(data))


def test_verifier_counts_per_shard():
    log = [produced("s0", "1"), produced("s0", "2"), produced("s1", "1", 0), produced("s1", "1", 1)]
    rows = [("s0", "1", None, "pk", b"x"), ("s0", "1", None, "pk", b"x"),  # s0/1 twice, s0/2 missing
            ("s1", "1", 0, "pk", b"x"), ("s1", "1", 1, "pk", b"x"), ("s1", "9", None, "pk", b"x")]  # fmt: skip
    v = verify(log, rows)
    assert (v.records_in, v.records_out, v.duplicates, v.missing, v.unexpected) == (4, 4, 1, 1, 1)
    assert not v.ok
    assert v.per_shard == {
        "s0": {"records_in": 2, "records_out": 1, "duplicates": 1, "missing": 1, "unexpected": 0},
        "s1": {"records_in": 2, "records_out": 3, "duplicates": 0, "missing": 0, "unexpected": 1},
    }


def test_verifier_catches_changed_data_and_keys():
    v = verify([produced("s0", "1", data=b"a")], [("s0", "1", None, "pk", b"b")])
    assert v.data_mismatches == 1 and not v.ok
    assert verify([produced("s0", "1", data=b"a")], [("s0", "1", None, "pk", b"a")]).ok
