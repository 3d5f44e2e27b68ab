"""The OOD protocol's scores (uqvision.protocols.ood.score) on synthetic caches, each value
checked against a direct uqmetrics call on the same arrays; refusals; the smoke run's file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import uqmetrics
from uqmetrics import InputError, write_dataset
from uqmetrics.detectors import get_detector, list_detectors
from uqmetrics.registry import get_metric

from uqvision.cache import cache_dataset, cache_key
from uqvision.protocols.ood.score import OOD_METRICS, OodConfig, score_ood

CLASSES = ["a", "b", "c"]
FEATURES = 4
#: dataset -> (role, ood_split, n images, mean shift of the features)
SETS = {"test": ("clean", "", 12, 0.0), "fit": ("clean", "", 15, 0.0),
        "near1": ("ood", "near", 9, 1.0), "far1": ("ood", "far", 10, 3.0),
        "far2": ("ood", "far", 8, 4.0)}
#: model -> seed of its head and features
MODELS = {"m1": 1, "m2": 2}


def _arrays(model: str, dataset: str):
    """``(labels, embedding, head_weight, head_bias)`` of one model on one dataset."""
    seed = MODELS[model]
    role, _, n, shift = SETS[dataset]
    rng = np.random.default_rng([seed, list(SETS).index(dataset)])
    w = np.random.default_rng(seed).normal(size=(len(CLASSES), FEATURES))
    b = np.random.default_rng(seed + 10).normal(size=len(CLASSES))
    labels = np.arange(n) % len(CLASSES) if role == "clean" else np.full(n, -1)
    centre = 2.0 * w[np.maximum(labels, 0)] * (labels >= 0)[:, None]
    emb = centre + shift * rng.normal(size=(n, FEATURES)) + rng.normal(size=(n, FEATURES))
    return labels, emb.astype(np.float32), w.astype(np.float32), b.astype(np.float32)


def _write(folder, model, dataset, *, embeddings=True, passes=None, method="deep_ensemble",
           mode="plain"):
    role, split, n, _ = SETS[dataset]
    labels, emb, w, b = _arrays(model, dataset)
    logits = emb @ w.T + b
    if passes is not None:  # MC-dropout-like passes: noisy copies
        rng = np.random.default_rng(5)
        logits = logits[None] + 0.3 * rng.normal(size=(passes, *logits.shape))
    attrs = {"model": model, "dataset_name": dataset, "mode": mode, "pass_index": 0,
             "eval_set": "imagenet-o" if role == "ood" else "folder", "role": role,
             "method": method, "run": model, "wall_time_s": 2.0}
    if split:
        attrs["ood_split"] = split
    if method == "deep_ensemble":  # the members of one uqvision train --members 2 run
        attrs.update(ensemble="r1", ensemble_size=len(MODELS))
    if dataset == "fit":  # the ID training subset (uqvision sweep --sets fit:fit=PATH)
        attrs["set_role"] = "fit"
    ds = cache_dataset(logits, labels, samples=[f"{dataset}/{i}.png" for i in range(n)],
                       classes=CLASSES, embedding=emb if embeddings else None, attrs=attrs,
                       extra={"head_weight": (("class", "feature"), w),
                              "head_bias": ("class", b)} if embeddings else None)
    write_dataset(ds, folder / f"{cache_key(model, dataset, mode, 0)}.nc")


def _caches(folder, models=("m1", "m2"), **kw):
    folder.mkdir(parents=True, exist_ok=True)
    for m in models:
        for d in SETS:
            _write(folder, m, d, **kw)
    return folder


def _inputs(model, dataset):
    _, emb, w, b = _arrays(model, dataset)
    z = (emb @ w.T + b).astype(np.float32).astype(np.float64)
    return {"logits": z, "embedding": emb.astype(np.float64), "head_weight": w, "head_bias": b}


def _u(detector, model, dataset):
    det = get_detector(detector)
    fit = None
    if "fit" in det.needs:
        labels, emb, w, b = _arrays(model, "fit")
        fit = {"embedding": emb, "labels": labels, "head_weight": w, "head_bias": b}
    return det.fitted(fit)(_inputs(model, dataset))


def test_metrics_per_set_equal_uqmetrics_on_the_same_scores(tmp_path):
    dets = [d for d in ("msp", "energy", "mahalanobis", "knn") if d in list_detectors()]
    ds = score_ood(_caches(tmp_path / "c"), OodConfig(detectors=dets, fit="fit"))
    assert ds.attrs["protocol"] == "ood"
    assert list(ds["model"].values) == ["m1", "m2", "deep_ensemble[2]"]
    assert list(ds["ood_set"].values) == ["near1", "far1", "far2"]  # near first
    assert list(ds["ood_split"].values) == ["near", "far", "far"]
    assert list(ds["detector"].values) == dets
    for var, metric in OOD_METRICS.items():
        func = get_metric(metric).func
        for det in dets:
            for o in ("near1", "far1", "far2"):
                for m in MODELS:
                    want = func(_u(det, m, "test"), _u(det, m, o))
                    assert float(ds[var].sel(model=m, detector=det, ood_set=o)) == \
                        pytest.approx(want, abs=1e-9), (var, det, m, o)
                # the ensemble row: the mean of its members' u
                u_in = np.mean([_u(det, m, "test") for m in MODELS], axis=0)
                u_out = np.mean([_u(det, m, o) for m in MODELS], axis=0)
                assert float(ds[var].sel(model="deep_ensemble[2]", detector=det,
                                         ood_set=o)) == pytest.approx(func(u_in, u_out))


def test_near_and_far_means_by_hand(tmp_path):
    ds = score_ood(_caches(tmp_path / "c"), OodConfig(detectors=["msp"]))
    a = ds["auroc"].sel(detector="msp")
    assert np.allclose(ds["near_auroc"].sel(detector="msp"), a.sel(ood_set="near1"))
    assert np.allclose(ds["far_auroc"].sel(detector="msp"),
                       (a.sel(ood_set="far1") + a.sel(ood_set="far2")) / 2)
    assert ds["near_auroc"].attrs  # tagged as a metric


def test_id_accuracy_and_cost_accounting(tmp_path):
    ds = score_ood(_caches(tmp_path / "c"), OodConfig(detectors=["msp"]))
    for m in MODELS:
        labels, emb, w, b = _arrays(m, "test")
        z = (emb @ w.T + b).astype(np.float32)
        want = uqmetrics.accuracy_score(labels, uqmetrics.softmax(z))
        assert float(ds["id_accuracy"].sel(model=m)) == pytest.approx(want)
    assert list(ds["forward_passes"].values) == [1, 1, 2]
    assert list(ds["members"].values) == [1, 1, 2]
    assert list(ds["training_runs"].values) == [1, 1, 2]
    assert list(ds["predict_wall_s"].values) == [2.0, 2.0, 4.0]
    assert np.isnan(ds["train_wall_s"].values).all()  # no checkpoint sidecars
    assert json.loads(ds.attrs["ensemble_members"]) == {"deep_ensemble[2]": ["m1", "m2"]}


def test_member_detectors_read_the_passes_and_are_nan_for_one_pass(tmp_path):
    folder = _caches(tmp_path / "c", models=("m1",))
    for d in SETS:
        _write(folder, "m2", d, passes=4, method="mc_dropout", mode="mc_dropout")
    ds = score_ood(folder, OodConfig(detectors=["msp", "mutual_information"]))
    assert list(ds["model"].values) == ["m1", "m2"]
    assert list(ds["forward_passes"].values) == [1, 4]
    assert np.isnan(ds["auroc"].sel(model="m1", detector="mutual_information")).all()
    det = get_detector("mutual_information")
    rng = np.random.default_rng(5)
    stack = {}
    for d in ("test", "far1"):
        z = _inputs("m2", d)["logits"]
        stack[d] = (z[None] + 0.3 * rng.normal(size=(4, *z.shape))).astype(np.float32)
        rng = np.random.default_rng(5)
    want = uqmetrics.ood_auroc_score(det.score({"members": stack["test"]}),
                                     det.score({"members": stack["far1"]}))
    assert float(ds["auroc"].sel(model="m2", detector="mutual_information",
                                 ood_set="far1")) == pytest.approx(want)
    assert "mutual_information on m1" in ds.attrs["notes"]


def test_a_detector_needing_what_the_caches_lack_is_refused_naming_it(tmp_path):
    folder = _caches(tmp_path / "c", embeddings=False)
    with pytest.raises(InputError, match=r"needs \['embedding'\].*--embeddings"):
        score_ood(folder, OodConfig(detectors=["mahalanobis"], fit="fit"))
    for path in _caches(tmp_path / "d").glob("*.fit.*"):  # no fit set
        path.unlink()
    with pytest.raises(InputError, match="fits on ID training data.*a set of role fit"):
        score_ood(tmp_path / "d", OodConfig(detectors=["mahalanobis"]))
    # by default such detectors are skipped, and said so
    ds = score_ood(folder)
    skipped = json.loads(ds.attrs["skipped_detectors"])
    assert "mahalanobis" in skipped and "embedding" in skipped["mahalanobis"]
    assert "msp" in ds["detector"].values


def test_refusals(tmp_path):
    folder = _caches(tmp_path / "c")
    with pytest.raises(InputError, match="unknown"):
        score_ood(folder, OodConfig(detectors=["nope"]))
    with pytest.raises(InputError, match="--test 'nope': no caches"):
        score_ood(folder, OodConfig(test="nope"))
    with pytest.raises(InputError, match="--test 'fit': dataset 'fit' has role 'fit'"):
        score_ood(folder, OodConfig(test="fit"))
    with pytest.raises(InputError, match="both"):
        score_ood(folder, OodConfig(test="test", fit="test"))
    only_clean = tmp_path / "clean"
    only_clean.mkdir()
    _write(only_clean, "m1", "test")
    with pytest.raises(InputError, match="no caches of an OOD set"):
        score_ood(only_clean)


def test_keep_scores_stores_each_images_u(tmp_path):
    ds = score_ood(_caches(tmp_path / "c"), OodConfig(detectors=["msp"], keep_scores=True))
    assert ds["u_id"].shape == (3, 1, SETS["test"][2])
    sel = ds["u_ood"].sel(model="m1", detector="msp").values[ds["ood_sample_set"] == "far1"]
    assert np.allclose(sel, _u("msp", "m1", "far1"), atol=1e-6)


@pytest.mark.slow
def test_smoke_run_writes_an_ood_result(smoke_run):
    out, path = smoke_run("ood")
    ds = uqmetrics.read_result(path, protocol="ood")
    assert {"auroc", "near_auroc", "far_auroc", "id_accuracy", "forward_passes"} <= set(ds)
    assert set(ds["ood_split"].values) == {"near", "far"}
    assert "msp" in ds["detector"].values
    assert (out / "findings.md").is_file()
    assert sorted(p.name for p in (out / "figures").iterdir())
    fit = json.loads(ds.attrs["fit_data"])
    assert {"dataset_name", "per_class", "seed"} <= set(fit)


def test_the_stand_in_split_holds_out_interior_or_end_classes(tmp_path):
    """Of each ID superclass's classes (in parameter order), near-OOD holds out the middle
    one (interior) or the last one (end); far-OOD is every class of the other superclasses."""
    from uqvision.hierarchy import make_hierarchy, read_hierarchy
    from uqvision.protocols.ood.reproduce import ood_split_classes

    root = make_hierarchy(tmp_path / "h", scale="smoke")
    info = read_hierarchy(root)
    ids = info.superclasses[: len(info.superclasses) // 2]
    by_sup = {s: sorted(c for c in info.classes if info.superclass_of[c] == s)
              for s in info.superclasses}
    for position, pick in (("interior", 1), ("end", 2)):  # 3 classes per superclass
        split = ood_split_classes(root, 1, position)
        assert split["near"] == sorted(by_sup[s][pick] for s in ids)
        assert split["id"] == sorted(c for s in ids for c in by_sup[s] if c not in split["near"])
        assert split["far"] == sorted(c for s in info.superclasses if s not in ids
                                      for c in by_sup[s])
