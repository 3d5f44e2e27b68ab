import json

import numpy as np
import pytest
import xarray as xr
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax as sp_log_softmax
from scipy.special import softmax as sp_softmax
from sklearn.metrics import roc_auc_score
from uqmetrics import calibration_splits, write_dataset

from uqvision.cache import CacheError
from uqvision.exceptions import SkippedCacheWarning
from uqvision.protocols.selective.score import SELECTIVE_METRICS, SelectiveConfig, score_selective

# ---- an independent recomputation of every metric from raw probabilities (no ties in κ) ----


def _ece(y, p, m=15):
    conf, pred = p.max(1), p.argmax(1)
    b = np.clip(np.ceil(conf * m).astype(int) - 1, 0, m - 1)
    return sum(abs((pred[b == j] == y[b == j]).mean() - conf[b == j].mean()) * (b == j).mean()
               for j in range(m) if (b == j).any())


def _aurc(correct, kappa):
    err = ~correct[np.argsort(-kappa)]
    i = np.arange(1, err.size + 1)
    return np.mean(np.cumsum(err) / i)


def _oracle_aurc(correct):
    i = np.arange(1, correct.size + 1)
    return np.mean(np.maximum(0, i - correct.sum()) / i)


def _aurc_c(correct, kappa, high=0.5):
    """Mean risk of the top i over the coverages i/N <= high (AURC_C over [0, high])."""
    err = ~correct[np.argsort(-kappa)]
    i = np.arange(1, err.size + 1)
    return np.mean((np.cumsum(err) / i)[:int(np.floor(high * err.size))])


def _sac(correct, kappa, alpha):
    acc = np.cumsum(correct[np.argsort(-kappa)]) / np.arange(1, correct.size + 1)
    ok = np.flatnonzero(acc >= alpha)
    return 0.0 if ok.size == 0 else (ok.max() + 1) / correct.size


def reference(y, p, kappa):
    correct = p.argmax(1) == y
    onehot = np.eye(p.shape[1])[y]
    return {"accuracy": correct.mean(), "auroc": roc_auc_score(correct, kappa),
            "aurc": _aurc(correct, kappa),
            "eaurc": _aurc(correct, kappa) - _oracle_aurc(correct),
            "aurc_c": _aurc_c(correct, kappa),
            "eaurc_c": _aurc_c(correct, kappa) - _aurc_c(correct, correct.astype(float)),
            "sac_99": _sac(correct, kappa, 0.99), "sac_95": _sac(correct, kappa, 0.95),
            "ece": _ece(y, p), "nll": np.mean(-np.log(np.clip(p[np.arange(y.size), y], 1e-12,
                                                                None))),
            "brier": np.mean(((p - onehot) ** 2).sum(1))}


def _fit_t(z, y):
    f = lambda lt: -np.mean(sp_log_softmax(z / np.exp(lt), axis=1)[np.arange(y.size), y])
    return float(np.exp(minimize_scalar(f, bounds=(np.log(0.01), np.log(100)),
                                        method="bounded", options={"xatol": 1e-10}).x))


@pytest.fixture
def zoo(tmp_path, write_cache, member_logits):
    rng = np.random.default_rng(0)
    y, z = member_logits(rng, 300, 5, 3, signal=1.5, noise=1.0)
    z[1] *= 3.0  # an over-confident model (fitted T > 1)
    write_cache(tmp_path, z[0], y, model="a")
    write_cache(tmp_path, z[1], y, model="b")
    mc = z[2][None] + 0.5 * rng.normal(size=(30, *z[2].shape))  # the default 30 passes
    # caches hold float32 logits: recompute from exactly what is stored
    z, mc = z.astype(np.float32).astype(float), mc.astype(np.float32).astype(float)
    write_cache(tmp_path, z[2], y, model="c")
    write_cache(tmp_path, mc, y, model="c", mode="mc_dropout")
    return tmp_path, y, z, mc


@pytest.mark.parametrize("none_samples", ["heldout", "all"])
def test_scores_equal_an_independent_recomputation_from_raw_logits(zoo, none_samples):
    path, y, z, mc = zoo
    ds = score_selective([path], SelectiveConfig(calibration_size=0.3, seed=1,
                                                 none_samples=none_samples))
    (calib, rest), = calibration_splits(y, protocol="stratified_holdout", n_calib=90, seed=1)
    assert (ds.attrs["n_calib"], ds.attrs["n_eval"]) == (90, 210)
    assert list(ds["model"].values) == ["a", "b", "c", "c+mc_dropout"]
    rows = {"a": np.log(sp_softmax(z[0], 1)), "b": np.log(sp_softmax(z[1], 1)),
            "c": np.log(sp_softmax(z[2], 1)),
            "c+mc_dropout": np.log(sp_softmax(mc, -1).mean(0))}
    none_idx = np.arange(y.size) if none_samples == "all" else rest
    for row, lp in rows.items():
        t = float(ds["temperature"].sel(model=row, calibration="temperature"))
        assert t == pytest.approx(_fit_t(lp[calib], y[calib]), rel=1e-4)
        # none on the rest (the default) or on every sample (the official code's sets);
        # temperature and none_heldout on the rest
        for cal, temp, idx in (("none", 1.0, none_idx), ("temperature", t, rest),
                               ("none_heldout", 1.0, rest)):
            p = sp_softmax(lp[idx] / temp, axis=1)
            if row.endswith("mc_dropout"):  # κ = negative predictive entropy; ECE not reported
                kappa = (p * np.log(p)).sum(1)
            else:
                kappa = p.max(1)
            ref = reference(y[idx], p, kappa)
            for name in SELECTIVE_METRICS:
                got = float(ds["none_heldout"].sel(model=row, metric=name)
                            if cal == "none_heldout" else ds[name].sel(model=row, calibration=cal))
                if row.endswith("mc_dropout") and name == "ece":
                    assert np.isnan(got)
                else:
                    assert got == pytest.approx(ref[name], rel=1e-9, abs=1e-12), (row, cal, name)
    assert float(ds["temperature"].sel(model="b", calibration="temperature")) > 1.5
    assert (ds["temperature"].sel(calibration="none") == 1).all()
    assert list(ds["passes"].values) == [1, 1, 1, 30] and ds.attrs["mc_passes"] == 30
    assert list(ds["sample_set"].values) == [none_samples, "heldout"]
    assert list(ds["n_scored"].values) == [none_idx.size, 210] and ds.attrs["n_images"] == 300
    assert ds.attrs["sample_set_rule"].startswith(
        "official_code" if none_samples == "all" else "heldout")
    assert ds.attrs["sac_rule"] == "largest" and ds["sac_99"].attrs["metric"] == "sac_99"


def test_mc_row_refuses_fewer_passes_and_uses_the_first_k(zoo):
    path, y, _, mc = zoo
    with pytest.raises(ValueError, match="has 30 passes; the \\+mc_dropout row needs 31"):
        score_selective([path], SelectiveConfig(calibration_size=0.3, mc_passes=31))
    ds = score_selective([path], SelectiveConfig(calibration_size=0.3, seed=1, mc_passes=10,
                                                 none_samples="all"))
    assert int(ds["passes"].sel(model="c+mc_dropout")) == 10
    p = sp_softmax(mc[:10], -1).mean(0)  # "none": every sample
    assert float(ds["auroc"].sel(model="c+mc_dropout", calibration="none")) == pytest.approx(
        roc_auc_score(p.argmax(1) == y, (p * np.log(p)).sum(1)), rel=1e-9)


def test_sac_rule_first_drop_is_used_and_recorded(zoo):
    from uqmetrics import sac_score

    path, y, z, _ = zoo
    ds = score_selective([path], SelectiveConfig(calibration_size=0.3, seed=1,
                                                 sac_rule="first_drop", none_samples="all"))
    assert ds.attrs["sac_rule"] == "first_drop"
    assert ds["sac_95"].attrs["metric"] == "sac_95_first_drop"
    assert "sac_first_drop" in ds["sac_95"].attrs["convention"]
    p = sp_softmax(z[0], 1)  # "none": every sample
    expected = sac_score(p.argmax(1) == y, p.max(1), accuracy=0.95, rule="first_drop")
    assert float(ds["sac_95"].sel(model="a", calibration="none")) == expected
    largest = score_selective([path], SelectiveConfig(calibration_size=0.3, seed=1))
    assert not np.array_equal(ds["sac_95"].values, largest["sac_95"].values)
    with pytest.raises(ValueError, match="sac_rule must be one of"):
        score_selective([path], SelectiveConfig(calibration_size=0.3, sac_rule="official"))


def test_metadata_coords(zoo, tmp_path):
    from uqvision.protocols.selective.metadata import ModelMetadata, write_metadata

    path, *_ = zoo
    ds = score_selective([path], SelectiveConfig(calibration_size=0.3))
    assert (ds["family"].values == "unknown").all() and not ds["metadata_known"].any()
    keys = [str(k) for k in ds["metadata_key"].values]
    table = write_metadata([ModelMetadata(keys[0], family="F", base_architecture="f",
                                          params=7, input_size=16, distillation="yes")],
                           tmp_path / "extra.csv")
    ds = score_selective([path], SelectiveConfig(calibration_size=0.3, metadata=(str(table),)))
    assert ds["family"].values[0] == "F" and ds["distillation"].values[0] == "yes"
    assert ds["metadata_known"].values.tolist() == [True, False, False, False]
    assert str(table) in ds.attrs["metadata_tables"]


def test_score_file_contract_with_plain_xarray(zoo, tmp_path):
    path, *_ = zoo
    out = write_dataset(score_selective([path], SelectiveConfig(calibration_size=0.3)),
                        tmp_path / "scores" / "selective.nc")
    ds = xr.open_dataset(out)
    for v in ("accuracy", "auroc", "aurc", "eaurc", "sac_99", "sac_95", "ece", "nll", "brier",
              "temperature"):
        assert ds[v].dims == ("model", "calibration"), v
    assert list(ds["calibration"].values) == ["none", "temperature"]
    ds.close()


def test_temperature_never_changes_accuracy(zoo):
    ds = score_selective([zoo[0]], SelectiveConfig(calibration_size=0.3))
    np.testing.assert_array_equal(ds["none_heldout"].sel(metric="accuracy").values,
                                  ds["accuracy"].sel(calibration="temperature").values)


def test_unscaled_rows_use_the_held_out_samples_unless_every_sample_is_asked(zoo):
    """S.1 stratified_holdout: the unscaled metrics on the samples of the temperature-scaled
    ones, those left after the calibration subset, so the two rows compare (the default);
    none_samples="all" scores them on all test images, as Galil et al.'s benchmark_models.py.
    """
    path, y, z, _ = zoo
    default = score_selective([path], SelectiveConfig(calibration_size=0.3, seed=1))
    ds = score_selective([path], SelectiveConfig(calibration_size=0.3, seed=1,
                                                 none_samples="all"))
    (_, rest), = calibration_splits(y, protocol="stratified_holdout", n_calib=90, seed=1)
    p = sp_softmax(z[0], 1)
    t = float(ds["temperature"].sel(model="a", calibration="temperature"))
    p_t = sp_softmax(z[0][rest] / t, 1)
    on = {"all": roc_auc_score(p.argmax(1) == y, p.max(1)),
          "heldout": roc_auc_score(p[rest].argmax(1) == y[rest], p[rest].max(1))}
    assert abs(on["all"] - on["heldout"]) > 1e-3  # the two sample sets tell apart
    assert float(ds["auroc"].sel(model="a", calibration="none")) == pytest.approx(
        on["all"], rel=1e-12)
    for f in (ds, default):
        assert float(f["none_heldout"].sel(model="a", metric="auroc")) == pytest.approx(
            on["heldout"], rel=1e-12)
    assert float(default["auroc"].sel(model="a", calibration="none")) == pytest.approx(
        on["heldout"], rel=1e-12)
    for name in SELECTIVE_METRICS:  # the default's none row is none_heldout
        np.testing.assert_array_equal(default[name].sel(calibration="none").values,
                                      default["none_heldout"].sel(metric=name).values)
    assert dict(zip(default["sample_set"].values, default["n_scored"].values.tolist(),
                    strict=True)) == {"heldout": 210}
    with pytest.raises(ValueError, match="none_samples must be one of heldout, all, got 'rest'"):
        score_selective([path], SelectiveConfig(calibration_size=0.3, none_samples="rest"))
    assert float(ds["auroc"].sel(model="a", calibration="temperature")) == pytest.approx(
        roc_auc_score(p_t.argmax(1) == y[rest], p_t.max(1)), rel=1e-12)
    assert float(ds["accuracy"].sel(model="a", calibration="none")) == pytest.approx(
        np.mean(p.argmax(1) == y), rel=1e-12)
    assert dict(zip(ds["sample_set"].values, ds["n_scored"].values.tolist(), strict=True)) \
        == {"all": 300, "heldout": 210}
    assert (ds.attrs["n_images"], ds.attrs["n_calib"], ds.attrs["n_eval"]) == (300, 90, 210)


def test_aurc_coverage_is_an_option_recorded_in_the_file(zoo):
    path, y, z, _ = zoo
    ds = score_selective([path], SelectiveConfig(calibration_size=0.3, seed=1,
                                                 aurc_coverage=0.2, none_samples="all"))
    p = sp_softmax(z[0], 1)
    correct = p.argmax(1) == y
    assert float(ds["aurc_c"].sel(model="a", calibration="none")) == pytest.approx(
        _aurc_c(correct, p.max(1), high=0.2), rel=1e-12)
    assert float(ds["eaurc_c"].sel(model="a", calibration="none")) == pytest.approx(
        _aurc_c(correct, p.max(1), high=0.2) - _aurc_c(correct, correct.astype(float), 0.2),
        rel=1e-12, abs=1e-15)
    assert json.loads(ds.attrs["aurc_coverage"]) == [0.0, 0.2]
    assert "[0, 0.2]" in json.loads(ds.attrs["conventions"])["aurc_c"]
    assert list(ds["aurc_c"].attrs["coverage"]) == [0.0, 0.2]
    assert "[0, 0.2]" in ds["aurc_c"].attrs["convention"]
    default = score_selective([path], SelectiveConfig(calibration_size=0.3, seed=1,
                                                      none_samples="all"))
    assert SelectiveConfig().aurc_coverage == 0.5
    assert json.loads(default.attrs["aurc_coverage"]) == [0.0, 0.5]
    assert not np.array_equal(ds["aurc_c"].values, default["aurc_c"].values)
    np.testing.assert_array_equal(ds["aurc"].values, default["aurc"].values)
    full = score_selective([path], SelectiveConfig(calibration_size=0.3, seed=1,
                                                   aurc_coverage=1.0))
    np.testing.assert_allclose(full["aurc_c"].values, full["aurc"].values, rtol=1e-12)
    for bad in (0.0, 1.5, 1e-4):  # 1e-4 of 210 held-out samples covers none
        with pytest.raises(ValueError, match="aurc-coverage"):
            score_selective([path], SelectiveConfig(calibration_size=0.3, aurc_coverage=bad))


def test_partial_and_corrupt_caches_are_never_scored(zoo, write_cache):
    path, y, z, _ = zoo
    (path / "d.test.plain-000.nc").write_bytes(b"CDF\x01 truncated")  # partial file
    bad = write_cache(path, z[0], y, model="e")
    import netCDF4

    with netCDF4.Dataset(bad, "a") as nc:  # readable, flagged complete, but data altered
        nc["logits"][0, 0] = 99.0
    with pytest.warns(SkippedCacheWarning, match="skipping"), pytest.raises(CacheError, match="checksum"):
        score_selective([path], SelectiveConfig(calibration_size=0.3))
    bad.unlink()
    with pytest.warns(SkippedCacheWarning, match="skipping"):
        ds = score_selective([path], SelectiveConfig(calibration_size=0.3))
    assert "d" not in ds["model"].values and "e" not in ds["model"].values


def test_mismatched_caches_raise(tmp_path, write_cache):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, 50)
    write_cache(tmp_path, rng.normal(size=(50, 4)), y, model="a")
    write_cache(tmp_path, rng.normal(size=(50, 4)), y, model="b",
                samples=[f"{i:05d}.png" for i in reversed(range(50))])
    with pytest.raises(CacheError, match="sample order"):
        score_selective([tmp_path], SelectiveConfig(calibration_size=0.3))


def test_calibration_size_is_checked(zoo):
    with pytest.raises(ValueError, match="calibration-size"):
        score_selective([zoo[0]], SelectiveConfig())  # 5000 of 300 samples
