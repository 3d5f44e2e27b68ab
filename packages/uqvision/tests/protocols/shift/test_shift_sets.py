"""The shift protocol's natural shift sets (ImageNet-V2/-A/-R style: set_<metric>,
masked_accuracy) and relabelled caches (ReaL: real_accuracy) through score_shift, on
synthetic caches checked by hand, and a by-index V2 folder predicted by a model whose class
names are not digits."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import uqmetrics
from uqmetrics import InputError, write_dataset

from uqvision.cache import cache_dataset, cache_key
from uqvision.evalsets import Overlay, write_overlay
from uqvision.protocols.shift.score import SHIFT_METRICS, ShiftConfig, score_shift

CLASSES = ["a", "b", "c", "d"]


def _write(folder, model, dataset, logits, labels, *, role="clean", eval_set="folder",
           in_folder=None, samples=None, **attrs):
    logits = np.asarray(logits, float)
    samples = samples or [f"s{i}.png" for i in range(logits.shape[-2])]
    if dataset == "val":  # declared the calibration set (test: a clean set's default, test)
        attrs.setdefault("set_role", "calibration")
    ds = cache_dataset(logits, labels, samples=samples, classes=CLASSES, in_folder=in_folder,
                       attrs={"model": model, "dataset_name": dataset, "mode": "plain",
                              "pass_index": 0, "eval_set": eval_set, "role": role, **attrs})
    write_dataset(ds, folder / f"{cache_key(model, dataset, 'plain', 0)}.nc")


def _clean(folder, model, n, samples=None):
    """A test cache of ``n`` samples, labels i mod 4, every sample but the first right, and a
    val cache of 20 (the temperature's: 10 fitted, at least the 5 the protocol needs) with
    every third sample wrong (a temperature fitted on samples all right is the search's bound,
    refused)."""
    labels = np.arange(n) % 4
    z = 3.0 * np.eye(4)[labels]
    z[0] = z[1]
    _write(folder, model, "test", z, labels, samples=samples)
    labels = np.arange(20) % 4
    _write(folder, model, "val", 3.0 * np.eye(4)[np.where(np.arange(20) % 3, labels,
                                                          (labels + 1) % 4)], labels)


# ImageNet-A style set: the folder has classes b and d (in_folder 0 1 0 1), labels b/d.
#   sample  logits (a b c d)  label  argmax over all   over {b, d}
#   0       5 3 0 1           b      a  wrong          b  right
#   1       0 1 5 3           d      c  wrong          d  right
#   2       0 4 1 0           b      b  right          b  right
#   3       9 2 0 1           d      a  wrong          b  wrong
#   4       0 1 0 2           b      d  wrong          d  wrong
#   5       0 0 0 3           d      d  right          d  right
#   6       2 1 3 0           b      c  wrong          b  right
#   7       0 4 0 1           d      b  wrong          b  wrong
# 1000-class (all classes) accuracy 2/8, masked accuracy 5/8
A_LOGITS = np.array([[5, 3, 0, 1], [0, 1, 5, 3], [0, 4, 1, 0], [9, 2, 0, 1], [0, 1, 0, 2],
                     [0, 0, 0, 3], [2, 1, 3, 0], [0, 4, 0, 1]], float)
A_LABELS = np.array([1, 3, 1, 3, 1, 3, 1, 3])
# V2 style set (all classes): predicted 0 1 2 3 0 1 2 3 against labels 0 1 2 0 0 1 3 3 -> 6/8
V2_LOGITS = 4.0 * np.eye(4)[np.arange(8) % 4]
V2_LABELS = np.array([0, 1, 2, 0, 0, 1, 3, 3])


def _natural(folder):
    folder.mkdir(parents=True, exist_ok=True)
    for m in ("m1", "m2"):
        _clean(folder, m, 8)
        _write(folder, m, "v2", V2_LOGITS, V2_LABELS, role="shifted", eval_set="imagenet-v2")
    _write(folder, "m1", "ina", A_LOGITS, A_LABELS, role="shifted", eval_set="imagenet-a",
           in_folder=[0, 1, 0, 1])
    # an ImageNet-R style cache without in_folder: the mask is the classes among its labels
    _write(folder, "m1", "inr", A_LOGITS, A_LABELS, role="shifted", eval_set="imagenet-r")
    return folder


def test_natural_shift_sets_and_masked_accuracy_by_hand(tmp_path):
    ds = score_shift(_natural(tmp_path / "c"))
    assert ds["shift_set"].values.tolist() == ["ina", "inr", "v2"]
    assert ds["shift_eval_set"].values.tolist() == ["imagenet-a", "imagenet-r", "imagenet-v2"]
    assert ds.sizes["corruption"] == 0 and ds.sizes["severity"] == 0  # no corrupted caches
    for m in ("m1", "m2"):
        for cal in ("none", "temperature"):  # a temperature never moves the arg-max
            assert float(ds["set_accuracy"].sel(model=m, shift_set="v2",
                                                calibration=cal)) == 0.75
    for s in ("ina", "inr"):
        # 1000-class accuracy and the masked one, both recorded
        assert float(ds["set_accuracy"].sel(model="m1", shift_set=s, calibration="none")) == 0.25
        assert float(ds["masked_accuracy"].sel(model="m1", shift_set=s)) == 0.625
        assert int(ds["n_masked_classes"].sel(model="m1", shift_set=s)) == 2
        # m2 has no caches of the set
        assert np.isnan(ds["set_accuracy"].sel(model="m2", shift_set=s)).all()
        assert np.isnan(ds["masked_accuracy"].sel(model="m2", shift_set=s))
    # no masked accuracy for a set of all the classes
    assert np.isnan(ds["masked_accuracy"].sel(shift_set="v2")).all()
    assert (ds["n_masked_classes"].sel(shift_set="v2") == 0).all()
    # the NLL by hand: softmax of 4 * one-hot, right class p = e^4 / (e^4 + 3)
    p_hit, p_miss = np.exp(4) / (np.exp(4) + 3), 1 / (np.exp(4) + 3)
    assert float(ds["set_nll"].sel(model="m1", shift_set="v2", calibration="none")) == \
        pytest.approx(-(6 * np.log(p_hit) + 2 * np.log(p_miss)) / 8)
    tags = uqmetrics.metric_variables(ds)
    assert {f"set_{m}" for m in SHIFT_METRICS} | {"masked_accuracy"} <= set(tags)
    assert tags["masked_accuracy"] == ("masked_accuracy", True)


def test_natural_set_results_round_trip_through_a_result_file(tmp_path):
    ds = score_shift(_natural(tmp_path / "c"))
    path = write_dataset(ds, tmp_path / "shift.nc")
    back = uqmetrics.read_result(path, protocol="shift")
    assert back.sizes["corruption"] == 0
    np.testing.assert_array_equal(back["masked_accuracy"].values, ds["masked_accuracy"].values)


# ReaL: 5 validation images, 4 classes; image 2 has no valid label and is left out:
#   image  ReaL labels  predicted  original label
#   0      {a}          a  right   a
#   1      {b, c}       c  right   b
#   2      {}           b  -       c
#   3      {d}          a  wrong   d
#   4      {a, d}       d  right   a
# ReaL accuracy 3/4 (the original labels would give 1/5)
REAL_JSON = [[0], [1, 2], [], [3], [0, 3]]
REAL_IDS = [f"n0/ILSVRC2012_val_{i + 1:08d}.JPEG" for i in range(5)]
REAL_LOGITS = 5.0 * np.eye(4)[[0, 2, 1, 0, 3]]
REAL_LABELS = np.array([0, 1, 2, 3, 0])


def _real(folder):
    folder.mkdir(parents=True, exist_ok=True)
    _clean(folder, "m1", 5, samples=REAL_IDS)
    _write(folder, "m1", "real", REAL_LOGITS, REAL_LABELS, role="relabelled",
           eval_set="imagenet-real", samples=REAL_IDS)
    return folder


def test_real_accuracy_of_five_images_by_hand(tmp_path):
    folder = _real(tmp_path / "c")
    (tmp_path / "real.json").write_text(json.dumps(REAL_JSON))
    ds = score_shift(folder, ShiftConfig(overlay=str(tmp_path / "real.json")))
    assert float(ds["real_accuracy"].sel(model="m1")) == 0.75
    assert int(ds["n_real_labelled"].sel(model="m1")) == 4
    assert uqmetrics.metric_variables(ds)["real_accuracy"] == ("real_accuracy", True)
    # the same labels as a label-overlay file
    path = write_overlay(Overlay("imagenet-real", dict(zip(REAL_IDS, REAL_JSON, strict=True))),
                         tmp_path / "real-overlay.json")
    again = score_shift(folder, ShiftConfig(overlay=str(path)))
    assert float(again["real_accuracy"].sel(model="m1")) == 0.75


def test_relabelled_caches_need_their_labels(tmp_path):
    folder = _real(tmp_path / "c")
    with pytest.raises(InputError, match=r"relabelled dataset 'real' \(eval set "
                                         r"'imagenet-real'\) hold no label sets"):
        score_shift(folder)
    with pytest.raises(InputError, match=r"overlay file '.*nowhere.json' does not exist"):
        score_shift(folder, ShiftConfig(overlay=str(tmp_path / "nowhere.json")))
    # an overlay without some cache sample is refused (naming the samples)
    path = write_overlay(Overlay("imagenet-real", dict(zip(REAL_IDS[:4], REAL_JSON[:4],
                                                           strict=True))), tmp_path / "o.json")
    with pytest.raises(InputError, match=r"has no labels for 1 of the cache's 5 samples"):
        score_shift(folder, ShiftConfig(overlay=str(path)))


@pytest.mark.filterwarnings("ignore::uqmetrics.UndefinedMetricWarning")  # tiny model: AUROC
def test_a_by_index_v2_folder_is_scored_against_the_model_class_index(trained, digits,
                                                                      tmp_path):
    """ImageNet-V2's layout (class folders '0', '1', ...) predicted by a model whose class names
    are not digits: the labels are the folder names as class indices. The V2 folder is built
    from the model's own clean predictions, so its accuracy is known by construction: folder
    ``ia`` (the most predicted class index) holds every other image predicted ``ia`` (right),
    folder ``ib = ia + 5 mod 10`` the rest of those and every image predicted neither (wrong).
    Matched by folder order instead, the two folders would be classes 0 and 1."""
    from uqvision.cache import read_cache
    from uqvision.predict import PredictConfig, predict_to_files

    ckpt = tmp_path / "model" / trained.checkpoint.name
    ckpt.parent.mkdir()
    shutil.copy(trained.checkpoint, ckpt)
    side = json.loads(trained.checkpoint.with_suffix(".json").read_text())
    digit_classes = list(side["classes"])
    side["classes"] = [f"digit_{c}" for c in digit_classes]
    ckpt.with_suffix(".json").write_text(json.dumps(side))
    spec = f"test_byobnet={ckpt}"
    clean = tmp_path / "val"  # the test digits, class folders named as the model's classes
    for c in digit_classes:
        shutil.copytree(digits / "test" / c, clean / f"digit_{c}")
    caches = tmp_path / "caches"
    (path,) = predict_to_files(spec, clean, caches, PredictConfig(batch_size=64))
    c = read_cache(path)
    pred = c["logits"].values.argmax(axis=1)
    ia = int(np.bincount(pred, minlength=10).argmax())
    ib = (ia + 5) % 10
    hits = np.flatnonzero(pred == ia)
    right = hits[::2]
    wrong = np.concatenate([hits[1::2], np.flatnonzero((pred != ia) & (pred != ib))])
    v2 = tmp_path / "v2"
    for index, chosen in ((ia, right), (ib, wrong)):
        (v2 / str(index)).mkdir(parents=True)
        for k in chosen:
            src = clean / str(c["sample"].values[k])
            shutil.copy(src, v2 / str(index) / f"{src.parent.name}_{src.name}")
    predict_to_files(spec, v2, caches, PredictConfig(batch_size=64, eval_set="imagenet-v2"))
    ds = score_shift(caches)
    (model,) = ds["model"].values.tolist()
    assert ds["shift_set"].values.tolist() == ["v2"]
    assert ds["shift_eval_set"].values.tolist() == ["imagenet-v2"]
    expected = len(right) / (len(right) + len(wrong))
    assert 0 < expected < 1
    for cal in ("none", "temperature"):
        assert float(ds["set_accuracy"].sel(model=model, shift_set="v2",
                                            calibration=cal)) == pytest.approx(expected)
