import numpy as np
import pytest
import xarray as xr
from uqmetrics import write_dataset

from uqvision.cache import CacheError
from uqvision.ensembles import EnsembleConfig, Source, score_ensembles

METRICS = ("accuracy", "nll", "brier", "ece", "cll", "auroc", "aurc", "eaurc")


def test_k_identical_members_score_like_one(tmp_path, write_cache, member_logits):
    y, z = member_logits(np.random.default_rng(0), 200, 4, 1)
    for k in range(3):
        write_cache(tmp_path, z[0], y, model=f"m{k}")
    ds = score_ensembles([tmp_path], EnsembleConfig(n_orders=3, n_repeats=2))
    de = ds.sel({"method": "deep_ensemble"})
    for name in METRICS:
        v = de[name].values  # (order, size)
        np.testing.assert_allclose(v, np.broadcast_to(v[:, :1], v.shape), rtol=1e-10,
                                   atol=1e-12, err_msg=name)
    assert list(ds["method"].values) == ["deep_ensemble"]  # no TTA / MC caches here


def test_dee_of_the_deep_ensemble_against_itself_is_its_size(tmp_path, write_cache,
                                                               member_logits):
    y, z = member_logits(np.random.default_rng(1), 600, 5, 4, signal=1.0, noise=2.0)
    for k in range(4):
        write_cache(tmp_path, z[k], y, model=f"m{k}")
    ds = score_ensembles([tmp_path], EnsembleConfig(n_orders=5, n_repeats=2))
    de = ds.sel({"method": "deep_ensemble"})
    mean = de["cll"].mean("order").values
    assert np.all(np.diff(mean) > 0)  # the premise: more members, better CLL
    np.testing.assert_allclose(de["dee"].values, [1, 2, 3, 4], rtol=0, atol=1e-9)
    assert ds.attrs["dee_cap"] == 4 and not de["dee_capped"].values.any()
    # accuracy of the mean over members improves too, and the orders agree at full size
    assert np.ptp(de["nll"].values[:, -1]) < 1e-12


def test_methods_from_tta_and_mc_caches_and_extra_sample_sets(tmp_path, write_cache,
                                                              member_logits):
    rng = np.random.default_rng(2)
    y, z = member_logits(rng, 300, 5, 3, signal=1.0, noise=2.0)
    for k in range(3):
        write_cache(tmp_path, z[k], y, model=f"m{k}")
        write_cache(tmp_path, z[k] + rng.normal(size=z[k].shape), y, model=f"m{k}",
                    mode="tta", pass_index=k)
    for p in (1, 2):
        write_cache(tmp_path, z[0] + rng.normal(size=z[0].shape), y, model="m0", mode="tta",
                    pass_index=p)
    mc = write_cache(tmp_path, z[0][None] + 0.3 * rng.normal(size=(5, *z[0].shape)), y,
                     model="m0", mode="mc_dropout")
    cfg = EnsembleConfig(n_orders=2, n_repeats=2,
                         extra_methods={"mc_first_two": [Source(str(mc), 0), Source(str(mc), 1)]})
    ds = score_ensembles([tmp_path], cfg)
    assert list(ds["method"].values) == ["deep_ensemble", "deep_ensemble_tta", "single_tta",
                                         "mc_dropout", "mc_first_two"]
    assert ds["n_members"].values.tolist() == [3, 3, 3, 5, 2]
    assert ds["cll"].sizes["size"] == 5
    assert np.isnan(ds["cll"].sel({"method": "deep_ensemble"}).values[:, 3:]).all()
    dee = ds["dee"].sel({"method": "mc_dropout"}).values
    assert np.all((dee >= 1) & (dee <= 3))  # capped at the largest deep ensemble
    out = write_dataset(ds, tmp_path / "scores" / "ens.nc")
    back = xr.open_dataset(out)
    assert back["cll"].dims == ("method", "order", "size")
    back.close()


def test_misaligned_members_raise_before_scoring(tmp_path, write_cache):
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 40)
    write_cache(tmp_path, rng.normal(size=(40, 3)), y, model="m0")
    write_cache(tmp_path, rng.normal(size=(40, 4)), y, model="m1")
    with pytest.raises(CacheError, match="classes"):
        score_ensembles([tmp_path], EnsembleConfig(n_orders=2))


def test_bad_options(tmp_path, write_cache):
    rng = np.random.default_rng(4)
    write_cache(tmp_path, rng.normal(size=(30, 3)), rng.integers(0, 3, 30), model="m0")
    with pytest.raises(ValueError, match="unknown ensemble method 'swag'; valid ensemble "
                                         "methods: deep_ensemble, deep_ensemble_tta"):
        score_ensembles([tmp_path], EnsembleConfig(methods=("swag",)))
    with pytest.raises(ValueError, match="no plain cache for members"):
        score_ensembles([tmp_path], EnsembleConfig(members=["m0", "m9"]))
