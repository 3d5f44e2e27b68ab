"""Caches that do not belong together are refused before any score: a Pitfalls set of a role
that is never scored (training images, OOD) or of two roles, and an OOD ensemble row whose
members are in two class spaces whatever detectors are named."""

from __future__ import annotations

import numpy as np
import pytest
from uqmetrics import InputError, write_dataset

from uqvision.cache import CacheError, cache_dataset, cache_key
from uqvision.protocols.ood.score import OodConfig, score_ood
from uqvision.protocols.pitfalls.score import EnsembleConfig, score_ensembles

OOD = {"eval_set": "imagenet-o", "role": "ood", "ood_split": "far"}


def _write(folder, model, dataset, *, n=12, classes=("a", "b", "c"), ood=False,
           embeddings=False, **attrs):
    c = len(classes)
    rng = np.random.default_rng([len(model), n, c])
    labels = np.full(n, -1) if ood else np.arange(n) % c
    logits = rng.normal(size=(n, c)) + 2.0 * np.eye(c)[np.maximum(labels, 0)]
    emb = rng.normal(size=(n, 4)).astype(np.float32) if embeddings else None
    a = {"model": model, "dataset_name": dataset, "mode": "plain", "pass_index": 0,
         **(OOD if ood else {}), **attrs}
    ds = cache_dataset(logits.astype(np.float32), labels,
                       samples=[f"{dataset}/{i}.png" for i in range(n)], classes=list(classes),
                       embedding=emb, attrs=a)
    return write_dataset(ds, folder / f"{cache_key(model, dataset, 'plain', 0)}.nc")


def _members(folder, dataset, roles):
    for j, role in enumerate(roles):
        _write(folder, f"m{j}", dataset, n=30, method="deep_ensemble", run=f"m{j}",
               set_role=role)
    return folder


@pytest.mark.parametrize("role", ["fit", "ood-far"])
def test_pitfalls_refuses_a_set_that_is_never_scored_naming_it(tmp_path, role):
    _members(tmp_path, "train", [role] * 3)
    with pytest.raises(InputError, match=r"dataset 'train' \(--dataset\) has role "
                                         rf"'{role}' \(cache '.*m0\.train\.plain-000\.nc'\)"):
        score_ensembles([tmp_path], EnsembleConfig(n_orders=2, n_repeats=2))


def test_pitfalls_refuses_a_set_of_two_roles_naming_both_files(tmp_path):
    _members(tmp_path, "val", ["calibration", "test", "test"])
    with pytest.raises(InputError, match=r"m0\.val\.plain-000\.nc.*m1\.val\.plain-000\.nc.*"
                                         "two roles"):
        score_ensembles([tmp_path], EnsembleConfig(n_orders=2, n_repeats=2))


def test_pitfalls_still_scores_a_test_set(tmp_path):
    _members(tmp_path, "val", ["test"] * 3)
    ds = score_ensembles([tmp_path], EnsembleConfig(n_orders=2, n_repeats=2))
    assert ds.attrs["dataset_name"] == "val"


@pytest.mark.parametrize("other", [("c", "b", "a"), ("a", "b", "c", "d")])
def test_an_ood_ensemble_of_two_class_spaces_is_refused_for_feature_detectors(tmp_path, other):
    # knn scores an ensemble as the mean of its members' u and never compares their classes;
    # the row's ID accuracy averaged probabilities of other classes (or broke on the shapes)
    for model, classes in (("m1", ("a", "b", "c")), ("m2", other)):
        labels = {"classes": classes, "embeddings": True}
        _write(tmp_path, model, "test", **labels)
        _write(tmp_path, model, "fit", set_role="fit", **labels)
        _write(tmp_path, model, "far1", n=9, ood=True, **labels)
    with pytest.raises(CacheError, match=r"m2\.test\.plain-000\.nc.*m1\.test\.plain-000\.nc"):
        score_ood([tmp_path], OodConfig(detectors=("knn",), ensembles=["E=m1,m2"]))


def test_one_folder_predicted_under_two_names_is_refused_naming_both_files(tmp_path):
    """The test set's folder predicted again as ``--role calibration --dataset-name val2`` was
    taken as a separate calibration set (its own test images calibrating it), and an OOD set
    of the test images was scored as OOD: caches of two names with one dataset fingerprint,
    read as one evaluation set, are refused, naming both files; the same fingerprint under
    another evaluation set (ImageNet-ReaL's labels for ImageNet's val) is another set."""
    from uqvision.predictors import read_cache_groups

    same = {"dataset_fingerprint": "content2:" + "ab" * 32}
    _write(tmp_path, "m1", "val", **same)
    _write(tmp_path, "m1", "val2", set_role="calibration", **same)
    with pytest.raises(InputError, match=r"m1\.val\.plain-000\.nc.*\(dataset 'val'\) and "
                                         r".*m1\.val2\.plain-000\.nc.* \(dataset 'val2'\) hold "
                                         r"the same images"):
        read_cache_groups([tmp_path])
    (tmp_path / f"{cache_key('m1', 'val2', 'plain', 0)}.nc").unlink()
    _write(tmp_path, "m1", "real", eval_set="imagenet-real", eval_member="", set_role="shift",
           **same)
    assert sorted(read_cache_groups([tmp_path]).sets) == ["real", "val"]
