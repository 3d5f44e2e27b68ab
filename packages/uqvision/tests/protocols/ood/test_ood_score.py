"""The OOD protocol's scores (uqvision.protocols.ood.score) on synthetic caches, each value
checked against a direct uqmetrics call on the same arrays; refusals; the smoke run's file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import uqmetrics
from uqmetrics import InputError, write_dataset
from uqmetrics.metrics.detectors import get_detector, list_detectors
from uqmetrics.metrics.registry import get_metric

from uqvision.cache import cache_dataset, cache_key
from uqvision.protocols.ood.score import OOD_METRICS, OodConfig, score_ood

CLASSES = ["a", "b", "c"]
FEATURES = 4
#: dataset -> (role, ood_split, n images, mean shift of the features)
SETS = {"test": ("clean", "", 12, 0.0), "fit": ("clean", "", 15, 0.0),
        "near1": ("ood", "near", 9, 1.0), "far1": ("ood", "far", 10, 3.0),
        "far2": ("ood", "far", 8, 4.0)}
#: The validation sets of --tune-detectors, as SETS: an ID set and an OOD one.
VAL_SETS = {"val": ("clean", "", 12, 0.0), "oodval": ("ood", "far", 10, 1.5)}
#: Declared roles (the others: their evaluation set's default).
SET_ROLE = {"fit": "fit", "val": "calibration", "oodval": "ood-val"}
#: model -> seed of its head and features
MODELS = {"m1": 1, "m2": 2}


def _arrays(model: str, dataset: str):
    """``(labels, embedding, head_weight, head_bias)`` of one model on one dataset."""
    seed = MODELS[model]
    every = {**SETS, **VAL_SETS}
    role, _, n, shift = every[dataset]
    rng = np.random.default_rng([seed, list(every).index(dataset)])
    w = np.random.default_rng(seed).normal(size=(len(CLASSES), FEATURES))
    b = np.random.default_rng(seed + 10).normal(size=len(CLASSES))
    labels = np.arange(n) % len(CLASSES) if role == "clean" else np.full(n, -1)
    centre = 2.0 * w[np.maximum(labels, 0)] * (labels >= 0)[:, None]
    emb = centre + shift * rng.normal(size=(n, FEATURES)) + rng.normal(size=(n, FEATURES))
    return labels, emb.astype(np.float32), w.astype(np.float32), b.astype(np.float32)


def _write(folder, model, dataset, *, embeddings=True, passes=None, method="deep_ensemble",
           mode="plain"):
    role, split, n, _ = {**SETS, **VAL_SETS}[dataset]
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
    if dataset in SET_ROLE:  # e.g. the ID training subset (uqvision sweep --sets fit:fit=PATH)
        attrs["set_role"] = SET_ROLE[dataset]
    ds = cache_dataset(logits, labels, samples=[f"{dataset}/{i}.png" for i in range(n)],
                       classes=CLASSES, embedding=emb if embeddings else None, attrs=attrs,
                       extra={"head_weight": (("class", "feature"), w),
                              "head_bias": ("class", b)} if embeddings else None)
    write_dataset(ds, folder / f"{cache_key(model, dataset, mode, 0)}.nc")


def _caches(folder, models=("m1", "m2"), sets=tuple(SETS), **kw):
    folder.mkdir(parents=True, exist_ok=True)
    for m in models:
        for d in sets:
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
                # the ensemble row: msp on the mean softmax, energy on the mean logits, the
                # feature detectors the mean of the members' u
                u_in, u_out = _ensemble_u(det, "test"), _ensemble_u(det, o)
                assert float(ds[var].sel(model="deep_ensemble[2]", detector=det,
                                         ood_set=o)) == pytest.approx(func(u_in, u_out))


def _ensemble_u(detector, dataset):
    """The ensemble row's u, written out: -max of the mean softmax (msp), -logsumexp of the
    mean logits (energy, T = 1), else the mean of the members' u."""
    z = np.stack([_inputs(m, dataset)["logits"] for m in MODELS])
    if detector == "msp":
        p = np.exp(z - z.max(axis=2, keepdims=True))
        return -(p / p.sum(axis=2, keepdims=True)).mean(axis=0).max(axis=1)
    if detector == "energy":
        zbar = z.mean(axis=0)
        return -np.log(np.exp(zbar).sum(axis=1))
    return np.mean([_u(detector, m, dataset) for m in MODELS], axis=0)


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
    _write(only_clean, "m1", "oodval")  # the OOD validation set alone: named, never scored
    with pytest.raises(InputError, match=r"no caches of an OOD set .*; 'oodval' of role "
                                         r"'ood-val' only tunes the detectors, never scored"):
        score_ood(only_clean)


def test_keep_scores_stores_each_images_u(tmp_path):
    ds = score_ood(_caches(tmp_path / "c"), OodConfig(detectors=["msp"], keep_scores=True))
    assert ds["u_id"].shape == (3, 1, SETS["test"][2])
    sel = ds["u_ood"].sel(model="m1", detector="msp").values[ds["ood_sample_set"] == "far1"]
    assert np.allclose(sel, _u("msp", "m1", "far1"), atol=1e-6)


def _react_by_hand(model, dataset, percentile):
    """ReAct's u written out: energy of the logits of the features clipped at the percentile
    of the model's fit features."""
    _, emb, w, b = (np.asarray(a, np.float64) for a in _arrays(model, dataset))
    c = np.percentile(np.asarray(_arrays(model, "fit")[1], np.float64), percentile)
    z = np.minimum(emb, c) @ w.T + b
    return -np.log(np.exp(z).sum(axis=1))


def _gen_by_hand(model, dataset, gamma):
    """GEN's u written out for 3 classes (every M of the grid takes all 3)."""
    p = uqmetrics.softmax(_inputs(model, dataset)["logits"])
    return np.sum(p**gamma * (1 - p)**gamma, axis=1)


def test_tune_detectors_selects_each_predictors_parameters_on_the_validation_sets(tmp_path):
    """--tune-detectors: OpenOOD v1.5's search, written out: per model, the first grid point of
    the highest AUROC of the ood-val set against the ID validation set (role calibration);
    the OOD validation set is never a test set; grids and choices are recorded."""
    folder = _caches(tmp_path / "c", sets=(*SETS, *VAL_SETS))
    ds = score_ood(folder, OodConfig(detectors=["msp", "gen", "react"], fit="fit",
                                     tune_detectors=True))
    assert list(ds["ood_set"].values) == ["near1", "far1", "far2"]  # not oodval
    search = json.loads(ds.attrs["detector_search"])
    assert (search["validation"], search["ood_validation"]) == ("val", "oodval")
    # OpenOOD v1.5's configs/postprocessors/{gen,react}.yml postprocessor_sweep
    assert search["grids"] == {"gen": {"gamma": [0.01, 0.1, 0.5, 1, 2, 5, 10],
                                       "M": [10, 50, 100, 200, 500, 1000]},
                               "react": {"percentile": [85, 90, 95, 99]}}
    assert set(search["chosen"]) == {"m1", "m2", "deep_ensemble[2]"}
    auroc = uqmetrics.ood_auroc_score
    picked = []
    for m in MODELS:
        for det, by_hand, grid, extra in (
                ("react", _react_by_hand, [85, 90, 95, 99], {}),
                ("gen", _gen_by_hand, [0.01, 0.1, 0.5, 1, 2, 5, 10], {"M": 10})):
            val = [auroc(by_hand(m, "val", v), by_hand(m, "oodval", v)) for v in grid]
            best = grid[int(np.argmax(val))]  # the first of the largest
            picked.append(best)
            name = "percentile" if det == "react" else "gamma"
            chosen = search["chosen"][m][det]
            assert chosen["params"] == {name: best, **extra}, (m, det, val)
            assert chosen["val_auroc"] == pytest.approx(max(val))
            assert float(ds["auroc"].sel(model=m, detector=det, ood_set="near1")) == \
                pytest.approx(auroc(by_hand(m, "test", best), by_hand(m, "near1", best)))
    assert set(picked) - {90, 0.1}  # some choice differs from the fixed defaults
    assert json.loads(ds.attrs["scored_sets"])["ood_validation"] == "oodval"


def test_tune_detectors_refusals(tmp_path):
    from uqvision.evalsets import eval_set_attrs

    # role ood-val: an OOD set's (declared), never a clean folder's
    assert eval_set_attrs("openimage-o", None, "ood-val")["set_role"] == "ood-val"
    with pytest.raises(InputError, match="'folder' .*cannot have role 'ood-val'"):
        eval_set_attrs("folder", None, "ood-val")
    folder = _caches(tmp_path / "c", sets=(*SETS, "val"))
    with pytest.raises(InputError, match=r"validation \(--validation\) 'val'.*--tune-detectors"):
        OodConfig(validation="val")
    with pytest.raises(InputError, match="OOD validation set: predict one as a set of role "
                                         "ood-val"):
        score_ood(folder, OodConfig(detectors=["react"], fit="fit", tune_detectors=True))
    with pytest.raises(InputError, match="--ood-validation 'near1': dataset 'near1' has role "
                                         "'ood-near'"):
        score_ood(folder, OodConfig(detectors=["react"], fit="fit", tune_detectors=True,
                                    ood_validation="near1"))
    with pytest.raises(InputError, match="--validation 'test' is the test set"):
        score_ood(_caches(folder, sets=("oodval",)), OodConfig(
            detectors=["react"], fit="fit", tune_detectors=True, validation="test"))


def test_score_ood_tune_detectors_on_the_command_line(tmp_path):
    from uqvision.cli import main

    out = tmp_path / "ood.nc"
    assert main(["score", "ood", "--caches", str(_caches(tmp_path / "c", sets=(
        *SETS, *VAL_SETS))), "--detectors", "energy", "--tune-detectors", "--out",
        str(out)]) == 0
    ds = uqmetrics.read_result(out, protocol="ood")
    assert json.loads(ds.attrs["config"])["tune_detectors"] is True
    search = json.loads(ds.attrs["detector_search"])
    assert search["grids"] == {"energy": {"temperature": [1.0]}}  # OpenOOD's ebo.yml
    assert search["chosen"]["m1"]["energy"]["params"] == {"temperature": 1.0}


def test_fpr_at_95_defaults_to_ood_positive_and_offers_the_id_positive_one(tmp_path):
    """OpenOOD v1.5's FPR@95 (OOD positive) by default, named in the file; the older
    ID-positive one (OpenOOD v1.0, ODIN) on request, a different number, named too."""
    from uqmetrics.metrics.ood import fpr_at_95_tpr

    from uqvision.cli import main

    folder = _caches(tmp_path / "c")
    assert OodConfig().fpr_positive == "out"
    out = {}
    for positive in ("out", "in"):
        path = tmp_path / f"ood-{positive}.nc"
        flag = [] if positive == "out" else ["--fpr-positive", "in"]
        assert main(["score", "ood", "--caches", str(folder), "--detectors", "msp",
                     "--out", str(path), *flag]) == 0
        out[positive] = ds = uqmetrics.read_result(path, protocol="ood")
        assert ds.attrs["fpr_positive"] == positive
        assert json.loads(ds.attrs["config"])["fpr_positive"] == positive
        assert ds["fpr_at_95_tpr"].attrs["positive"] == positive
        for o in ("near1", "far1", "far2"):
            want = fpr_at_95_tpr(_u("msp", "m1", "test"), _u("msp", "m1", o),
                                 positive=positive)
            assert float(ds["fpr_at_95_tpr"].sel(model="m1", detector="msp", ood_set=o)) \
                == pytest.approx(want, abs=1e-9)
    assert not np.allclose(out["out"]["fpr_at_95_tpr"], out["in"]["fpr_at_95_tpr"])
    np.testing.assert_array_equal(out["out"]["auroc"], out["in"]["auroc"])  # FPR@95 only
    with pytest.raises(InputError, match="fpr_positive .*'both'"):
        OodConfig(fpr_positive="both")


@pytest.mark.slow
def test_smoke_ensembles_msp_is_the_max_of_its_mean_softmax(smoke_run):
    """On the smoke run, deep_ensemble[2]'s MSP is -max p̄, p̄ the mean of its members'
    softmaxes (S.3), written out here from the caches; the mean of its members' MSP (the rule
    before) has another near AUROC."""
    import xarray as xr

    out, path = smoke_run("ood")
    ds = uqmetrics.read_result(path, protocol="ood")
    members = json.loads(ds.attrs["ensemble_members"])["deep_ensemble[2]"]
    probs = {}
    for f in sorted((out / "caches").glob("*.nc")):
        with xr.open_dataset(f) as c:
            z = c["logits"].values.astype(np.float64)
            e = np.exp(z - z.max(axis=-1, keepdims=True))
            probs[c.attrs["model"], c.attrs["dataset_name"]] = e / e.sum(axis=-1, keepdims=True)
    u = {d: -np.mean([probs[m, d] for m in members], axis=0).max(axis=1)
         for d in ("test", "near")}
    old = {d: np.mean([-probs[m, d].max(axis=1) for m in members], axis=0)
           for d in ("test", "near")}
    row = {"model": "deep_ensemble[2]", "detector": "msp"}
    np.testing.assert_allclose(ds["u_id"].sel(**row).values, u["test"], atol=1e-6)
    near = uqmetrics.ood_auroc_score(u["test"], u["near"])
    assert float(ds["near_auroc"].sel(**row)) == pytest.approx(near)
    assert uqmetrics.ood_auroc_score(old["test"], old["near"]) != pytest.approx(near, abs=0.01)


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


@pytest.mark.slow
def test_the_stand_in_split_holds_out_interior_or_end_classes(smoke_run):
    """Of each ID superclass's classes (in parameter order), near-OOD holds out the middle
    one (interior) or the last one (end); far-OOD is every class of the other superclasses
    (the smoke run's generated hierarchy)."""
    from uqvision.hierarchy import read_hierarchy
    from uqvision.protocols.ood.reproduce import ood_split_classes

    root = smoke_run("ood")[0] / "data"
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


@pytest.mark.slow
def test_reproduce_tune_detectors_adds_validation_views_of_the_val_split(smoke_run, tmp_path):
    """--set tune_detectors=true: the ID classes and the far-OOD classes of the generated val
    split (the smoke run's hierarchy), beside the test views (never the test images)."""
    import os

    from uqvision.protocols.ood.reproduce import _settings, _views, ood_split_classes

    assert _settings("smoke", None, None, {})["tune_detectors"] is False
    assert _settings("smoke", None, None, {"tune_detectors": "true"})["tune_detectors"] is True
    with pytest.raises(InputError, match="tune_detectors must be true or false, got 'maybe'"):
        _settings("smoke", None, None, {"tune_detectors": "maybe"})
    root = smoke_run("ood")[0] / "data"
    split = ood_split_classes(root)
    views = _views(root, tmp_path / "v", split, 2, 0, validation=True)
    for view, key in (("val", "id"), ("oodval", "far"), ("far", "far")):
        part = "test" if view == "far" else "val"
        assert sorted(p.name for p in views[view].iterdir()) == split[key]
        assert all(os.readlink(views[view] / c) == str((root / part / c).resolve())
                   for c in split[key])
    assert "val" not in _views(root, tmp_path / "w", split, 2, 0)
