import numpy as np
import pytest
import xarray as xr
from uqmetrics import deep_ensemble_equivalent_curve, write_dataset

from uqvision.cache import CacheError
from uqvision.methods import GENERAL_METHODS, TRAINING_METHODS
from uqvision.protocols.pitfalls.score import (
    ENSEMBLE_METHODS,
    EnsembleConfig,
    Source,
    score_ensembles,
)

METRICS = ("accuracy", "nll", "brier", "ece", "cll", "calibrated_brier", "auroc", "aurc",
           "eaurc")
DE = "deep_ensemble"


#: Metrics that refit a temperature (test_cv) on every ensemble they score.
REFIT = ("cll", "calibrated_brier")
#: ``xatol`` (in log T) of uqmetrics.fit_temperature's bounded Brent search (its docstring).
TEMPERATURE_XATOL = 1e-6


def test_k_identical_members_score_like_one(tmp_path, write_cache, member_logits):
    from uqmetrics import calibration_splits, fit_temperature

    y, z = member_logits(np.random.default_rng(0), 200, 4, 1)
    for k in range(3):
        write_cache(tmp_path, z[0], y, model=f"m{k}", method=DE)
    n_orders, n_repeats = 3, 2
    ds = score_ensembles([tmp_path], EnsembleConfig(n_orders=n_orders, n_repeats=n_repeats))
    de = ds.sel({"method": DE})
    # An ensemble of k equal members has the member's log-probabilities up to float64 rounding
    # (a log-mean of k equal terms): the plain metrics agree to that rounding. The REFIT metrics
    # also refit the temperature on those log-probabilities, and the fit is only as exact as its
    # search: Brent stops within 2 (sqrt(eps) |log T| + xatol / 3) <= xatol of the minimiser
    # (|log T| < 5 here), and an ulp in the objective can move where it stops, so two fits
    # differ by up to 2 xatol in log T. At a fixed split, d/d(log T) of an example's NLL is
    # (E_p[z] - z_y) / T, of its Brier score at most 2 sum_j p_j |z_j - E_p[z]| / T: both are
    # bounded by 2 range(z_i) / T. Hence |change| <= 2 max range(z_i) / T_min * 2 xatol, T_min
    # the smallest temperature fitted on any calibration half (order o draws the halves with
    # seed o); ~3e-5 here, where a wrong ensemble moves these metrics by > 1e-3.
    t_min = min(fit_temperature(z[0][c], y[c])
                for o in range(n_orders)
                for c, _ in calibration_splits(y, protocol="test_cv", n_repeats=n_repeats, seed=o))
    refit_atol = 2 * np.ptp(z[0], axis=1).max() / t_min * 2 * TEMPERATURE_XATOL
    for name in METRICS:
        v = de[name].values  # (order, size): the same across sizes within an order
        tol = {"rtol": 0, "atol": refit_atol} if name in REFIT else {"rtol": 1e-10,
                                                                      "atol": 1e-12}
        np.testing.assert_allclose(v, np.broadcast_to(v[:, :1], v.shape), err_msg=name, **tol)
    assert list(ds["method"].values) == [DE]  # no TTA / MC caches here


def test_dee_of_the_deep_ensemble_against_itself_is_its_size(tmp_path, write_cache,
                                                               member_logits):
    """Issue 10, item 6: on the CLL, and on every other DEE metric whose mean curve rises."""
    y, z = member_logits(np.random.default_rng(1), 600, 5, 4, signal=1.0, noise=2.0)
    for k in range(4):
        write_cache(tmp_path, z[k], y, model=f"m{k}", method=DE)
    ds = score_ensembles([tmp_path], EnsembleConfig(n_orders=5, n_repeats=2))
    de = ds.sel({"method": DE})
    mean = de["cll"].mean("order").values
    assert np.all(np.diff(mean) > 0)  # the premise: more members, better CLL
    np.testing.assert_allclose(de["dee"].values, [1, 2, 3, 4], rtol=0, atol=1e-9)
    assert ds.attrs["dee_cap"] == 4 and not de["dee_capped"].values.any()
    for metric in ("calibrated_brier", "nll"):
        curve = de[metric].mean("order").values
        assert np.all(np.diff(curve) < 0), metric  # losses fall with each member
        np.testing.assert_allclose(de["equivalent"].sel(reference=DE, dee_metric=metric),
                                   [1, 2, 3, 4], atol=1e-9)
    # S.3 bounds: the sample std over orders, each order with its own test-CV halves, so the
    # bound keeps a width at the full size (ddof = 0 over fixed halves: zero width there)
    assert de["dee_lower"].values[-1] < 4
    ref = deep_ensemble_equivalent_curve(de["cll"].values, de["cll"].values)
    np.testing.assert_allclose(de["dee_upper"].values, ref.upper)
    assert "ddof=1" in ds.attrs["dee_bounds"]
    assert np.ptp(de["nll"].values[:, -1]) < 1e-12  # the orders agree at full size


def _tta_caches(tmp_path, write_cache, rng, y, z, method, draws):
    """Plain and TTA caches of the members of one method (TTA: ``draws`` passes each)."""
    for k, zk in enumerate(z):
        write_cache(tmp_path, zk, y, model=f"{method}{k}", method=method)
        for d in range(draws):
            write_cache(tmp_path, zk + rng.normal(size=zk.shape), y, model=f"{method}{k}",
                        method=method, mode="tta", pass_index=d)


def test_caches_group_by_their_method_attr(tmp_path, write_cache, member_logits):
    rng = np.random.default_rng(2)
    y, z = member_logits(rng, 300, 5, 5, signal=1.0, noise=2.0)
    _tta_caches(tmp_path, write_cache, rng, y, z[:3], DE, 2)
    for k in range(2):  # two snapshots of one SSE run: one member each
        write_cache(tmp_path, z[3 + k], y, model=f"sse_s0:{k:03d}", method="sse", run="sse_s0",
                    sample_index=k)
    write_cache(tmp_path, z[0] + 0.3 * rng.normal(size=z[0].shape), y, model="foreign")
    mc = write_cache(tmp_path, z[0][None] + 0.3 * rng.normal(size=(5, *z[0].shape)), y,
                     model=f"{DE}0", mode="mc_dropout", method="mc_dropout")
    cfg = EnsembleConfig(n_orders=2, n_repeats=2,
                         extra_methods={"mc_first_two": [Source(str(mc), 0), Source(str(mc), 1)]})
    ds = score_ensembles([tmp_path], cfg)
    names = list(ds["method"].values)
    assert names == [DE, DE + "_tta", "mc_dropout", "sse", "single_tta", "mc_first_two"]
    assert ds["n_members"].values.tolist() == [3, 3, 5, 2, 2, 2]
    assert ds["n_draws"].values.tolist() == [1, 2, 1, 1, 1, 1]
    assert ds["tta"].values.tolist() == [False, True, False, False, True, False]
    assert ds["training_method"].sel({"method": "sse"}) == "sse"
    # the untagged model joined nothing; the SSE run's two snapshots are its two members
    sources = __import__("json").loads(ds.attrs["sources"])
    assert not any("foreign" in s["path"] for g in sources.values() for m in g for s in m)
    assert [m[0]["path"].endswith(f"sse_s0+{k:03d}.test.plain-000.nc")
            for k, m in enumerate(sources["sse"])] == [True, True]
    assert np.isnan(ds["cll"].sel({"method": DE}).values[:, 3:]).all()
    dee = ds["dee"].sel({"method": "mc_dropout"}).values
    assert np.all((dee >= 1) & (dee <= 3))  # capped at the largest deep ensemble
    # TTA groups also against the deep ensemble with TTA; plain ones only against the plain DE
    eq = ds["equivalent"].sel(dee_metric="cll")
    assert np.isfinite(eq.sel({"reference": DE + "_tta", "method": DE + "_tta"})[:3]).all()
    assert np.isnan(eq.sel({"reference": DE + "_tta", "method": "sse"})).all()
    np.testing.assert_allclose(eq.sel({"reference": DE + "_tta", "method": DE + "_tta"})[:3],
                               [1, 2, 3], atol=1e-9)
    out = write_dataset(ds, tmp_path / "scores" / "ens.nc")
    back = xr.open_dataset(out)
    assert back["cll"].dims == ("method", "order", "size")
    assert back["equivalent"].dims == ("reference", "dee_metric", "method", "size")
    back.close()


def test_tta_orders_redraw_every_members_augmentation(tmp_path, write_cache, member_logits):
    """Order o of a TTA group applies member j to its draw o mod n_draws: at full size the
    ensemble is that draw of every member."""
    from uqmetrics import ensemble_probs, log_softmax, nll_loss

    from uqvision.cache import read_cache

    rng = np.random.default_rng(5)
    y, z = member_logits(rng, 200, 4, 2)
    _tta_caches(tmp_path, write_cache, rng, y, z, DE, 3)
    ds = score_ensembles([tmp_path], EnsembleConfig(n_orders=4, n_repeats=2,
                                                    methods=(DE + "_tta",)))
    nll = ds["nll"].sel({"method": DE + "_tta"}).values[:, -1]
    for o in range(4):
        lp = [log_softmax(read_cache(tmp_path / f"{DE}{k}.test.tta-{o % 3:03d}.nc")
                          ["logits"].values) for k in range(2)]
        assert nll[o] == pytest.approx(nll_loss(y, ensemble_probs(np.stack(lp))), rel=1e-6)
    assert nll[0] == pytest.approx(nll[3], rel=1e-12) and abs(nll[1] - nll[0]) > 1e-6
    assert ds["n_draws"].sel({"method": DE + "_tta"}) == 3


def test_members_option_names_untagged_models_as_the_deep_ensemble(tmp_path, write_cache,
                                                                    member_logits):
    y, z = member_logits(np.random.default_rng(6), 100, 3, 2)
    for k in range(2):
        write_cache(tmp_path, z[k], y, model=f"zoo{k}")
    with pytest.raises(ValueError, match="reference method 'deep_ensemble' has no caches"):
        score_ensembles([tmp_path], EnsembleConfig(n_orders=2, n_repeats=2))
    ds = score_ensembles([tmp_path], EnsembleConfig(members=["zoo1", "zoo0"], n_orders=2,
                                                    n_repeats=2))
    assert ds["n_members"].sel({"method": DE}) == 2


def test_misaligned_members_raise_before_scoring(tmp_path, write_cache):
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 40)
    write_cache(tmp_path, rng.normal(size=(40, 3)), y, model="m0", method=DE)
    write_cache(tmp_path, rng.normal(size=(40, 4)), y, model="m1", method=DE)
    with pytest.raises(CacheError, match="classes"):
        score_ensembles([tmp_path], EnsembleConfig(n_orders=2))


def test_registry_has_a_plain_and_a_tta_group_per_pitfalls_method_only():
    for m in ("deep_ensemble", "sse", "kfac_laplace"):
        assert m in ENSEMBLE_METHODS and m + "_tta" in ENSEMBLE_METHODS
    groups = {m.removesuffix("_tta") for m in ENSEMBLE_METHODS.names()} - {"single"}
    assert groups == set(GENERAL_METHODS) < set(TRAINING_METHODS.names())
    # the UIMNET algorithms and URL learners are other protocols' methods, not V.2's
    assert not {"erm", "mixup", "due", "ce", "elk", "losspred"} & set(ENSEMBLE_METHODS.names())


def test_bad_options(tmp_path, write_cache):
    rng = np.random.default_rng(4)
    write_cache(tmp_path, rng.normal(size=(30, 3)), rng.integers(0, 3, 30), model="m0",
                method=DE)
    with pytest.raises(ValueError, match="unknown ensemble method 'swa'; valid ensemble "
                                         "methods: deep_ensemble, deep_ensemble_tta"):
        score_ensembles([tmp_path], EnsembleConfig(methods=("swa",)))
    with pytest.raises(ValueError, match="no plain cache for members"):
        score_ensembles([tmp_path], EnsembleConfig(members=["m0", "m9"]))
    with pytest.raises(ValueError, match="not a curve metric"):
        score_ensembles([tmp_path], EnsembleConfig(dee_metrics=("cll", "temperature")))


@pytest.mark.parametrize("method", ["sse", "fge", "csgld"])
def test_snapshot_curves_follow_training_order(tmp_path, write_cache, member_logits, method):
    """Snapshots of one trajectory are not exchangeable: the size-k ensemble of order o is
    snapshots 0..k-1 of run o mod n_runs (Pitfalls' code); deep-ensemble members keep random
    orders. Exact: each order's NLL against the first-k ensemble computed here."""
    from uqmetrics import ensemble_probs, log_softmax, nll_loss

    rng = np.random.default_rng(7)
    y, z = member_logits(rng, 200, 4, 10, signal=1.0, noise=2.0)
    for k in range(4):
        write_cache(tmp_path, z[k], y, model=f"de{k}", method=DE)
    runs = {"r0": z[4:7], "r1": z[7:10]}
    for r, snaps in runs.items():
        for j, zj in enumerate(snaps):
            write_cache(tmp_path, zj, y, model=f"{r}:{j:03d}", method=method, run=r,
                        sample_index=j)
    n_orders = 4
    ds = score_ensembles([tmp_path], EnsembleConfig(n_orders=n_orders, n_repeats=2))
    nll = ds["nll"].sel({"method": method}).values
    assert nll.shape == (n_orders, 4)
    assert np.isnan(nll[:, 3:]).all()  # sizes up to one run's snapshot count
    for o in range(n_orders):
        snaps = runs[("r0", "r1")[o % 2]]
        for k in range(1, 4):
            first_k = np.stack([log_softmax(s) for s in snaps[:k]])
            assert nll[o, k - 1] == pytest.approx(nll_loss(y, ensemble_probs(first_k)),
                                                  rel=1e-6), (o, k)
    # exchangeable members: random orders (the size-1 member differs across orders)
    de1 = ds["nll"].sel({"method": DE}).values[:, 0]
    assert np.ptp(de1) > 1e-6
