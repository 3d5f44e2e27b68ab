"""``score_ood`` thresholds (V.3, S.4): the 5 % type-I bound holds on in-domain test.

Synthetic UIMNET caches (the variables :mod:`uqvision.protocols.uimnet.reproduce` writes) whose in-domain
validation and test images are drawn from one distribution: every measure's θ must then keep
95 % of in-domain test, the fitted ``gmm`` included (its θ comes from validation samples the
GMM was not fitted on).
"""

import json

import numpy as np
import pytest
from uqmetrics.io import write_dataset

from uqvision.protocols.uimnet.measures import MEASURES, MeasureInput, reference_split
from uqvision.protocols.uimnet.score import score_ood

N_CLASSES, DIM, AUGS, JAC = 4, 32, 1, 8
#: in-domain validation per class; test sizes. GMM fitted on 60 images per class in 32 dims:
#: its in-sample u is far below its out-of-sample u (the bias the split removes).
N_VAL_PER_CLASS, N_TEST, N_OUT = 120, 4000, 1000
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
    run_path = root / "runs" / "erm.s0.t0.nc"
    write_dataset(xr.Dataset(run), run_path)
    ens = xr.Dataset(
        {f"{s}_jacobian": (("calibration", f"{s}_jsample"), rng.random((2, JAC)))
         for s in ("in_val", "in_test", "out_test")},
        coords={"calibration": ["none", "temperature"]},
        attrs={"members": json.dumps([str(run_path)]), "temperature": 1.3, "k": 1})
    write_dataset(ens, root / "ensembles" / "erm.sn0.s0.k1.nc")
    return root


@pytest.fixture(scope="module")
def scored(caches):
    return score_ood(caches, ks=(1,))


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
    assert split["measures"] == [m for m in MEASURES.names() if MEASURES.lookup(m).fitted]
    assert split["measures"] == ["gmm"]
    assert split["fit_fraction"] == 0.5 and split["seed"] == 0
    assert split["sizes_by_data_seed"] == {"0": {"n_fit": n_val // 2,
                                                 "n_threshold": n_val - n_val // 2}}
    assert "held-out 'threshold' part" in ds.attrs["conventions"]
    with pytest.raises(ValueError, match="fit_fraction must lie in"):
        score_ood(caches, fit_fraction=1.0)


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
