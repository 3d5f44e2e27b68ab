"""UIMNET (V.3) hyper-parameter selection and the oracle's training images.

- a trial's configuration is drawn once and shared by every data seed; the top K trials are
  chosen by in-domain validation NLL averaged over data seeds (the paper's protocol);
- the oracle trains on the runs' in-domain training images and the out-domain ones, never on
  the in-domain validation images its threshold is set on.
"""

import numpy as np
import pytest
import xarray as xr
from uqmetrics.runs.io import write_dataset

from uqvision.data import (
    ClassSubset,
    ImageFolderDataset,
    image_view,
    make_synthetic_folder,
    read_index_file,
)
from uqvision.protocols.uimnet.index import make_index_files
from uqvision.protocols.uimnet.reproduce import (
    UIMNET_SCALES,
    _trial_hparams,
    oracle_index_file,
    select_trials,
)
from uqvision.protocols.uimnet.split import write_split


@pytest.mark.parametrize("algorithm", ["mixup", "oc", "due"])
def test_a_trial_is_one_configuration_for_every_data_seed(algorithm):
    sc = UIMNET_SCALES["smoke"]
    drawn = [_trial_hparams(algorithm, t, sc) for t in range(4)]
    assert drawn[0] == {"epochs": sc.epochs, "batch_size": sc.batch_size}  # the defaults
    assert all(set(d) > set(drawn[0]) for d in drawn[1:])  # draws of the search space
    assert len({tuple(sorted(d.items())) for d in drawn}) == 4  # trials differ
    assert drawn == [_trial_hparams(algorithm, t, sc) for t in range(4)]  # reproducible


def _run(path, nll):
    """A run cache whose in-domain validation NLL is ``nll`` (uniform-confidence logits)."""
    c, n = 3, 6
    p_true = np.exp(-nll)
    rest = (1 - p_true) / (c - 1)
    logits = np.log(np.where(np.eye(c)[np.arange(n) % c] > 0, p_true, rest))
    write_dataset(xr.Dataset({"in_val_logits": (("in_val_sample", "class"), logits),
                              "in_val_label": ("in_val_sample", np.arange(n) % c)}), path)
    return str(path)


def test_top_k_trials_by_validation_nll_averaged_over_data_seeds(tmp_path):
    # trial:               0     1     2     3
    nll = {0: np.array([0.50, 0.20, 0.90, 0.60]),
           1: np.array([0.55, 1.00, 0.30, 0.40])}
    # mean:                0.525 0.60 0.60 0.50 -> order 3, 0, 1 (tie 1/2: lower trial), 2
    # per seed, seed 0 would pick {1, 0} and seed 1 {2, 3}: different configurations
    runs = {s: [_run(tmp_path / f"t{t}.s{s}.nc", v) for t, v in enumerate(vals)]
            for s, vals in nll.items()}
    trials, mean = select_trials(runs, 2)
    assert trials == [3, 0]
    np.testing.assert_allclose(mean, (nll[0] + nll[1]) / 2, rtol=1e-6)
    assert select_trials(runs, 3)[0] == [3, 0, 1]
    assert select_trials(runs, 9)[0] == [3, 0, 1, 2]
    with pytest.raises(ValueError, match="same number of trials"):
        select_trials({0: runs[0], 1: runs[1][:2]}, 2)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    make_synthetic_folder(root, n_classes=4, n_per_class=20, image_size=8)
    return root / "test"


def test_the_oracle_does_not_train_on_the_in_domain_validation_images(folder, tmp_path):
    split = {"in_classes": ["class_002", "class_000"], "out_classes": ["class_001", "class_003"]}
    split_file = write_split(split, tmp_path / "split.json")
    files = make_index_files(folder, split["in_classes"], tmp_path / "index", seed=1)
    path = oracle_index_file(folder, split_file, 1)
    assert path == tmp_path / "index" / "seed1.oracle.json"
    index = read_index_file(path)
    classes = split["in_classes"] + split["out_classes"]
    assert index["classes"] == classes
    view = ClassSubset(ImageFolderDataset(folder), classes)
    assert [view.sample_ids[i] for i in index["indices"]] == index["samples"]
    samples = set(index["samples"])
    val, train = (set(read_index_file(files[p])["samples"]) for p in ("val", "train"))
    assert val and not samples & val  # no in-domain validation image
    out_ids = {sid for sid, y in zip(view.sample_ids, view.targets, strict=True) if y >= 2}
    assert samples == train | out_ids  # the runs' training images and every out-domain one
    # the training loop's view of it: in + out classes mapped to two labels
    groups = {**dict.fromkeys(split["in_classes"], "in"),
              **dict.fromkeys(split["out_classes"], "out")}
    oracle_view = image_view(folder, classes=groups, index_file=path)
    assert len(oracle_view) == len(train) + 40
    assert np.bincount(oracle_view.targets).tolist() == [len(train), 40]
