"""``score_ood`` thresholds (V.3, S.4): the 5 % type-I bound holds on in-domain test.

Synthetic UIMNET caches (the variables :mod:`uqvision.protocols.uimnet.reproduce` writes)
whose in-domain training, validation and test images are drawn from one distribution: every
measure's θ must then keep 95 % of in-domain test, ``gmm`` under its three fits (the two
fitted on the training split, Ledoit–Wolf and official; the validation one with its θ from
validation samples the GMM was not fitted on). Run caches without the chosen fit's values
(written before it) are refused, never scored in its place.
"""

import json

import numpy as np
import pytest
from uqmetrics.runs.io import read_dataset, write_dataset

from uqvision.protocols.uimnet.measures import (
    GMM_COVARIANCE,
    GMM_FITS,
    GMM_TRAIN_FITS,
    MeasureInput,
    gmm_train_uncertainty,
    reference_split,
)
from uqvision.protocols.uimnet.score import score_ood

N_CLASSES, DIM, AUGS, JAC = 4, 32, 1, 8
#: in-domain validation per class; test sizes. GMM fitted on 60 images per class in 32 dims:
#: its in-sample u is far below its out-of-sample u (the bias the split removes).
N_VAL_PER_CLASS, N_TEST, N_OUT = 120, 4000, 1000
#: the training-split GMM fits' training split, per class
N_TRAIN_PER_CLASS = 200
Q = 0.95


def _split_arrays(rng, means, n, prefix, labels=None):
    """One set of a run cache: features ~ N(mean_y, I), logits a fixed linear read-out."""
    y = rng.integers(0, N_CLASSES, n) if labels is None else labels
    feats = means[y] + rng.standard_normal((n, DIM))
    w = np.eye(N_CLASSES, DIM) * 1.5  # read-out: class c looks at feature c
    logits = feats @ w.T
    tta = (logits + 0.3 * rng.standard_normal((AUGS, n, N_CLASSES)))
    dim = f"{prefix}_sample"
    return {f"{prefix}_logits": ((dim, "class"), logits.astype(np.float32)),
            f"{prefix}_features": ((dim, "feature"), feats.astype(np.float32)),
            f"{prefix}_native": (dim, np.full(n, np.nan)),
            f"{prefix}_tta": (("aug", dim, "class"), tta.astype(np.float32)),
            f"{prefix}_label": (dim, y)}


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    import xarray as xr

    root = tmp_path_factory.mktemp("ood_caches")
    rng = np.random.default_rng(20240611)
    means_in = np.zeros((N_CLASSES, DIM))
    means_in[np.arange(N_CLASSES), np.arange(N_CLASSES)] = 3.0
    means_out = means_in + 1.5  # out-domain: shifted classes
    val_labels = np.repeat(np.arange(N_CLASSES), N_VAL_PER_CLASS)
    run = {**_split_arrays(rng, means_in, val_labels.size, "in_val", val_labels),
           **_split_arrays(rng, means_in, N_TEST, "in_test"),
           **_split_arrays(rng, means_out, N_OUT, "out_test")}
    train_labels = np.repeat(np.arange(N_CLASSES), N_TRAIN_PER_CLASS)
    train = means_in[train_labels] + rng.standard_normal((train_labels.size, DIM))
    sets = ("in_val", "in_test", "out_test")
    for fit, (field, _) in GMM_TRAIN_FITS.items():
        gmm = gmm_train_uncertainty(train, train_labels,
                                    {s: run[f"{s}_features"][1] for s in sets}, fit=fit)
        run.update({f"{s}_{field}": (f"{s}_sample", gmm[s]) for s in sets})
    run_path = root / "runs" / "erm.s0.t0.nc"
    cfg = {"tta_policy": "uimnet", "tta": AUGS, "gmm_train": {"covariance": {
        field: GMM_COVARIANCE[fit] for fit, (field, _) in GMM_TRAIN_FITS.items()}}}
    write_dataset(xr.Dataset(run, attrs={"uimnet": json.dumps(cfg)}), run_path)
    ens = xr.Dataset(
        {f"{s}_{name}": (("calibration", f"{s}_jsample"), rng.random((2, JAC)))
         for s in sets for name in ("jacobian", "jacobian_softmax")},
        coords={"calibration": ["none", "temperature"]},
        attrs={"members": json.dumps([str(run_path)]), "temperature": 1.3, "k": 1})
    write_dataset(ens, root / "ensembles" / "erm.sn0.s0.k1.nc")
    return root


@pytest.fixture(scope="module", params=GMM_FITS.names())
def scored(caches, request):
    return score_ood(caches, ks=(1,), gmm_fit=request.param)


@pytest.mark.parametrize("measure", ["gmm", "entropy", "largest", "gap", "tta"])
def test_in_as_in_on_exchangeable_in_domain_test_is_095(scored, measure):
    """θ̂ is the 95 % quantile of m exchangeable threshold-set values and InAsIn the fraction of
    n test values below it: F(θ̂) has variance ≈ q(1-q)/m (a Beta order statistic) and the
    test fraction adds q(1-q)/n, so se = sqrt(q(1-q)(1/n + 1/m)); InAsIn within 4 se of 0.95.
    The old scoring (GMM fitted and θ taken on the same validation images) gives ≈ 0.5 here."""
    ds = scored
    split = json.loads(ds.attrs["reference_split"])
    n_val = N_CLASSES * N_VAL_PER_CLASS
    m = split["sizes_by_data_seed"]["0"]["n_threshold"] if measure in split["measures"] \
        else n_val
    se = np.sqrt(Q * (1 - Q) * (1 / N_TEST + 1 / m))
    for cal in ("none", "temperature"):
        got = float(ds["in_as_in"].sel(algorithm="erm", measure=measure, k=1, calibration=cal,
                                       spectral=False, stat="mean"))
        assert abs(got - Q) <= 4 * se, (measure, cal, got, 4 * se)


def test_gmm_split_is_recorded_and_halves_validation(caches, scored):
    ds = scored
    split = json.loads(ds.attrs["reference_split"])
    n_val = N_CLASSES * N_VAL_PER_CLASS
    fit = ds.attrs["gmm_fit"]
    assert json.loads(ds.attrs["config"])["gmm_fit"] == fit
    assert split["measures"] == (["gmm"] if fit == "validation-ledoit-wolf" else [])
    assert split["fit_fraction"] == 0.5 and split["seed"] == 0
    assert split["sizes_by_data_seed"] == {"0": {"n_fit": n_val // 2,
                                                 "n_threshold": n_val - n_val // 2}}
    assert "held-out 'threshold' part" in ds.attrs["notes"]
    assert ds.attrs["gmm_covariance"] == GMM_COVARIANCE[fit]
    assert ("LedoitWolf" in ds.attrs["gmm_covariance"]) == (fit != "official")
    assert ("training split" in ds.attrs["gmm_covariance"]) == (fit in GMM_TRAIN_FITS)
    assert json.loads(ds.attrs["tta_policy"]) == [f"uimnet x {AUGS}"]
    with pytest.raises(ValueError, match="fit_fraction must lie in"):
        score_ood(caches, fit_fraction=1.0)


def _gmm_auc(ds):
    return float(ds["auc"].sel(algorithm="erm", measure="gmm", k=1, calibration="none",
                               spectral=False, stat="mean"))


@pytest.mark.parametrize("fit", list(GMM_TRAIN_FITS))
def test_a_training_split_gmm_auc_is_that_of_the_run_caches_values(caches, fit):
    """gmm_fit='train-ledoit-wolf' ('official') scores the run cache's
    <set>_gmm_train_ledoit_wolf (<set>_gmm_train) values: AUC recomputed by hand (rank
    statistic) from them; the other fits give other values."""
    field = GMM_TRAIN_FITS[fit][0]
    ds = score_ood(caches, ks=(1,), gmm_fit=fit)
    run = read_dataset(caches / "runs" / "erm.s0.t0.nc")
    u_in, u_out = run[f"in_test_{field}"].values, run[f"out_test_{field}"].values
    auc = (u_out[:, None] > u_in[None, :]).mean() + 0.5 * (u_out[:, None] == u_in[None, :]).mean()
    assert _gmm_auc(ds) == pytest.approx(auc, abs=1e-12)
    for other in set(GMM_FITS.names()) - {fit}:
        assert _gmm_auc(score_ood(caches, ks=(1,), gmm_fit=other)) != pytest.approx(
            _gmm_auc(ds), abs=1e-6)


def test_the_default_fit_is_train_ledoit_wolf(caches):
    ds = score_ood(caches, ks=(1,))
    assert ds.attrs["gmm_fit"] == "train-ledoit-wolf"
    assert json.loads(ds.attrs["config"])["gmm_fit"] == "train-ledoit-wolf"
    assert ds.attrs["gmm_covariance"] == GMM_COVARIANCE["train-ledoit-wolf"]
    assert _gmm_auc(ds) == _gmm_auc(score_ood(caches, ks=(1,), gmm_fit="train-ledoit-wolf"))


def _one_member_copy(caches, tmp_path):
    """A copy of the caches whose first ensemble cell has one member: ``(folder, that cell,
    its run cache)`` (then to be rewritten in an earlier layout)."""
    import shutil

    old = tmp_path / "caches"
    shutil.copytree(caches, old)
    ens_path = old / "ensembles" / "erm.sn0.s0.k1.nc"
    run_path = old / "runs" / "erm.s0.t0.nc"
    ens = read_dataset(ens_path)
    ens.attrs["members"] = json.dumps([str(run_path)])
    write_dataset(ens, ens_path, overwrite=True)
    return old, ens_path, run_path


def test_run_caches_of_the_former_default_are_refused_not_mixed(caches, tmp_path):
    """A run cache written while 'official' was the default holds <set>_gmm_train only: the
    new default refuses it, naming the variable and the fits that it can give, and scores
    nothing; 'official' still scores it, to the same values. A cache whose recorded
    estimator for the variable is not the fit's is refused too."""
    old, _, run_path = _one_member_copy(caches, tmp_path)
    run = read_dataset(run_path)
    former = run.drop_vars([f"{s}_gmm_train_ledoit_wolf"
                            for s in ("in_val", "in_test", "out_test")])
    former.attrs["uimnet"] = json.dumps({"tta_policy": "uimnet", "tta": AUGS})
    write_dataset(former, run_path, overwrite=True)
    with pytest.raises(ValueError, match=r"run cache .*erm\.s0\.t0\.nc' has no "
                                         r"'in_val_gmm_train_ledoit_wolf'.*gmm_fit="
                                         r"'train-ledoit-wolf'.*\['official', "
                                         r"'validation-ledoit-wolf'\]"):
        score_ood(old, ks=(1,))
    assert _gmm_auc(score_ood(old, ks=(1,), gmm_fit="official")) == _gmm_auc(
        score_ood(caches, ks=(1,), gmm_fit="official"))
    # the variable is there, but recorded as computed by another estimator
    cfg = {"gmm_train": {"covariance": {"gmm_train_ledoit_wolf": "sample covariance + 0.1 I"}}}
    run.attrs["uimnet"] = json.dumps(cfg)
    write_dataset(run, run_path, overwrite=True)
    with pytest.raises(ValueError, match="computed as 'sample covariance \\+ 0.1 I', not as "
                                         "the GMM fit gmm_fit='train-ledoit-wolf'"):
        score_ood(old, ks=(1,))


def test_caches_without_the_new_variables_are_refused(caches, tmp_path):
    """An ensemble cell of the former layout ('<set>_jacobian' held the softmax variant) and a
    run cache without the training-split GMM values are named, not misread."""
    old, ens_path, run_path = _one_member_copy(caches, tmp_path)
    run = read_dataset(run_path)
    write_dataset(run.drop_vars([f"{s}_gmm_train" for s in ("in_val", "in_test", "out_test")]),
                  run_path, overwrite=True)
    with pytest.raises(ValueError, match="no 'in_val_gmm_train'"):
        score_ood(old, ks=(1,), gmm_fit="official")
    assert np.isfinite(score_ood(old, ks=(1,), gmm_fit="validation-ledoit-wolf")["auc"]
                       .sel(measure="gmm", stat="mean")).all()
    ens = read_dataset(ens_path)
    write_dataset(ens.drop_vars([f"{s}_jacobian_softmax"
                                 for s in ("in_val", "in_test", "out_test")]),
                  ens_path, overwrite=True)
    with pytest.raises(ValueError, match="predates the official UIMNET Jacobian"):
        score_ood(old, ks=(1,), gmm_fit="validation-ledoit-wolf")


def test_reference_split_is_stratified_disjoint_and_seeded():
    y = np.repeat([0, 1, 2], [10, 7, 3])
    fit, held = reference_split(y, fit_fraction=0.5, seed=3)
    assert np.array_equal(np.sort(np.r_[fit, held]), np.arange(y.size))
    counts = np.bincount(y[fit], minlength=3)
    assert np.all(np.abs(counts - np.bincount(y) * fit.size / y.size) <= 1)
    again = reference_split(y, fit_fraction=0.5, seed=3)
    assert np.array_equal(again[0], fit) and np.array_equal(again[1], held)
    assert not np.array_equal(reference_split(y, fit_fraction=0.5, seed=4)[0], fit)
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match=r"fit_fraction must lie in \(0, 1\)"):
            reference_split(y, fit_fraction=bad)
    with pytest.raises(ValueError, match="labels must have shape"):
        reference_split([1])


def test_measure_input_subset_indexes_every_image_axis():
    rng = np.random.default_rng(0)
    inp = MeasureInput(rng.standard_normal((2, 5, 3)), temperature=2.0,
                       labels=np.arange(5), features=rng.standard_normal((2, 5, 4)),
                       tta=rng.standard_normal((2, 3, 5, 3)), native=rng.random((2, 5)),
                       jacobian=np.arange(5.0))
    idx = np.array([4, 1])
    sub = inp.subset(idx)
    np.testing.assert_array_equal(sub.logits, inp.logits[:, idx])
    np.testing.assert_array_equal(sub.labels, idx)
    np.testing.assert_array_equal(sub.features, inp.features[:, idx])
    np.testing.assert_array_equal(sub.tta, inp.tta[:, :, idx])
    np.testing.assert_array_equal(sub.native, inp.native[:, idx])
    assert sub.jacobian is None and sub.temperature == 2.0
    mask = np.zeros(5, bool)
    mask[[1, 4]] = True
    np.testing.assert_array_equal(inp.subset(mask).labels, [1, 4])
    for bad in ([5], [[0]], [0.5], np.ones(4, bool)):
        with pytest.raises(ValueError, match="index must be"):
            inp.subset(bad)
