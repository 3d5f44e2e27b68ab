"""The UIMNET class split (V.3): Ward tree, the in/out rule, the split file (the index
files: test_uimnet_index.py)."""

import json

import numpy as np
import pytest
from scipy.cluster.hierarchy import linkage
from uqmetrics import write_dataset

from uqvision.cache import cache_dataset
from uqvision.cli import main
from uqvision.protocols.uimnet.split import (
    class_means,
    read_split,
    split_from_caches,
    ward_split,
    write_split,
)


def _leaves(z: np.ndarray, node: int, n: int) -> list[int]:
    """Leaves under ``node`` of a scipy linkage matrix, left before right (by hand)."""
    if node < n:
        return [node]
    a, b = z[node - n, :2].astype(int)
    return _leaves(z, a, n) + _leaves(z, b, n)


def _independent_split(means: np.ndarray) -> tuple[list[int], list[int]]:
    n = len(means)
    z = linkage(means, method="ward")
    left, right = (_leaves(z, int(c), n) for c in z[-1, :2])
    m = min(len(left), len(right))
    return left[:m], right[:m]


def toy_means(sizes=(3, 3), seed=0):
    """Class means in tight groups far apart: the root of the Ward tree separates the groups."""
    rng = np.random.default_rng(seed)
    centres = [np.full(4, 10.0 * g) for g in range(len(sizes))]
    return np.concatenate([c + 0.1 * rng.standard_normal((s, 4))
                           for c, s in zip(centres, sizes)])


def test_split_equals_an_independent_scipy_computation_on_a_known_tree():
    means = toy_means((3, 3))
    classes = [f"c{i}" for i in range(6)]
    split = ward_split(means, classes)
    left, right = _independent_split(means)
    assert split["in_classes"] == [classes[i] for i in left]
    assert split["out_classes"] == [classes[i] for i in right]
    # the known tree: the two groups are the root's children
    groups = {frozenset(split["in_classes"]), frozenset(split["out_classes"])}
    assert groups == {frozenset(classes[:3]), frozenset(classes[3:])}
    np.testing.assert_array_equal(np.array(split["linkage"]), linkage(means, method="ward"))


@pytest.mark.parametrize("sizes", [(2, 5), (5, 2), (4, 4), (1, 3)])
def test_in_and_out_are_disjoint_with_equal_counts_for_unequal_children(sizes):
    means = toy_means(sizes, seed=1)
    classes = [f"k{i}" for i in range(len(means))]
    split = ward_split(means, classes)
    assert len(split["in_classes"]) == len(split["out_classes"]) == min(sizes)
    assert not set(split["in_classes"]) & set(split["out_classes"])
    assert sorted([split["left_size"], split["right_size"]]) == sorted(sizes)
    left, right = _independent_split(means)
    assert split["in_classes"] == [classes[i] for i in left]
    assert split["out_classes"] == [classes[i] for i in right]


def test_class_means_and_bad_input():
    x = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    np.testing.assert_allclose(class_means(x, [0, 0, 1], 2), [[1.0, 2.0], [4.0, 5.0]])
    with pytest.raises(ValueError, match="cover every class"):
        class_means(x, [0, 0, 0], 2)
    with pytest.raises(ValueError, match="means must be"):
        ward_split(np.zeros((1, 3)), ["a"])


def _feature_cache(path, means, per_class=5, seed=0):
    rng = np.random.default_rng(seed)
    n_classes = len(means)
    y = np.repeat(np.arange(n_classes), per_class)
    emb = means[y] + 0.01 * rng.standard_normal((len(y), means.shape[1]))
    ds = cache_dataset(np.zeros((len(y), n_classes)), y, samples=[f"s{i}" for i in range(len(y))],
                       classes=[f"c{i}" for i in range(n_classes)], embedding=emb,
                       attrs={"model": "m", "dataset_name": "train", "mode": "plain",
                              "pass_index": 0})
    write_dataset(ds, path)
    return emb, y


def test_split_file_is_versioned_and_records_the_source(tmp_path):
    means = toy_means((3, 3))
    emb, y = _feature_cache(tmp_path / "f.nc", means)
    split = split_from_caches([tmp_path / "f.nc"])
    assert split["in_classes"] == ward_split(class_means(emb, y, 6),
                                             [f"c{i}" for i in range(6)])["in_classes"]
    path = write_split(split, tmp_path / "split.json")
    back = read_split(path)
    assert back["format_version"] == 1 and back["feature_checksum"] == split["feature_checksum"]
    assert "rule" in back and back["linkage"] == split["linkage"]
    (tmp_path / "bad.json").write_text(json.dumps({"in_classes": []}))
    with pytest.raises(ValueError, match="is not a"):
        read_split(tmp_path / "bad.json")
    # the CLI writes the same file
    assert main(["split", "--embeddings", str(tmp_path / "f.nc"), "--out",
                 str(tmp_path / "cli.json")]) == 0
    assert read_split(tmp_path / "cli.json")["out_classes"] == split["out_classes"]
