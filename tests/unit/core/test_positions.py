"""Extended sequence numbers, checkpoints and timestamps (core/positions.py)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from airflow_kinesis_spark.core.positions import (
    Checkpoint,
    ExtendedSequenceNumber,
    Sentinel,
    format_timestamp,
    parse_sequence_number,
    parse_timestamp,
    to_utc,
)

# Real 56-digit sequence numbers (from data/kpl_vectors.json): string order and int order differ
# for numbers of different length, and these two differ only deep inside.
SEQ_A = "49581544954143914480256700934210366840104395343224897586"
SEQ_B = "49581544954143914480259384464784359468274789083712061490"
SEQ_C = "49597411459012285111935017620416693517210978893395132418"


def esn(seq: str, sub: int | None = None) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(seq, sub)


class TestExtendedSequenceNumberOrdering:
    def test_compares_as_int_not_as_string(self):
        assert "9" > "10"  # the trap
        assert esn("9") < esn("10")
        assert esn("10") > esn("9")
        assert max(esn("9"), esn("10"), esn("100")) == esn("100")

    def test_different_lengths(self):
        assert esn("99999999999999999999999999999999999999") < esn(SEQ_A)  # 38 digits < 56 digits
        assert sorted([esn(SEQ_C), esn("5"), esn(SEQ_A), esn(SEQ_B), esn("0")]) == [
            esn("0"), esn("5"), esn(SEQ_A), esn(SEQ_B), esn(SEQ_C),
        ]  # fmt: skip

    def test_56_digit_numbers_beyond_float_precision(self):
        plus_one = str(int(SEQ_A) + 1)
        assert float(plus_one) == float(SEQ_A)  # a float comparison could not tell them apart
        assert esn(SEQ_A) < esn(plus_one)
        assert esn(plus_one) > esn(SEQ_A)
        assert esn(SEQ_A) != esn(plus_one)

    def test_129_digits_is_the_largest_accepted(self):
        big = "1" + "0" * 128
        assert parse_sequence_number(big) == 10**128
        assert esn(big) > esn(SEQ_C)
        with pytest.raises(ValueError):
            parse_sequence_number("1" + "0" * 129)

    def test_sub_sequence_ordering_within_one_sequence_number(self):
        assert esn(SEQ_A, 0) < esn(SEQ_A, 1) < esn(SEQ_A, 2) < esn(SEQ_A, 10)
        assert esn(SEQ_A, 10) > esn(SEQ_A, 9)

    def test_plain_record_sorts_before_sub_zero_of_same_sequence(self):
        assert esn(SEQ_A) < esn(SEQ_A, 0)
        assert esn(SEQ_A) != esn(SEQ_A, 0)

    def test_sequence_number_dominates_sub_sequence_number(self):
        assert esn(SEQ_A, 999) < esn(SEQ_B)
        assert esn(SEQ_A, 999) < esn(SEQ_B, 0)
        assert esn("9", 5) < esn("10", 0)

    def test_equality_and_total_ordering_operators(self):
        assert esn(SEQ_A, 3) == esn(SEQ_A, 3)
        assert esn(SEQ_A, 3) <= esn(SEQ_A, 3)
        assert esn(SEQ_A, 3) >= esn(SEQ_A, 3)
        assert not esn(SEQ_A, 3) < esn(SEQ_A, 3)
        assert hash(esn(SEQ_A, 3)) == hash(esn(SEQ_A, 3))

    def test_key_and_str(self):
        assert esn("10").key == (10, -1)
        assert esn("10", 2).key == (10, 2)
        assert str(esn(SEQ_A)) == SEQ_A
        assert str(esn(SEQ_A, 2)) == f"{SEQ_A}/2"

    def test_not_comparable_with_other_types(self):
        with pytest.raises(TypeError):
            esn("1") < "2"  # noqa: B015

    def test_dict_round_trip(self):
        for value in (esn(SEQ_A), esn(SEQ_A, 0), esn(SEQ_B, 7)):
            assert ExtendedSequenceNumber.from_dict(json.loads(json.dumps(value.to_dict()))) == value


class TestInvalidSequenceNumbers:
    @pytest.mark.parametrize(
        "value",
        ["", "-1", "01", "007", "1.5", "1e5", "abc", " 12", "12 ", "+12", "0x1F", "1_000", "٣"],
    )
    def test_rejected_by_parse(self, value):
        with pytest.raises(ValueError, match="not a Kinesis sequence number"):
            parse_sequence_number(value)

    @pytest.mark.parametrize("value", ["", "-1", "01", "abc", "12a"])
    def test_rejected_by_extended_sequence_number(self, value):
        with pytest.raises(ValueError):
            ExtendedSequenceNumber(value)

    @pytest.mark.parametrize("value", [12, 12.0, None, b"12"])
    def test_non_strings_rejected(self, value):
        with pytest.raises(ValueError):
            parse_sequence_number(value)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            ExtendedSequenceNumber(value)  # type: ignore[arg-type]

    def test_negative_sub_sequence_number_rejected(self):
        with pytest.raises(ValueError, match="sub-sequence"):
            ExtendedSequenceNumber(SEQ_A, -1)

    @pytest.mark.parametrize("value", ["12\n", "1\u0663", "1\uff12", "\u0661\u0662"])
    def test_only_ascii_digits_without_trailing_newline(self, value):
        # The API's pattern 0|([1-9]\d{0,128}) means ASCII digits and nothing after them. A
        # trailing newline or a non-ASCII digit would give a string that is not equal to the
        # canonical one while comparing neither below nor above it.
        with pytest.raises(ValueError):
            parse_sequence_number(value)
        with pytest.raises(ValueError):
            ExtendedSequenceNumber(value)

    def test_zero_is_valid(self):
        assert parse_sequence_number("0") == 0
        assert esn("0") < esn("1")


class TestCheckpoint:
    TS = datetime(2024, 3, 1, 12, 30, 15, 123000, tzinfo=timezone.utc)

    @pytest.mark.parametrize(
        "checkpoint, expected",
        [
            (Checkpoint.at(SEQ_A), {"type": "SEQUENCE", "sequence_number": SEQ_A, "sub_sequence_number": None}),
            (Checkpoint.at(SEQ_A, 0), {"type": "SEQUENCE", "sequence_number": SEQ_A, "sub_sequence_number": 0}),
            (Checkpoint.at(SEQ_B, 7), {"type": "SEQUENCE", "sequence_number": SEQ_B, "sub_sequence_number": 7}),
            (Checkpoint(Sentinel.TRIM_HORIZON), {"type": "TRIM_HORIZON"}),
            (
                Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=TS),
                {"type": "AT_TIMESTAMP", "timestamp": "2024-03-01T12:30:15.123Z"},
            ),
            (Checkpoint(Sentinel.SHARD_END), {"type": "SHARD_END"}),
        ],
        ids=["sequence", "sequence-sub-0", "sequence-sub-7", "trim-horizon", "at-timestamp", "shard-end"],
    )
    def test_to_dict_from_dict_round_trip(self, checkpoint, expected):
        data = checkpoint.to_dict()
        assert data == expected
        restored = Checkpoint.from_dict(json.loads(json.dumps(data)))
        assert restored == checkpoint
        assert restored.to_dict() == data

    def test_sequence_number_stored_as_string_keeps_all_digits(self):
        data = Checkpoint.at(SEQ_C, 1).to_dict()
        assert isinstance(data["sequence_number"], str)
        assert Checkpoint.from_dict(data).position == esn(SEQ_C, 1)
        assert int(Checkpoint.from_dict(data).position.sequence_number) == int(SEQ_C)

    def test_at_timestamp_from_other_offset_round_trips_as_utc(self):
        local = datetime(2024, 3, 1, 14, 30, 15, 123000, tzinfo=timezone(timedelta(hours=2)))
        checkpoint = Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=local)
        assert checkpoint.timestamp.utcoffset() == timedelta(0)
        assert checkpoint.timestamp == self.TS
        assert checkpoint.to_dict()["timestamp"] == "2024-03-01T12:30:15.123Z"
        assert Checkpoint.from_dict(checkpoint.to_dict()) == checkpoint

    def test_naive_at_timestamp_is_utc(self):
        checkpoint = Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=datetime(2024, 3, 1, 12, 30, 15, 123000))
        assert checkpoint.timestamp == self.TS
        assert checkpoint.timestamp.tzinfo is not None

    def test_latest_cannot_be_stored(self):
        with pytest.raises(ValueError, match="LATEST"):
            Checkpoint(Sentinel.LATEST)
        with pytest.raises(ValueError, match="LATEST"):
            Checkpoint.from_dict({"type": "LATEST"})

    def test_unknown_type_rejected(self):
        with pytest.raises(ValueError):
            Checkpoint.from_dict({"type": "SOMEWHERE"})

    def test_exactly_one_shape(self):
        with pytest.raises(ValueError):
            Checkpoint()
        with pytest.raises(ValueError):
            Checkpoint(Sentinel.TRIM_HORIZON, position=esn(SEQ_A))

    def test_timestamp_only_with_at_timestamp(self):
        with pytest.raises(ValueError, match="AT_TIMESTAMP"):
            Checkpoint(Sentinel.AT_TIMESTAMP)
        with pytest.raises(ValueError, match="AT_TIMESTAMP"):
            Checkpoint.from_dict({"type": "AT_TIMESTAMP"})
        with pytest.raises(ValueError, match="AT_TIMESTAMP"):
            Checkpoint(Sentinel.TRIM_HORIZON, timestamp=self.TS)
        with pytest.raises(ValueError, match="AT_TIMESTAMP"):
            Checkpoint(position=esn(SEQ_A), timestamp=self.TS)

    def test_invalid_sequence_in_dict_rejected(self):
        with pytest.raises(ValueError):
            Checkpoint.from_dict({"type": "SEQUENCE", "sequence_number": "x1", "sub_sequence_number": None})

    def test_is_shard_end(self):
        assert Checkpoint(Sentinel.SHARD_END).is_shard_end
        assert not Checkpoint(Sentinel.TRIM_HORIZON).is_shard_end
        assert not Checkpoint.at(SEQ_A).is_shard_end

    def test_str(self):
        assert str(Checkpoint.at(SEQ_A, 2)) == f"{SEQ_A}/2"
        assert str(Checkpoint(Sentinel.SHARD_END)) == "SHARD_END"
        assert str(Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=self.TS)) == "AT_TIMESTAMP 2024-03-01T12:30:15.123Z"


class TestTimestamps:
    def test_parse_z(self):
        value = parse_timestamp("2015-05-17T10:05:00Z")
        assert value == datetime(2015, 5, 17, 10, 5, tzinfo=timezone.utc)
        assert value.utcoffset() == timedelta(0)

    def test_parse_offset_converts_to_utc(self):
        value = parse_timestamp("2015-05-17T12:05:00.250+02:00")
        assert value == datetime(2015, 5, 17, 10, 5, 0, 250000, tzinfo=timezone.utc)
        assert value.utcoffset() == timedelta(0)
        assert parse_timestamp("2015-05-17T05:05:00-05:00") == datetime(2015, 5, 17, 10, 5, tzinfo=timezone.utc)

    def test_parse_naive_is_utc(self):
        value = parse_timestamp("2015-05-17T10:05:00")
        assert value == datetime(2015, 5, 17, 10, 5, tzinfo=timezone.utc)
        assert value.tzinfo is not None

    def test_parse_datetime_passthrough(self):
        aware = datetime(2015, 5, 17, 12, 5, tzinfo=timezone(timedelta(hours=2)))
        assert parse_timestamp(aware) == datetime(2015, 5, 17, 10, 5, tzinfo=timezone.utc)
        assert parse_timestamp(aware).utcoffset() == timedelta(0)
        assert parse_timestamp(datetime(2015, 5, 17, 10, 5)) == datetime(2015, 5, 17, 10, 5, tzinfo=timezone.utc)

    def test_parse_strips_whitespace(self):
        assert parse_timestamp("  2015-05-17T10:05:00Z\n") == datetime(2015, 5, 17, 10, 5, tzinfo=timezone.utc)

    @pytest.mark.parametrize("value", ["", "yesterday", "2015-13-01T00:00:00Z", "2015-05-17T25:00:00Z", "Z"])
    def test_parse_invalid(self, value):
        with pytest.raises(ValueError, match="ISO 8601"):
            parse_timestamp(value)

    def test_format_millisecond_precision_with_z(self):
        value = datetime(2015, 5, 17, 10, 5, 0, 123456, tzinfo=timezone.utc)
        assert format_timestamp(value) == "2015-05-17T10:05:00.123Z"
        assert format_timestamp(datetime(2015, 5, 17, 10, 5, tzinfo=timezone.utc)) == "2015-05-17T10:05:00.000Z"

    def test_format_truncates_never_rounds_up(self):
        # A cutoff must never move later when stored: rounding .9999 up would admit records
        # that arrived after planning.
        value = datetime(2015, 5, 17, 10, 5, 59, 999999, tzinfo=timezone.utc)
        assert format_timestamp(value) == "2015-05-17T10:05:59.999Z"
        assert parse_timestamp(format_timestamp(value)) <= value

    def test_format_converts_offsets_and_naive_to_utc(self):
        local = datetime(2015, 5, 17, 12, 5, 0, 1000, tzinfo=timezone(timedelta(hours=2)))
        assert format_timestamp(local) == "2015-05-17T10:05:00.001Z"
        assert format_timestamp(datetime(2015, 5, 17, 10, 5, 0, 1000)) == "2015-05-17T10:05:00.001Z"

    def test_round_trip_at_millisecond_precision(self):
        value = datetime(2024, 2, 29, 23, 59, 59, 7000, tzinfo=timezone.utc)
        assert parse_timestamp(format_timestamp(value)) == value

    def test_to_utc(self):
        assert to_utc(datetime(2020, 1, 1)).tzinfo is timezone.utc
        shifted = to_utc(datetime(2020, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))))
        assert shifted == datetime(2020, 1, 1, tzinfo=timezone.utc)
        assert shifted.utcoffset() == timedelta(0)


def test_to_utc_turns_pendulum_datetimes_into_plain_aware_datetimes():
    """Airflow's data_interval_end is a pendulum DateTime; arithmetic on it must stay aware."""
    from datetime import datetime, timedelta, timezone

    import pendulum

    from airflow_kinesis_spark.core.positions import parse_timestamp, to_utc

    value = to_utc(pendulum.datetime(2026, 5, 1, 12, 0, tz="Europe/Paris"))
    assert type(value) is datetime and value.tzinfo is timezone.utc and value.hour == 10
    earlier = parse_timestamp(pendulum.datetime(2026, 5, 1, 12, 0, tz="UTC")) - timedelta(hours=1)
    assert earlier.tzinfo is not None
    assert earlier < datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
