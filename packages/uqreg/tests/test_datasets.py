"""Real data sets (docs/conventions.md#r-9): the UCI folder layout read back, its bad files named,
the gap splits of Foong et al. (2019), and scikit-learn's diabetes data with seeded splits."""

from __future__ import annotations

import numpy as np
import pytest
from uqmetrics import InputError

from uqreg.datasets import (
    DATASETS,
    gap_splits,
    get_dataset,
    load_uci_folder,
    random_splits,
    register_uci_folder,
)


def _uci_folder(path, *, n=15, n_splits=2, seed=0, floats=True, with_n_splits=True):
    """A small UCI folder: 4 columns, features 0, 1, 3, target 2; indices written as the UCI
    folders write them (``np.savetxt`` floats) or as integers."""
    rng = np.random.default_rng(seed)
    data = rng.normal(size=(n, 4))
    path.mkdir(parents=True, exist_ok=True)
    np.savetxt(path / "data.txt", data)
    fmt = "%.18e" if floats else "%d"
    np.savetxt(path / "index_features.txt", np.array([0, 1, 3]), fmt=fmt)
    np.savetxt(path / "index_target.txt", np.array([2]), fmt=fmt)
    if with_n_splits:
        np.savetxt(path / "n_splits.txt", np.array([n_splits]), fmt=fmt)
    splits = []
    for k in range(n_splits):
        perm = rng.permutation(n)
        tr, te = perm[4:], perm[:4]
        np.savetxt(path / f"index_train_{k}.txt", tr, fmt=fmt)
        np.savetxt(path / f"index_test_{k}.txt", te, fmt=fmt)
        splits.append((tr, te))
    return data, splits


@pytest.mark.parametrize("floats", [True, False])
def test_uci_folder_read_back(tmp_path, floats):
    data, splits = _uci_folder(tmp_path / "toy" / "data", floats=floats)
    a = load_uci_folder(tmp_path / "toy" / "data")
    np.testing.assert_array_equal(a.x, data[:, [0, 1, 3]])
    np.testing.assert_array_equal(a.y, data[:, 2])
    assert a.feature_names == ("col0", "col1", "col3")
    assert len(a.splits) == 2
    for (tr, te), (tr2, te2) in zip(a.splits, splits):
        np.testing.assert_array_equal(tr, tr2)
        np.testing.assert_array_equal(te, te2)


def test_uci_folder_registered_and_split(tmp_path):
    _uci_folder(tmp_path / "toy_reg" / "data", n_splits=3, with_n_splits=False)  # splits counted from the files
    try:
        ds = register_uci_folder(tmp_path / "toy_reg" / "data")
        assert ds.name == "toy_reg" and get_dataset("toy_reg") is ds
        own = ds.splits("standard")
        assert [s.name for s in own] == ["standard_0", "standard_1", "standard_2"]
        assert len(ds.splits("standard", n_splits=2)) == 2
        assert [s.feature for s in ds.splits("gap")] == [0, 1, 2]
    finally:
        DATASETS.pop("toy_reg", None)


@pytest.mark.parametrize(("edit", "match"), [
    (lambda p: (p / "data.txt").unlink(), r"--data .*data\.txt is missing"),
    (lambda p: (p / "data.txt").write_text("1 2 3 4\n5 abc 7 8\n1 2 3 4\n"), r"data\.txt line 2: 'abc' is not a number"),
    (lambda p: (p / "data.txt").write_text("1 2 3 4\n5 6 7\n1 2 3 4\n"), r"data\.txt has rows of different lengths"),
    (lambda p: (p / "data.txt").write_text("1 2 3 4\n5 nan 7 8\n1 2 3 4\n"), r"data\.txt line 2 .*not finite"),
    (lambda p: (p / "index_target.txt").write_text("7\n"), r"index_target\.txt holds 7\.0, not a 0-based column"),
    (lambda p: (p / "index_features.txt").write_text("0\n2\n"), r"index_features\.txt must name distinct columns"),
    (lambda p: (p / "index_test_1.txt").write_text("3\n99\n"), r"index_test_1\.txt holds 99\.0, not a 0-based row"),
    (lambda p: (p / "index_train_0.txt").write_text("1.5\n"), r"index_train_0\.txt holds 1\.5"),
    (lambda p: (p / "index_train_1.txt").unlink(), r"index_train_1\.txt is missing"),
    (lambda p: (p / "n_splits.txt").write_text("0\n"), r"n_splits\.txt must hold one integer >= 1, got \[0\.0\]"),
    (lambda p: (p / "index_test_0.txt").write_text(" ".join(map(str, np.loadtxt(p / "index_train_0.txt")[:2]))),
     r"index_train_0\.txt and index_test_0\.txt share row"),
])
def test_uci_folder_bad_files_named(tmp_path, edit, match):
    folder = tmp_path / "bad"
    _uci_folder(folder, floats=False)
    edit(folder)
    with pytest.raises(InputError, match=match) as info:
        load_uci_folder(folder)
    assert str(folder) in str(info.value) and "\n" not in str(info.value)


def test_uci_folder_bad_value_named_at_its_line_past_blank_lines(tmp_path):
    """A value that is not finite is named at the file's own line, blank lines counted (before,
    the row's index among the non-blank lines: line 3 for line 4 here)."""
    folder = tmp_path / "blank"
    _uci_folder(folder, floats=False)
    (folder / "data.txt").write_text("1 2 3 4\n\n5 6 7 8\n1 nan 3 4\n")
    with pytest.raises(InputError, match=r"data\.txt line 4 holds a value that is not finite"):
        load_uci_folder(folder)


@pytest.mark.parametrize("name", ["index_train_0.txt", "index_test_1.txt"])
def test_uci_folder_repeated_row_named(tmp_path, name):
    """A row listed twice in a split's file is refused, naming the file and the row: repeated in
    a training part it could land in both the fit and the calibration part (before, it was read
    and trained on as two rows)."""
    folder = tmp_path / "twice"
    _uci_folder(folder, floats=False)
    rows = np.loadtxt(folder / name, dtype=np.int64)
    np.savetxt(folder / name, np.concatenate([rows, rows[1:2]]), fmt="%d")
    with pytest.raises(InputError, match=rf"{name.replace('.', '[.]')} repeats row {int(rows[1])}$") as info:
        load_uci_folder(folder)
    assert str(folder) in str(info.value)


def test_gap_splits_hold_out_the_middle_third():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(31, 3))
    x[:, 2] = rng.integers(0, 2, size=31)  # binary: ties straddle the cut
    splits = gap_splits(x, ["a", "b", "c"])
    assert [s.name for s in splits] == ["gap_a", "gap_b", "gap_c"]
    for j, s in enumerate(splits):
        assert s.kind == "gap" and s.feature == j
        assert s.test.size == 2 * 31 // 3 - 31 // 3 == 10
        assert np.intersect1d(s.train, s.test).size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([s.train, s.test])), np.arange(31))
        ranks = np.empty(31, dtype=int)
        ranks[np.argsort(x[:, j], kind="stable")] = np.arange(31)
        np.testing.assert_array_equal(np.sort(s.test), np.flatnonzero((ranks >= 10) & (ranks < 20)))
        if j < 2:  # distinct values: a gap in the feature between the three parts
            lower, upper = s.train[x[s.train, j] < x[s.test, j].min()], s.train[x[s.train, j] > x[s.test, j].max()]
            assert lower.size == 10 and upper.size == 11


def test_diabetes_loads_and_splits_deterministically():
    ds = get_dataset("diabetes")
    a = ds.arrays()
    assert a.x.shape == (442, 10) and a.y.shape == (442,) and a.splits is None
    assert np.all(np.isfinite(a.x)) and a.feature_names[:3] == ("age", "sex", "bmi")
    s1, s2 = ds.splits(n_splits=3), ds.splits(n_splits=5)
    assert len(s1) == 3 and len(s2) == 5 and len(ds.splits()) == 20
    for u, v in zip(s1, s2):  # a split depends on its number only
        np.testing.assert_array_equal(u.train, v.train)
        np.testing.assert_array_equal(u.test, v.test)
    assert all(s.test.size == 44 and s.train.size == 398 for s in s1)
    assert not np.array_equal(s1[0].test, s1[1].test)
    assert not np.array_equal(ds.splits(n_splits=1, seed=1)[0].test, s1[0].test)
    np.testing.assert_array_equal(random_splits(442, 1)[0].test, s1[0].test)
    gaps = ds.splits("gap")
    assert len(gaps) == 10 and all(g.test.size == 147 for g in gaps)


def test_bad_split_arguments():
    ds = get_dataset("diabetes")
    with pytest.raises(InputError, match="splits must be one of standard, gap, got 'middle'"):
        ds.splits("middle")
    with pytest.raises(InputError, match="n_splits must be an integer >= 1, got 0"):
        ds.splits(n_splits=0)
