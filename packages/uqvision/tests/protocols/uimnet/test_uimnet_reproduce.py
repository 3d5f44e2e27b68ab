"""``uqvision reproduce uimnet`` at the smoke scale: split, runs, ensembles, ood.nc (V.3)."""

import json
import os

import numpy as np
import pytest
import xarray as xr
from uqmetrics import InputError, read_dataset, write_dataset

from uqvision.cli import main
from uqvision.data import read_index_file
from uqvision.models import read_sidecar
from uqvision.protocols import VISION_PROTOCOLS
from uqvision.protocols.uimnet.measures import GMM_COVARIANCE, GMM_TRAIN_FITS, MEASURES
from uqvision.protocols.uimnet.reproduce import UIMNET_SCALES
from uqvision.protocols.uimnet.score import IN_DOMAIN_METRICS, OUT_DOMAIN_METRICS, score_ood
from uqvision.protocols.uimnet.split import read_split

pytestmark = pytest.mark.slow

#: the smoke scale cut to two algorithms (every algorithm trains in test_uimnet_methods); the
#: full smoke run is ``uqvision reproduce uimnet --scale smoke``
OPTIONS = dict(VISION_PROTOCOLS.lookup("uimnet").smoke_options)


@pytest.fixture(scope="module")
def uimnet(smoke_run):
    return smoke_run("uimnet")


def test_split_and_index_files(uimnet):
    out, _ = uimnet
    split = read_split(out / "split.json")
    ins, outs = split["in_classes"], split["out_classes"]
    assert len(ins) == len(outs) > 0 and not set(ins) & set(outs)
    assert (out / "caches" / "extractor.train.plain-000.nc").exists()
    for seed in (0, 1):
        tr = read_index_file(out / "index" / f"seed{seed}.train.json")
        va = read_index_file(out / "index" / f"seed{seed}.val.json")
        assert not set(tr["indices"]) & set(va["indices"]) and tr["classes"] == ins
    # the CLI recomputes the same split from the cached embeddings
    assert main(["split", "--embeddings", str(out / "caches" / "extractor.train.plain-000.nc"),
                 "--out", str(out / "again.json")]) == 0
    assert read_split(out / "again.json")["in_classes"] == ins
    # the model-size ablation changes the runs' width, not the extractor's (nor the split)
    width = {name: read_sidecar(out / "checkpoints" / f"{name}.safetensors")["model_kwargs"]
             ["width"] for name in ("extractor", "erm.sn0.t0.s0")}
    assert width == {"extractor": 8, "erm.sn0.t0.s0": 6}


def test_trials_selection_jacobian_subset_and_oracle_images(uimnet):
    """A trial is one configuration on every data seed; an ensemble of K holds the same trials
    on every seed (top K by validation NLL averaged over seeds); the Jacobian's images of a set
    are a stratified subset; the oracle never trains on in-domain validation images."""
    out, _ = uimnet
    ckpt = out / "checkpoints"
    for alg in ("erm", "mc_dropout"):
        hp = [read_sidecar(ckpt / f"{alg}.sn0.t1.s{s}.safetensors")["hparams"] for s in (0, 1)]
        assert hp[0] == hp[1]
    for alg in ("erm", "mc_dropout"):
        for sp in (0, 1):
            for k in (1, 5):
                cells = [read_dataset(out / "caches" / "ensembles" / f"{alg}.sn{sp}.s{s}.k{k}.nc")
                         for s in (0, 1)]
                chosen = [json.loads(c.attrs["selection"])["trials"] for c in cells]
                assert chosen[0] == chosen[1] and len(chosen[0]) == min(k, 2)
                for s, cell in zip((0, 1), cells, strict=True):
                    members = json.loads(cell.attrs["members"])
                    assert sorted(int(m.rsplit(".t", 1)[1].split(".")[0]) for m in members) \
                        == sorted(chosen[0])
                    assert all(m.endswith(f".s{s}.nc") for m in members)
                    run = read_dataset(members[0])
                    for split in ("in_val", "in_test", "out_test"):
                        y = run[f"{split}_label"].values
                        keep = cell[f"{split}_jindex"].values
                        assert keep.size == min(8, y.size) == cell.sizes[f"{split}_jsample"]
                        counts = np.bincount(y[keep], minlength=y.max() + 1)
                        share = np.bincount(y) * keep.size / y.size
                        assert np.all(np.abs(counts - share) <= 1)
    # the training-split GMM fits (Ledoit-Wolf, the default, and the official one) are fitted
    # on each run's in-domain training split (not validation), each variable's estimator
    # recorded
    for s in (0, 1):
        n_train = len(read_index_file(out / "index" / f"seed{s}.train.json")["samples"])
        for alg in ("erm", "mc_dropout"):
            run = read_dataset(out / "caches" / "runs" / f"{alg}.sn0.t0.s{s}.nc")
            fit = json.loads(run.attrs["uimnet"])["gmm_train"]
            assert fit == {"index_file": f"seed{s}.train.json", "n_fit": n_train,
                           "covariance": {"gmm_train_ledoit_wolf":
                                          GMM_COVARIANCE["train-ledoit-wolf"],
                                          "gmm_train": GMM_COVARIANCE["official"]}}
            assert all(np.isfinite(run[f"{x}_{field}"]).all()
                       for x in ("in_val", "in_test", "out_test")
                       for field in ("gmm_train", "gmm_train_ledoit_wolf"))
            assert not np.allclose(run["in_val_gmm_train"], run["in_val_gmm_train_ledoit_wolf"])
    for s in (0, 1):
        side = read_sidecar(ckpt / f"oracle.s{s}.safetensors")
        assert side["train_config"]["index_file"].endswith(f"seed{s}.oracle.json")
        used = set(read_index_file(side["train_config"]["index_file"])["samples"])
        val = set(read_index_file(out / "index" / f"seed{s}.val.json")["samples"])
        assert val and not used & val


def test_ood_nc_has_every_metric_over_its_dims(uimnet):
    out, path = uimnet
    ds = read_dataset(path)
    assert ds.algorithm.values.tolist() == ["erm", "mc_dropout"]
    assert ds.measure.values.tolist() == MEASURES.names()
    for name in IN_DOMAIN_METRICS:
        assert ds[name].dims == ("algorithm", "k", "calibration", "spectral", "stat")
    for name in OUT_DOMAIN_METRICS:
        assert ds[name].dims == ("algorithm", "measure", "k", "calibration", "spectral", "stat")
        assert np.isfinite(ds[f"oracle_{name}"].sel(stat="mean"))
    assert ds.spectral.values.tolist() == [False, True]  # the ablation, through the driver
    assert ds.attrs["device"] == "cpu" and json.loads(ds.attrs["scale"])["width"] == 6
    # the training-split Ledoit-Wolf GMM fit by default; the stand-in's TTA policy, resolved
    # and recorded
    assert ds.attrs["gmm_fit"] == "train-ledoit-wolf"
    assert json.loads(ds.attrs["scale"])["gmm_fit"] == "train-ledoit-wolf"
    assert ds.attrs["gmm_covariance"] == GMM_COVARIANCE["train-ledoit-wolf"]
    assert json.loads(ds.attrs["tta_policy"]) == ["uimnet_standin x 1"]
    assert json.loads(ds.attrs["scale"])["tta_policy"] == "uimnet_standin"
    mean = ds.sel(stat="mean")
    assert np.isfinite(mean["acc1"]).all() and np.isfinite(mean["auc"].sel(measure="entropy")).all()
    # UIMNET's Jacobian: single non-MC-dropout networks only; the softmax variant everywhere
    jac = mean["auc"].sel(measure="jacobian")
    assert np.isfinite(jac.sel(algorithm="erm", k=1)).all()
    assert np.isnan(jac.sel(algorithm="erm", k=5)).all()  # an ensemble (2 members)
    assert np.isnan(jac.sel(algorithm="mc_dropout")).all()
    assert np.isfinite(mean["auc"].sel(measure="jacobian_softmax")).all()
    assert np.isfinite(mean["auc"].sel(measure="gmm")).all()
    # temperature scaling never changes top-1 accuracy
    xr.testing.assert_allclose(mean["acc1"].sel(calibration="none", drop=True),
                               mean["acc1"].sel(calibration="temperature", drop=True))
    # ERM single networks have no native measure; ensembles and MC dropout do
    assert np.isnan(mean["auc"].sel(algorithm="erm", measure="native", k=1)).all()
    assert np.isfinite(mean["auc"].sel(algorithm="mc_dropout", measure="native", k=1)).all()
    assert (out / "tables.md").read_text().count("| erm |") >= 8


def test_out_as_out_counts_out_domain_images(uimnet):
    """Recompute entropy, θ and OutAsOut by hand from one ensemble cell's run caches."""
    out, path = uimnet
    ds = read_dataset(path)
    values = []
    for seed in (0, 1):
        cell = read_dataset(out / "caches" / "ensembles" / f"erm.sn0.s{seed}.k1.nc")
        run = read_dataset(json.loads(cell.attrs["members"])[0])

        def entropy(split, run=run):
            z = run[f"{split}_logits"].values.astype(np.float64)
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            return -(p * np.log(np.where(p > 0, p, 1))).sum(1)

        theta = np.quantile(entropy("in_val"), 0.95)
        values.append(np.mean(entropy("out_test") > theta))
    got = ds["out_as_out"].sel(algorithm="erm", measure="entropy", k=1, calibration="none",
                               spectral=False, stat="mean")
    assert float(got) == pytest.approx(np.mean(values), abs=1e-12)


def test_rerun_resumes_and_the_score_command_agrees(uimnet, tmp_path):
    out, path = uimnet
    runs = sorted((out / "caches" / "runs").glob("*.nc"))
    stamps = [os.stat(p).st_mtime_ns for p in runs]
    VISION_PROTOCOLS.lookup("uimnet").reproduce.run(out, scale="smoke", options=OPTIONS, log=lambda *a: None)
    assert [os.stat(p).st_mtime_ns for p in runs] == stamps  # nothing retrained
    assert main(["score", "uimnet", "--caches", str(out / "caches"), "--out",
                 str(tmp_path / "ood.nc")]) == 0
    again = read_dataset(tmp_path / "ood.nc")
    first = read_dataset(path)
    for name in ("acc1", "nll", "auc", "out_as_out"):
        xr.testing.assert_allclose(again[name], first[name])
    # the other GMM fits, by the score command's option: only the gmm row moves
    assert again.attrs["gmm_fit"] == "train-ledoit-wolf"
    for fit in ("official", "validation-ledoit-wolf"):
        assert main(["score", "uimnet", "--caches", str(out / "caches"), "--out",
                     str(tmp_path / f"{fit}.nc"), "--gmm-fit", fit]) == 0
        other = read_dataset(tmp_path / f"{fit}.nc")
        assert other.attrs["gmm_fit"] == fit
        xr.testing.assert_allclose(other["auc"].drop_sel(measure="gmm"),
                                   first["auc"].drop_sel(measure="gmm"))
        assert not np.allclose(other["auc"].sel(measure="gmm"), first["auc"].sel(measure="gmm"))
    with pytest.raises(ValueError, match="no ensemble cell"):
        score_ood(tmp_path)


def test_a_rerun_with_another_extractor_is_refused_before_any_work(uimnet):
    """The class split (and every run on it) comes from the feature extractor: a rerun into
    the same --out whose extractor would be another (here more epochs) is refused, naming the
    split file, before anything is trained or written. Before, split.json was reused whatever
    extractor the options asked for, and the extractor checkpoint whatever config made it."""
    out, _ = uimnet
    files = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    epochs = int(OPTIONS.get("extractor_epochs", UIMNET_SCALES["smoke"].extractor_epochs))
    with pytest.raises(InputError, match=r"split\.json.* feature extractor .* --overwrite"):
        VISION_PROTOCOLS.lookup("uimnet").reproduce.run(
            out, scale="smoke", options={**OPTIONS, "extractor_epochs": str(epochs + 1)},
            log=lambda *a: None)
    assert {p: p.stat().st_mtime_ns for p in files} == files


def test_the_default_gmm_is_ledoit_wolf_of_the_runs_training_features(uimnet):
    """A run cache's <set>_gmm_train_ledoit_wolf, recomputed here: the run's network (from its
    checkpoint, evaluation transform, one thread as in the run cell) on its data seed's
    in-domain training split, per class sklearn's LedoitWolf plus the floor of 1e-6 x the
    mean feature variance, -log sum_c lambda_c N(phi; mu_c, Sigma_c) on the cached
    features. Same float32 features and float64 arithmetic: agreement to rounding."""
    import torch
    from scipy.special import logsumexp
    from scipy.stats import multivariate_normal
    from sklearn.covariance import LedoitWolf

    from uqvision.models import ModelSpec
    from uqvision.protocols.uimnet import reproduce
    from uqvision.training.runs import load_run

    out, _ = uimnet
    run = read_dataset(out / "caches" / "runs" / "erm.sn0.t0.s0.nc")
    cfg = json.loads(run.attrs["uimnet"])
    ckpt = run.attrs["checkpoint"]
    net = load_run(ModelSpec(cfg["arch"], ckpt), num_classes=run.sizes["class"],
                   device="cpu").loaded.model.eval()
    plain, _ = reproduce._eval_transforms(read_sidecar(ckpt), 0, 0)
    view, index = reproduce._gmm_fit_view(str(out / "data"), str(out / "split.json"), 0, plain)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        feats = reproduce._outputs(lambda x, ids: reproduce._features(net, x), view,
                                   batch_size=256, device="cpu").numpy().astype(np.float32)
    finally:
        torch.set_num_threads(previous)
    assert index.name == cfg["gmm_train"]["index_file"] and len(feats) == cfg["gmm_train"]["n_fit"]
    train, y = feats.astype(np.float64), np.asarray(view.targets)
    d = train.shape[1]
    assert np.bincount(y).max() < d  # n_c < d: the sample covariance is singular here
    floor = 1e-6 * train.var(axis=0).mean()
    for split in ("in_val", "out_test"):
        x = run[f"{split}_features"].values.astype(np.float64)
        terms = [np.log((y == c).mean()) + multivariate_normal(
            train[y == c].mean(0), LedoitWolf().fit(train[y == c]).covariance_
            + floor * np.eye(d)).logpdf(x) for c in np.unique(y)]
        np.testing.assert_allclose(run[f"{split}_gmm_train_ledoit_wolf"].values,
                                   -logsumexp(terms, axis=0), rtol=1e-9)


def test_a_rerun_on_run_caches_of_the_former_default_refuses_before_training(uimnet, tmp_path):
    """Run caches written while 'official' was the default hold <set>_gmm_train only: a rerun
    under the new default refuses them before anything trains, naming the file, the missing
    variable and the remedies; no cell, checkpoint or score file is rewritten (the former
    ood.nc is not replaced by one that mixes fits)."""
    import shutil

    src, _ = uimnet
    out = tmp_path / "uimnet"
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("again.json"))
    runs = sorted((out / "caches" / "runs").glob("*.sn*.nc"))
    for p in runs:  # the layout of the former default: no Ledoit-Wolf training-split values
        ds = read_dataset(p)
        ds = ds.drop_vars([f"{s}_gmm_train_ledoit_wolf" for s in ("in_val", "in_test",
                                                                  "out_test")], errors="ignore")
        ds.attrs["uimnet"] = json.dumps({k: v for k, v in json.loads(ds.attrs["uimnet"]).items()
                                         if k != "gmm_train"})
        write_dataset(ds, p, overwrite=True)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    stamps = {p: os.stat(p).st_mtime_ns for p in files}
    with pytest.raises(ValueError, match=r"run cache .*\.nc' has no "
                                         r"'in_val_gmm_train_ledoit_wolf'.*--overwrite.*"
                                         r"\['official', 'validation-ledoit-wolf'\]"):
        VISION_PROTOCOLS.lookup("uimnet").reproduce.run(out, scale="smoke", options=OPTIONS,
                                                        log=lambda *a: None)
    assert sorted(p for p in out.rglob("*") if p.is_file()) == files
    assert {p: os.stat(p).st_mtime_ns for p in files} == stamps
    # the fit they hold, asked for by name, scores them (members pointed at the copies)
    for p in (out / "caches" / "ensembles").glob("*.nc"):
        ens = read_dataset(p)
        ens.attrs["members"] = json.dumps([str(out / "caches" / "runs" / os.path.basename(m))
                                           for m in json.loads(ens.attrs["members"])])
        write_dataset(ens, p, overwrite=True)
    path = VISION_PROTOCOLS.lookup("uimnet").reproduce.run(
        out, scale="smoke", options={**OPTIONS, "gmm_fit": "official"}, log=lambda *a: None)
    ds, first = read_dataset(path), read_dataset(src / "ood.nc")
    assert ds.attrs["gmm_fit"] == "official" and set(GMM_TRAIN_FITS) == {"official",
                                                                       "train-ledoit-wolf"}
    xr.testing.assert_allclose(ds["auc"], score_ood(src / "caches", ks=(1, 5),
                                                    gmm_fit="official")["auc"])
    xr.testing.assert_allclose(ds["auc"].drop_sel(measure="gmm"),
                               first["auc"].drop_sel(measure="gmm"))


def test_a_real_image_folder_with_a_timm_architecture(tmp_path):
    """``--data ROOT --arch NAME``: the same chain on an image folder given by path (train/ and
    test/ class folders; nothing else of it is read) with a timm architecture; every network is
    that architecture, trained on views of ROOT/train."""
    from uqvision.hierarchy import make_hierarchy

    root = make_hierarchy(tmp_path / "images", scale="smoke", seed=3)
    out = tmp_path / "out"
    assert main(["reproduce", "uimnet", "--scale", "smoke", "--out", str(out), "--data",
                 str(root), "--arch", "test_byobnet", "--set", "algorithms=erm,due",
                 "--set", "trials=1", "--set", "ks=1", "--set", "tta=1", "--set",
                 "jacobian_max=4", "--set", "extractor_epochs=1", "--set", "data_seeds=1"]) == 0
    split = read_split(out / "split.json")
    assert len(split["in_classes"]) == len(split["out_classes"]) > 0
    assert set(split["in_classes"]) | set(split["out_classes"]) <= {
        p.name for p in (root / "train").iterdir()}
    ds = read_dataset(out / "ood.nc")
    assert sorted(ds.algorithm.values.tolist()) == ["due", "erm"]
    assert np.isfinite(ds["acc1"].sel(stat="mean")).all()
    checkpoints = sorted((out / "checkpoints").glob("*.safetensors"))
    assert len(checkpoints) == 1 + 2 * 1 + 1  # extractor, 2 algorithms x 1 data seed, 1 oracle
    for ckpt in checkpoints:
        side = read_sidecar(ckpt)
        assert side["architecture"] == "test_byobnet"
        assert side["dataset"] == str((root / "train").resolve())
    run = read_sidecar(out / "checkpoints" / "due.sn0.t0.s0.safetensors")
    assert run["classes"] == split["in_classes"]
    assert run["train_config"]["index_file"].endswith("seed0.train.json")


def test_the_split_does_not_depend_on_the_thread_count(tmp_path):
    """The extractor trains on one CPU thread whatever ``--threads`` (as every run cell): a
    network trained with 2 threads rounds its reductions otherwise (at the smoke scale its
    checkpoint differs from the 1-thread one), and at the cpu scale the Ward tree's top
    split followed (6/6 classes with 1 thread, 18/18 with 2)."""
    import torch

    from uqvision.hierarchy import make_hierarchy
    from uqvision.protocols.uimnet import reproduce

    root = make_hierarchy(tmp_path / "data", scale="smoke", seed=0)
    sc = reproduce._scale("smoke", OPTIONS)
    train = reproduce._paths(root)["train"]
    previous = torch.get_num_threads()
    digests = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = tmp_path / f"threads{threads}"
            reproduce._extractor(out, train, sc, None, 0, "cpu", lambda *a: None)
            assert torch.get_num_threads() == threads  # the caller's count is restored
            digests[threads] = (out / "checkpoints" / "extractor.safetensors").read_bytes()
    finally:
        torch.set_num_threads(previous)
    assert digests[1] == digests[2]
