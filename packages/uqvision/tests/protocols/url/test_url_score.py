"""The URL transfer protocol (V.4): retrieval conventions, the crop mode, scoring, the driver."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr
from torch.utils.data import DataLoader
from uqmetrics import nearest_neighbour_correct, r_auroc_score, recall_at_1_score

from uqvision.cache import cache_dataset, read_cache
from uqvision.cli import main
from uqvision.data import ImageFolderDataset, make_synthetic_folder
from uqvision.predict import PredictConfig, predict
from uqvision.protocols import VISION_PROTOCOLS
from uqvision.protocols.url.crop import CROP_RANGE, crop_fractions, crop_transform
from uqvision.protocols.url.score import (
    CONSTANT_U,
    rank_correlation,
    rank_correlations,
    score_transfer,
    select_configs,
    split_classes,
    split_downstream,
)


def test_recall_at_1_excludes_the_query_even_with_duplicates():
    e = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    # each sample's only identical embedding has the other class: the query itself would match
    assert recall_at_1_score(e, [0, 1, 1, 0]) == 0.0
    assert recall_at_1_score(e, [0, 0, 1, 1]) == 1.0


def test_error_indicator_u_scores_r_auroc_one():
    rng = np.random.default_rng(0)
    e, y = rng.normal(size=(200, 5)), rng.integers(0, 4, 200)
    wrong = ~nearest_neighbour_correct(e, y)
    assert 0 < wrong.mean() < 1
    assert r_auroc_score(e, y, wrong.astype(float)) == 1.0
    assert r_auroc_score(e, y, np.zeros(200)) == 0.5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_synthetic_folder(tmp_path_factory.mktemp("crop") / "syn", n_classes=2,
                                 n_per_class=4, image_size=24) / "test"


def test_crop_fractions_reproducible_and_batch_independent(folder):
    f = crop_fractions(7, range(8))
    assert ((f >= CROP_RANGE[0]) & (f <= CROP_RANGE[1])).all()
    np.testing.assert_array_equal(f, crop_fractions(7, range(8)))
    assert not np.allclose(f, crop_fractions(8, range(8)))
    np.testing.assert_array_equal(crop_fractions(7, [5, 2]), f[[5, 2]])
    import torchvision.transforms as T

    ds = ImageFolderDataset(folder, crop_transform(T.ToTensor()), augment_seed=7)
    one = torch.cat([x for x, *_ in DataLoader(ds, batch_size=1)])
    three = torch.cat([x for x, *_ in DataLoader(ds, batch_size=3)])
    torch.testing.assert_close(one, three, rtol=0, atol=0)
    plain = ImageFolderDataset(folder, T.ToTensor())
    assert not torch.equal(one, torch.stack([plain[i][0] for i in range(len(plain))]))


def test_crop_pass_mode_records_fractions(folder, rounding_tol):
    cfg = {"mode": "crop", "seed": 3, "allow_random_init": True}
    a = predict("test_resnet", folder, PredictConfig(batch_size=3, **cfg))[0]
    b = predict("test_resnet", folder, PredictConfig(batch_size=8, **cfg))[0]
    np.testing.assert_allclose(a["crop_fraction"], crop_fractions(3, range(a.sizes["sample"])),
                               rtol=1e-6)
    # batch 3 against 8: to float32 rounding (conftest._rounding_tol)
    np.testing.assert_allclose(a["logits"], b["logits"],
                               **rounding_tol("test_resnet", b["logits"].values))


def _caches(rng, n=40, c=4, d=6, u=None, bad_val=False, val_classes="v", u_test=None):
    """One run's caches: embeddings near their class centre, u given or random; ``bad_val``:
    validation embeddings in identical pairs of different classes (R@1 = 0). The validation
    caches' classes are named ``<val_classes>0`` ..., every other cache's ``c0`` ...;
    ``u_test`` replaces u on the downstream test caches."""
    out = {}
    for key in [("upstream", "test", "plain"), ("upstream", "test", "crop"),
                ("a", "val", "plain"), ("a", "test", "plain"), ("a", "test", "crop")]:
        y = np.arange(n) % c
        e = np.eye(c, d)[y] + 1.5 * rng.normal(size=(n, d))
        if bad_val and key[1] == "val":
            e = np.repeat(rng.normal(size=(n // 2, d)), 2, axis=0)
        uu = rng.normal(size=n) if u is None else u(e, y)
        if u_test is not None and key[0] == "a" and key[1] == "test":
            uu = u_test(e, y)
        prefix = val_classes if key[1] == "val" else "c"
        out[key] = cache_dataset(None, y, samples=[f"{i}" for i in range(n)],
                                 classes=[f"{prefix}{j}" for j in range(c)], embedding=e,
                                 uncertainty=uu, attrs={"model": "m", "dataset_name": key[0],
                                                        "mode": key[2], "pass_index": 0})
    return out


def test_score_transfer_control_row_and_selection():
    rng = np.random.default_rng(0)
    oracle = lambda e, y: (~nearest_neighbour_correct(e, y)).astype(float)
    runs = {("ce", 0, 0): _caches(rng), ("ce", 1, 0): _caches(rng, u=oracle),
            ("elk", 0, 0): _caches(rng), ("elk", 1, 0): _caches(rng, u=oracle, bad_val=True)}
    ds = score_transfer(runs, ["a"])
    assert list(ds["method"].values) == ["ce", "elk", CONSTANT_U]
    assert ds["r_auroc"].sel({"method": CONSTANT_U}).item() == 0.5
    assert ds["auroc"].sel({"method": CONSTANT_U}).item() == 0.5
    assert ds["selected_config"].values.tolist() == [1, 0, -1]  # elk's oracle fails R@1 >= 0.1
    assert ds["r_auroc"].sel({"method": "ce"}).item() == 1.0
    assert ds["all_val_recall_at_1"].sel({"method": "elk"}).values[1].item() == 0.0


def test_crop_fractions_are_uniform_on_urls_range():
    """URL (S.5): a centre crop to a fixed random fraction in [0.1, 0.75] of the short side,
    uniform: over n draws each quarter of the range holds n/4 within 4 binomial SEs."""
    assert CROP_RANGE == (0.1, 0.75)
    n = 4000
    f = crop_fractions(0, range(n))
    # the ends are reached: P(min - 0.1 > 0.65 t) = (1 - t)^n ~ exp(-n t) = exp(-10) at t = 10/n
    assert 0.1 <= f.min() < 0.1 + 0.65 * 10 / n and 0.75 - 0.65 * 10 / n < f.max() <= 0.75
    counts = np.histogram(f, bins=4, range=(0.1, 0.75))[0]
    assert np.all(np.abs(counts - n / 4) <= 4 * np.sqrt(n * 0.25 * 0.75))


def test_selection_keeps_configs_of_validation_recall_at_least_one_tenth():
    """URL's rule: configurations with a mean validation R@1 below 0.1 are filtered out,
    whatever their R-AUROC; 0.1 itself qualifies."""
    dims = ("method", "config", "dataset", "seed")
    rec = xr.DataArray(np.array([0.0999, 0.1]).reshape(1, 2, 1, 1), dims=dims)
    r_auroc = xr.DataArray(np.array([0.9, 0.6]).reshape(1, 2, 1, 1), dims=dims)
    assert select_configs(rec, r_auroc).values.tolist() == [1]
    assert select_configs(rec + 0.001, r_auroc).values.tolist() == [0]


def test_select_configs_none_qualifies():
    low = xr.DataArray(np.full((1, 2, 1, 1), 0.05), dims=("method", "config", "dataset", "seed"))
    assert select_configs(low, low).values.tolist() == [-1]
    # qualifying configs whose validation R-AUROC is undefined: the best validation R@1
    rec = xr.DataArray(np.array([0.9, 0.95]).reshape(1, 2, 1, 1), dims=low.dims)
    assert select_configs(rec, rec * np.nan).values.tolist() == [1]
    assert select_configs(rec, xr.DataArray(np.array([0.6, np.nan]).reshape(1, 2, 1, 1),
                                            dims=low.dims)).values.tolist() == [0]


# -- item: selection never sees the test classes ---------------------------------------------
def test_split_classes_disjoint_and_deterministic_by_seed():
    names = [f"k{i}" for i in range(12)]
    v, t = split_classes(names, names, seed=3)
    assert set(v).isdisjoint(t) and sorted(v + t) == sorted(names) and len(v) == len(t) == 6
    assert split_classes(names[::-1], names, seed=3) == (v, t)  # order of the folders: no matter
    assert split_classes(names, names, seed=3) == (v, t)
    assert split_classes(names, names, seed=4) != (v, t)
    # already disjoint splits (the official CUB/CARS/SOP ones) are kept as given
    assert split_classes(["b", "a"], ["c", "d"], seed=0) == (["a", "b"], ["c", "d"])
    with pytest.raises(ValueError, match="non-empty"):
        split_classes(["a"], ["a"], seed=0)


def test_split_downstream_views_hold_only_their_classes(tmp_path):
    from uqvision.protocols.url.score import TransferLayout

    root = tmp_path / "d"
    names = [f"k{i}" for i in range(6)]
    for sp in ("val", "test"):
        for c in names:
            (root / sp / c).mkdir(parents=True)
            (root / sp / c / f"{sp}.png").write_bytes(b"")
    layout = TransferLayout(tmp_path / "up", {"d": root})
    for seed in (0, 1, 0):  # a second split of the same folder removes the other's links
        got = split_downstream(layout, tmp_path / "split", seed)
        v, t = split_classes(names, names, seed)
        assert got.class_split == {"d": {"val": v, "test": t}}
        view = got.downstream["d"]
        assert sorted(p.name for p in (view / "val").iterdir()) == v
        assert sorted(p.name for p in (view / "test").iterdir()) == t
        assert (view / "val" / v[0] / "val.png").is_file()  # val classes from val/
        assert (view / "test" / t[0] / "test.png").is_file()  # test classes from test/


def test_selection_reads_only_validation_classes():
    """The selected configuration is a function of the validation caches alone: any u on the
    test caches leaves it (and every val_* metric) unchanged; validation caches that hold a
    test class are refused; the split is recorded in transfer.nc."""
    import json

    oracle = lambda e, y: (~nearest_neighbour_correct(e, y)).astype(float)

    def runs(test_u):
        rng = np.random.default_rng(0)
        return {("ce", 0, 0): _caches(rng, u_test=test_u[0]),
                ("ce", 1, 0): _caches(rng, u=oracle, u_test=test_u[1])}

    base = score_transfer(runs([None, None]), ["a"])
    flipped = score_transfer(runs([oracle, lambda e, y: -oracle(e, y)]), ["a"])
    assert base["selected_config"].values.tolist() == [1, -1]
    assert flipped["selected_config"].values.tolist() == [1, -1]
    for v in ("all_val_r_auroc", "all_val_recall_at_1"):
        xr.testing.assert_identical(base[v], flipped[v])
    assert flipped["all_r_auroc"].sel({"method": "ce"}).values.ravel().tolist() == [1.0, 0.0]
    assert json.loads(base.attrs["class_split"]) == {
        "a": {"val": [f"v{j}" for j in range(4)], "test": [f"c{j}" for j in range(4)]}}
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"validation caches of 'a' hold test classes"):
        score_transfer({("ce", 0, 0): _caches(rng, val_classes="c")}, ["a"])


# -- item: upstream crop consistency predicts the downstream R-AUROC (Fig. 4 right) ----------
def test_rank_correlation_known_values():
    rho, n = rank_correlation([1, 2, 3, 4, 5], [2, 1, 4, 3, 5])
    assert (rho, n) == (pytest.approx(1 - 6 * 4 / (5 * 24), abs=1e-14), 5)  # = 0.8, no ties
    # ties get average ranks: ranks (1, 2.5, 2.5, 4) vs (1, 3, 2, 4): rho = 4.5 / sqrt(4.5 * 5)
    assert rank_correlation([1, 2, 2, 3], [1, 3, 2, 4])[0] == pytest.approx(3 / np.sqrt(10),
                                                                            abs=1e-14)
    assert rank_correlation([1, 2, np.nan, 4, 5, 6], [2, 1, 9, 4, 3, 5]) == (
        pytest.approx(0.8, abs=1e-14), 5)  # a missing run is left out
    assert np.isnan(rank_correlation([1, 2], [2, 1])[0])
    assert np.isnan(rank_correlation([1, 1, 1], [1, 2, 3])[0])


def test_rank_correlations_of_constructed_runs():
    """Six runs (3 methods x 2 configs x 1 seed), one never made; the downstream R-AUROC is the
    mean over two datasets. Upstream crop consistency (1..5) against R-AUROC (2, 1, 4, 3, 5):
    rho = 0.8 over 5 runs; the upstream R-AUROC, its negative, gives -0.8."""
    x = np.array([1, 2, 3, 4, 5, np.nan]).reshape(3, 2, 1)
    y = np.array([2, 1, 4, 3, 5, np.nan]).reshape(3, 2, 1) / 10
    per_ds = np.stack([y + 0.01, y - 0.01], axis=2)  # (method, config, dataset, seed)
    run_dims, ds_dims = ("method", "config", "seed"), ("method", "config", "dataset", "seed")
    ds = xr.Dataset({"all_upstream_crop_consistency": (run_dims, x),
                     "all_upstream_r_auroc": (run_dims, -x),
                     "all_crop_consistency": (ds_dims, np.full_like(per_ds, 0.5)),
                     "all_recall_at_1": (ds_dims, per_ds * 2),
                     "all_r_auroc": (ds_dims, per_ds)},
                    coords={"method": ["a", "b", "c"], "config": [0, 1], "dataset": ["p", "q"],
                            "seed": [0]})
    got = rank_correlations(ds)
    rho = got["rank_correlation"].to_series().to_dict()
    assert rho["upstream_crop_consistency"] == pytest.approx(0.8, abs=1e-12)
    assert rho["upstream_r_auroc"] == pytest.approx(-0.8, abs=1e-12)
    assert rho["recall_at_1"] == pytest.approx(1.0, abs=1e-12)
    assert np.isnan(rho["crop_consistency"])  # constant
    assert got["rank_correlation_n"].values.tolist() == [5, 5, 5, 5]


@pytest.fixture(scope="module")
def url_run(smoke_run):
    """``reproduce url --scale smoke`` of ce and losspred (the protocol's smoke options) on the
    generated hierarchy."""
    return smoke_run("url")


def test_reproduce_url_smoke_and_cli_score(url_run, tmp_path):
    out, path = url_run
    ds = xr.open_dataset(path)
    for v in ("recall_at_1", "r_auroc", "crop_consistency", "human_alignment",
              "upstream_r_auroc", "auroc"):
        assert v in ds and f"{v}_mean" in ds
    assert ds["r_auroc"].sel({"method": CONSTANT_U}).values.ravel().tolist() == [0.5, 0.5]
    cache = read_cache(next((out / "caches").glob("*down_a-test.crop-000.nc")))
    # the crop fractions of the one predict path: drawn from the run's sample seed
    np.testing.assert_allclose(cache["crop_fraction"], crop_fractions(
        cache.attrs["sample_seed"], range(cache.sizes["sample"])), rtol=1e-6)
    assert {"embedding", "uncertainty"} <= set(cache.data_vars) and "logits" not in cache
    assert cache.attrs["method"] == "ce" or cache.attrs["method"] == "losspred"
    assert "logits" in read_cache(next((out / "caches").glob("*upstream-test.plain-000.nc")))
    # upstream crops: cached and scored per run, and their rank correlation reported
    up = read_cache(next((out / "caches").glob("*upstream-test.crop-000.nc")))
    np.testing.assert_allclose(up["crop_fraction"], crop_fractions(
        up.attrs["sample_seed"], range(up.sizes["sample"])), rtol=1e-6)
    crop = ds["upstream_crop_consistency"].sel({"method": ["ce", "losspred"]})
    assert np.isfinite(crop).all() and ((crop >= 0) & (crop <= 1)).all()
    assert ds["rank_correlation_n"].sel({"quantity": "upstream_crop_consistency"}) == 2
    # the class split: recorded, and every validation cache holds only validation classes
    import json

    split = json.loads(ds.attrs["class_split"])
    assert sorted(split) == ["down_a", "down_b"] and ds.attrs["class_split_seed"] == 0
    for name, s in split.items():
        assert set(s["val"]).isdisjoint(s["test"]) and s["val"] and s["test"]
        for sp in ("val", "test"):
            for p in (out / "caches").glob(f"*{name}-{sp}.plain-000.nc"):
                assert sorted(read_cache(p)["class"].values.tolist()) == s[sp], p.name
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "fig1_r_auroc.png", "fig2_r_auroc_vs_recall.png", "fig4_crop_vs_downstream.png",
        "fig4_upstream_vs_downstream.png"]
    assert main(["score", "url", "--caches", str(out / "caches"),
                 "--out", str(tmp_path / "t.nc")]) == 0
    again = xr.load_dataset(tmp_path / "t.nc")  # read and closed: the file is read again below
    xr.testing.assert_allclose(again["r_auroc"], ds["r_auroc"])
    xr.testing.assert_allclose(again["human_alignment"], ds["human_alignment"])
    xr.testing.assert_allclose(again["upstream_crop_consistency"],
                               ds["upstream_crop_consistency"])
    assert again.attrs["class_split"] == ds.attrs["class_split"]
    # the figures from the score file: uqvision plot --transfer, and as SVG for the report
    assert main(["plot", "--transfer", str(tmp_path / "t.nc"), "--out",
                 str(tmp_path / "figs")]) == 0
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == sorted(
        p.name for p in (out / "figures").iterdir())
    svg = VISION_PROTOCOLS.lookup("url").plots.draw_as(tmp_path / "t.nc", tmp_path / "svg")
    assert sorted(p.suffix for p in svg) == [".svg"] * 4


def test_real_folders_end_to_end_through_the_cli(url_run, tmp_path):
    """``uqvision reproduce url --upstream ROOT --downstream ROOT ROOT --arch NAME`` on plain
    ImageFolder trees (the smoke hierarchy's views copied as real folders, no symlinks, no
    classes.json): every method and dataset lands in transfer.nc; and it is the hierarchy
    run's code path: with the same backbone, its ce and losspred caches are bit-identical."""
    import shutil

    hier, _ = url_run
    roots = {}
    for name in ("upstream", "down_a", "down_b"):
        roots[name] = shutil.copytree(hier / "data" / "views" / name, tmp_path / "data" / name,
                                      symlinks=False)
    out = tmp_path / "real"
    assert main(["reproduce", "url", "--scale", "smoke", "--out", str(out), "--arch",
                 "test_resnet", "--upstream", str(roots["upstream"]), "--downstream",
                 str(roots["down_a"]), str(roots["down_b"]), "--set",
                 f"backbone={hier / 'backbone.safetensors'}"]) == 0
    ds = xr.open_dataset(out / "transfer.nc")
    from uqvision.protocols.url.methods import REPRESENTATION_METHODS

    assert list(ds["method"].values) == [*REPRESENTATION_METHODS, CONSTANT_U]
    assert list(ds["dataset"].values) == ["down_a", "down_b"]
    for v in ("recall_at_1", "r_auroc", "crop_consistency", "auroc"):
        assert np.isfinite(ds[v].sel({"method": list(REPRESENTATION_METHODS)})).all(), v
    assert np.isfinite(ds["upstream_r_auroc"].sel({"method": list(REPRESENTATION_METHODS)})
                       ).all()
    assert ds["human_alignment"].isnull().all()  # real folders here have no soft labels
    caches = sorted(p.name for p in (out / "caches").glob("*.nc"))
    assert len(caches) == len(REPRESENTATION_METHODS) * 8  # 2 up + 2 x (val, test, crop)
    for p in (hier / "caches").glob("*.nc"):
        if ".mixed-" in p.name:
            continue
        a, b = read_cache(p), read_cache(out / "caches" / p.name)
        for v in ("embedding", "uncertainty", "label", "crop_fraction", "logits"):
            if v in a:
                np.testing.assert_array_equal(a[v].values, b[v].values, err_msg=f"{p.name} {v}")


def test_reproduce_url_real_folder_flags(tmp_path, capsys):
    """--upstream ROOT --downstream ROOT [ROOT ...] are the url driver's real-folder options
    (its :attr:`~uqvision.protocols.Protocol.reproduce_flags`; the end-to-end run is
    test_real_folders_end_to_end_through_the_cli); half of them, or missing splits, is a clear
    error before anything runs."""
    from uqvision.cli import build_parser

    reproduce = next(a for a in build_parser()._actions if a.dest == "command").choices[
        "reproduce"]
    p = reproduce.parse_args(["url", "--out", "o", "--upstream", "u", "--downstream", "a", "b"])
    assert p.upstream == "u" and p.downstream == ["a", "b"]
    assert main(["reproduce", "url", "--out", str(tmp_path / "o"), "--upstream",
                 str(tmp_path)]) == 2
    assert "--downstream" in capsys.readouterr().err
    assert main(["reproduce", "url", "--out", str(tmp_path / "o"), "--upstream",
                 str(tmp_path), "--downstream", str(tmp_path / "a")]) == 2
    assert "lacks the split folders ['train', 'val', 'test']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # the url driver's options: not the others'
        main(["reproduce", "pitfalls", "--out", str(tmp_path / "o"), "--upstream", "u"])
    assert stop.value.code == 2 and "--upstream" in capsys.readouterr().err


def test_reproduce_url_resumes_and_never_reuses_what_other_inputs_made(tmp_path, monkeypatch,
                                                                       capsys):
    """A rerun of ``reproduce url`` trains and predicts nothing (its checkpoints match their
    configs, its caches their inputs); one with another class split is refused, naming the
    cache and what differs, and one with another seed names the stand-in it would have reused.
    Before, a cache file that existed was kept whatever it was computed from (its ``config``
    attr was the run's configuration index, so it had no identity to compare), a checkpoint
    whatever config trained it, and the stand-in whatever seed or scale made it."""
    import uqvision.protocols.url.reproduce as url

    args = ["reproduce", "url", "--scale", "smoke", "--out", str(tmp_path / "o"), "--set",
            "methods=ce"]
    assert main(args) == 0
    cache = read_cache(next((tmp_path / "o" / "caches").glob("*upstream-test.plain-000.nc")))
    assert cache.attrs["url_config"] == 0 and '"mode": "plain"' in cache.attrs["config"]
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "o" / "caches").glob("*.nc")}

    def trains(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(url, "train_model", trains)
    assert main(args) == 0  # resumed: nothing trained, no cache written again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    capsys.readouterr()
    assert main([*args, "--set", "split_seed=5"]) == 2
    err = capsys.readouterr().err
    assert "was computed from other inputs" in err and "down_a-val" in err, err
    assert main([*args, "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "holds the hierarchy set of scale 'smoke', seed 0" in err and "--overwrite" in err


def test_predict_refuses_attrs_that_would_replace_the_caches_own(spec, digits):
    """A protocol's bookkeeping (``predict(attrs=...)``) never replaces an attr the cache's
    identity is read from (URL's run index once replaced ``config``)."""
    cfg = PredictConfig(batch_size=32)
    with pytest.raises(ValueError, match=r"attrs \['config', 'seed'\] are the cache's own"):
        predict(spec, digits / "test", cfg, attrs={"config": 0, "seed": 1, "mine": 2})
    (ds,) = predict(spec, digits / "test", cfg, attrs={"mine": 2})
    assert ds.attrs["mine"] == 2 and '"batch_size": 32' in ds.attrs["config"]
