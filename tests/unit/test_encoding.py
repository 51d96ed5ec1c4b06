"""The fast Example encoder must produce what protobuf and tf.io.parse_example read identically."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from trainyard_prep.encoding import Columns, MixedExampleEncoder, NumericExampleEncoder, varint_encode


class ProtoExampleEncoder:
    """The reference: one `tf.train.Example` per row through protobuf's own API and serializer."""

    def __init__(self, columns: Columns):
        self.columns = list(columns)

    def encode(self, frame: pd.DataFrame) -> list[bytes]:
        out = []
        values = {name: frame[name].tolist() for name, _ in self.columns}
        for row in range(len(frame)):
            feature = {}
            for name, dtype in self.columns:
                value = values[name][row]
                if dtype == "float":
                    feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
                elif dtype == "int":
                    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
                else:
                    text = "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)
                    feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))
            out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        return out


def decode_varint(data: bytes) -> int:
    value = 0
    for shift, byte in enumerate(data):
        value |= (byte & 0x7F) << (7 * shift)
        if not byte & 0x80:
            break
    return value - (1 << 64) if value >= 1 << 63 else value


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**53 - 1, 2**53 + 1, 2**62, 2**63 - 1, -1, -(2**63)])
def test_varint_matches_protobuf(value: int) -> None:
    groups, lengths = varint_encode(np.array([value], dtype=np.int64))
    encoded = bytes(groups[0, : lengths[0]])
    assert decode_varint(encoded) == value
    reference = tf.train.Int64List(value=[value]).SerializeToString()  # 0A len <varint>
    assert encoded == reference[2:]


def test_numeric_encoder_matches_protobuf_serializer() -> None:
    rng = np.random.default_rng(0)
    n = 300
    features = [("x", "float"), ("count_of_things", "int"), ("a_long_feature_name_" + "z" * 60, "float")]
    frame = pd.DataFrame({
        "x": rng.normal(size=n).astype(np.float32),
        "count_of_things": rng.integers(-(2**40), 2**40, size=n),
        features[2][0]: rng.uniform(-1e6, 1e6, size=n),
    })
    frame.loc[3, "count_of_things"] = 0
    frame.loc[4, "x"] = np.nan
    labels = rng.integers(0, 200, size=n)
    frame["label"] = labels
    columns = [*features, ("label", "int")]
    fast = NumericExampleEncoder(columns).encode(frame)
    slow = ProtoExampleEncoder(columns).encode(frame)
    assert len(fast) == len(slow) == n
    for a, b in zip(fast, slow, strict=True):
        assert tf.train.Example.FromString(a) == tf.train.Example.FromString(b)
    spec = {"x": tf.io.FixedLenFeature([], tf.float32), "count_of_things": tf.io.FixedLenFeature([], tf.int64),
            features[2][0]: tf.io.FixedLenFeature([], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}
    parsed = tf.io.parse_example(tf.constant(fast), spec)
    np.testing.assert_array_equal(parsed["count_of_things"].numpy(), frame["count_of_things"].to_numpy())
    np.testing.assert_array_equal(parsed["label"].numpy(), labels)
    np.testing.assert_allclose(parsed[features[2][0]].numpy(), frame[features[2][0]].to_numpy(np.float32))


def test_single_layout_fast_path_matches_protobuf() -> None:
    rng = np.random.default_rng(2)
    columns = [(f"pixel_{i}", "float") for i in range(5)] + [("digit", "int")]
    frame = pd.DataFrame({name: rng.uniform(0, 16, size=50) for name, _ in columns[:-1]})
    frame["digit"] = rng.integers(0, 10, size=50)  # every varint one byte: one layout for all rows
    fast = NumericExampleEncoder(columns).encode(frame)
    slow = ProtoExampleEncoder(columns).encode(frame)
    assert len({len(record) for record in fast}) == 1
    assert [tf.train.Example.FromString(a) for a in fast] == [tf.train.Example.FromString(b) for b in slow]


def test_a_float_label_and_string_features_round_trip_through_parse_example() -> None:
    frame = pd.DataFrame({"city": ["Lyon", "", "Zürich"], "spend": [1.5, np.nan, -2.0], "y": [0.25, 10.0, -3.5]})
    columns = [("city", "string"), ("spend", "float"), ("y", "float")]
    records = ProtoExampleEncoder(columns).encode(frame)
    spec = {"city": tf.io.FixedLenFeature([], tf.string), "spend": tf.io.FixedLenFeature([], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.float32)}
    parsed = tf.io.parse_example(tf.constant(records), spec)
    assert [v.decode() for v in parsed["city"].numpy()] == ["Lyon", "", "Zürich"]
    assert np.isnan(parsed["spend"].numpy()[1])
    np.testing.assert_allclose(parsed["y"].numpy(), [0.25, 10.0, -3.5])
    numeric = NumericExampleEncoder(columns[1:]).encode(frame)
    assert [tf.train.Example.FromString(a) for a in numeric] == [
        tf.train.Example.FromString(b) for b in ProtoExampleEncoder(columns[1:]).encode(frame)]


@pytest.mark.parametrize("with_numeric", [True, False])
def test_the_mixed_encoder_matches_protobuf_with_text_columns(with_numeric: bool) -> None:
    rng = np.random.default_rng(3)
    n = 500
    frame = pd.DataFrame({"city": rng.choice(["Lyon", "Zürich", "", "x" * 300], size=n),
                          "note": [f"free text {i}" * (i % 4) for i in range(n)],
                          "spend": rng.normal(size=n), "calls": rng.integers(0, 300, size=n),
                          "y": rng.integers(0, 2, size=n)})
    columns = [("city", "string"), ("note", "string")]
    if with_numeric:
        columns += [("spend", "float"), ("calls", "int"), ("y", "int")]
    mixed = MixedExampleEncoder(columns).encode(frame)
    reference = ProtoExampleEncoder(columns).encode(frame)
    assert [tf.train.Example.FromString(a) for a in mixed] == [tf.train.Example.FromString(b) for b in reference]


@pytest.mark.parametrize("one_layout", [True, False])
def test_chunks_of_several_blocks_match_protobuf(one_layout: bool) -> None:
    """Rows are encoded BLOCK_ROWS at a time: a chunk spanning several blocks (and a partial last one), with one
    byte layout (contiguous blocks) or several (rows gathered per layout), matches protobuf row for row."""
    from trainyard_prep.encoding import BLOCK_ROWS

    rng = np.random.default_rng(3)
    n = 2 * BLOCK_ROWS + 37
    columns = [("a", "float"), ("b", "float"), ("label", "int")]
    frame = pd.DataFrame({"a": rng.normal(size=n), "b": rng.uniform(-1e3, 1e3, size=n)})
    frame["label"] = rng.integers(0, 5, size=n) if one_layout else rng.integers(0, 2**20, size=n)
    fast = NumericExampleEncoder(columns).encode(frame)
    slow = ProtoExampleEncoder(columns).encode(frame)
    assert (len({len(record) for record in fast}) == 1) is one_layout
    assert len(fast) == n
    assert [tf.train.Example.FromString(a) for a in fast] == [tf.train.Example.FromString(b) for b in slow]
