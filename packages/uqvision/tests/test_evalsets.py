"""Evaluation sets (roles, class maps, expansions; uqvision.evalsets.sets) and label overlays
(uqvision.evalsets.overlays), every name importable from uqvision.evalsets."""

import json
import re

import numpy as np
import pytest
from uqmetrics import InputError, dataset_checksum

from uqvision.cache import cache_dataset
from uqvision.evalsets import (
    CLASS_MAPS,
    EVAL_SETS,
    IMAGENET_C_CORRUPTIONS,
    ROLES,
    EvalSet,
    Overlay,
    apply_overlay,
    cache_eval_set,
    eval_set_attrs,
    iter_member_folders,
    map_classes,
    member_dataset_name,
    overlay_correct,
    read_overlay,
    real_overlay,
    resolve_member,
    write_overlay,
)


def test_every_name_is_importable_from_the_package_and_the_registry_is_one_object():
    import uqvision
    from uqvision import evalsets
    from uqvision.evalsets import overlays, sets

    assert sorted(evalsets.__all__) == sorted([*sets.__all__, *overlays.__all__])
    for name in evalsets.__all__:
        assert getattr(evalsets, name) is getattr(sets if name in sets.__all__ else overlays,
                                                  name), name
    assert EVAL_SETS is sets.EVAL_SETS is uqvision.EVAL_SETS
    assert (EVAL_SETS.group, EVAL_SETS.item_type) == ("uqvision.eval_sets", EvalSet)


def test_registered_sets_have_a_role_a_class_map_and_a_description():
    assert {"folder", "imagenet-val", "imagenet-v2", "imagenet-c", "imagenet-o"} <= set(EVAL_SETS)
    for es in EVAL_SETS.values():
        assert es.role in ROLES and es.class_map in CLASS_MAPS and es.description
    assert (EVAL_SETS["folder"].role, EVAL_SETS["folder"].class_map) == ("clean", "by_name")
    assert EVAL_SETS["imagenet-v2"].class_map == "by_index"
    assert (EVAL_SETS["imagenet-o"].role, EVAL_SETS["imagenet-o"].class_map) == ("ood", "none")
    with pytest.raises(ValueError, match="role must be one of"):
        EvalSet("x", "noisy", "by_name", "d")
    with pytest.raises(ValueError, match="class_map must be one of"):
        EvalSet("x", "clean", "by_order", "d")
    with pytest.raises(ValueError, match="unknown eval set 'imagenet-x'; valid eval sets: "
                                         "folder, imagenet-val"):
        EVAL_SETS.lookup("imagenet-x")


def test_imagenet_c_expands_to_75_corruption_severity_folders(tmp_path):
    members = EVAL_SETS["imagenet-c"].members()
    assert len(IMAGENET_C_CORRUPTIONS) == 15 and len(members) == 75
    assert len({m.name for m in members}) == len({m.folder for m in members}) == 75
    m = EVAL_SETS["imagenet-c"].member("fog-3")
    assert (m.folder, m.corruption, m.severity) == ("fog/3", "fog", 3)
    assert {m.severity for m in members} == {1, 2, 3, 4, 5}
    assert {m.corruption for m in members} == set(IMAGENET_C_CORRUPTIONS)
    assert [f for _, f in iter_member_folders(tmp_path, "imagenet-c")][:2] == [
        tmp_path / "gaussian_noise" / "1", tmp_path / "gaussian_noise" / "2"]
    assert EVAL_SETS["imagenet-v2"].members() == ()
    with pytest.raises(ValueError, match="has no member 'fog-6'"):
        EVAL_SETS["imagenet-c"].member("fog-6")


def test_by_name_maps_through_the_model_class_names():
    names = ["n01", "n02", "n03"]
    assert map_classes("folder", ["n03", "n01"], names, folder="f", model="m").tolist() == [2, 0]
    with pytest.raises(InputError, match=r"has 1 class\(es\) that model 'm' does not have"):
        map_classes("imagenet-val", ["n04"], names, folder="f", model="m")
    with pytest.raises(ValueError, match="must record its class names"):
        map_classes("folder", ["n01"], 3, folder="f", model="m")


def test_by_index_takes_folder_names_as_class_indices():
    # not the folders' sorted positions (0, 1, 2) but their names, among names that differ
    got = map_classes("imagenet-v2", ["0", "10", "2"], ["a"] * 11, folder="v2", model="m")
    assert got.tolist() == [0, 10, 2]
    assert map_classes("imagenet-v2", ["999"], 1000, folder="v2", model="m").tolist() == [999]
    assert map_classes("imagenet-v2", ["7"], None, folder="v2", model="m").tolist() == [7]
    for bad in ("1000", "n01440764", "-1", "01", "+3", " 3", "٣"):
        with pytest.raises(InputError, match=rf"image folder 'v2' of eval set 'imagenet-v2' "
                                             rf"\(class map by_index.*0 \.\.\. 999\) has 1 "
                                             rf"class folder\(s\) that are not a class index "
                                             rf"of model 'm': {re.escape(repr([bad]))}"):
            map_classes("imagenet-v2", ["0", bad], 1000, folder="v2", model="m")


def test_none_gives_every_folder_class_label_minus_one():
    got = map_classes("imagenet-o", ["n01", "n02"], None, folder="o", model="m")
    assert got.tolist() == [-1, -1] and got.dtype == np.int64


def test_a_member_is_told_from_its_folder_or_checked_against_it(tmp_path):
    root = tmp_path / "imagenet-c" / "motion_blur" / "4"
    root.mkdir(parents=True)
    assert resolve_member("imagenet-c", None, root).name == "motion_blur-4"
    assert resolve_member("imagenet-c", "motion_blur-4", root).severity == 4
    with pytest.raises(InputError, match=r"is not the folder of eval set 'imagenet-c''s member "
                                         r"'fog-4': it must end in 'fog/4'"):
        resolve_member("imagenet-c", "fog-4", root)
    with pytest.raises(InputError, match=r"is not a member folder of eval set 'imagenet-c'.*"
                                         r"--eval-member"):
        resolve_member("imagenet-c", None, tmp_path / "imagenet-c")
    with pytest.raises(InputError, match="has no member 'fog-9'"):
        resolve_member("imagenet-c", "fog-9", root)
    assert resolve_member("imagenet-v2", None, root) is None
    with pytest.raises(InputError, match="eval set 'imagenet-v2' is one folder"):
        resolve_member("imagenet-v2", "fog-4", root)
    # a member's severity is its folder's name: the default dataset name says which member
    m = resolve_member("imagenet-c", None, root)
    assert member_dataset_name("imagenet-c", m, root) == "imagenet-c-motion_blur-4"
    assert member_dataset_name("imagenet-v2", None, root) == "4"


def test_cache_attrs_of_an_eval_set_and_a_cache_from_before_them():
    m = EVAL_SETS["imagenet-c"].member("snow-2")
    attrs = eval_set_attrs("imagenet-c", m)
    assert attrs == {"eval_set": "imagenet-c", "role": "shifted", "set_role": "shift",
                     "eval_member": "snow-2", "corruption": "snow", "severity": 2}
    assert cache_eval_set(attrs) == {**attrs, "ood_split": ""}
    assert eval_set_attrs("imagenet-o", None) == {"eval_set": "imagenet-o", "role": "ood",
                                                  "set_role": "ood-far", "ood_split": "far"}
    # a cache from before evaluation sets (and roles): the generic folder, a test set
    assert cache_eval_set({"model": "m"}) == {"eval_set": "folder", "role": "clean",
                                              "ood_split": "", "set_role": "test",
                                              "eval_member": "", "corruption": "", "severity": 0}


def _cache(samples, logits, classes=("a", "b", "c")):
    logits = np.asarray(logits, np.float32)
    return cache_dataset(logits, logits.argmax(1), samples=samples, classes=list(classes),
                         attrs={"model": "m", "dataset_name": "val", "mode": "plain",
                                "pass_index": 0})


def test_an_overlay_adds_a_label_set_on_the_cache_samples_and_scores_top1():
    cache = _cache(["x/1.png", "x/2.png", "y/3.png"], [[3, 1, 0], [0, 2, 1], [0, 0, 5]])
    overlay = Overlay("real", {"y/3.png": [0, 2], "x/1.png": [1], "x/2.png": [],
                               "z/9.png": [0]}, classes=("a", "b", "c"))
    out = apply_overlay(cache, overlay)
    assert out["label_set"].dims == ("sample", "class")
    # rows follow the cache's sample order, not the overlay's
    assert out["label_set"].values.tolist() == [[False, True, False], [False, False, False],
                                                [True, False, True]]
    assert out.attrs["overlay"] == "real" and out.attrs["overlay_n_unlabelled"] == 1
    assert out.attrs["checksum"] == dataset_checksum(out) != cache.attrs["checksum"]
    assert "label_set" not in cache  # the cache itself is left as it was
    correct, labelled = overlay_correct(out)  # argmax: a, b, c
    assert correct.tolist() == [False, False, True] and labelled.tolist() == [True, False, True]
    correct, _ = overlay_correct(out, predicted=[1, 1, 0])
    assert correct.tolist() == [True, False, True]
    with pytest.raises(ValueError, match=r"predicted must be 3 class indices in \[0, 3\)"):
        overlay_correct(out, predicted=[1, 1, 3])
    with pytest.raises(ValueError, match="apply an overlay first"):
        overlay_correct(cache)


def test_an_overlay_refuses_samples_it_lacks_unless_told_to_drop_them():
    cache = _cache(["x/1.png", "x/2.png", "y/3.png"], np.eye(3))
    overlay = Overlay("real", {"x/2.png": [1]})
    with pytest.raises(InputError, match=r"overlay 'real' has no labels for 2 of the cache's 3 "
                                         r"samples: \['x/1.png', 'y/3.png'\]"):
        apply_overlay(cache, overlay)
    out = apply_overlay(cache, overlay, drop_missing=True)
    assert out["sample"].values.tolist() == ["x/2.png"]
    assert out["logits"].values.tolist() == [[0, 1, 0]] and out.attrs["overlay_n_dropped"] == 2
    assert overlay_correct(out)[0].tolist() == [True]
    with pytest.raises(InputError, match="is of 2 classes"):
        apply_overlay(cache, Overlay("o", {s: [0] for s in cache["sample"].values},
                                     classes=("a", "b")))
    with pytest.raises(InputError, match="gives sample 'y/3.png' class index 3, but the cache "
                                         "has 3 classes"):
        apply_overlay(cache, Overlay("o", {"x/1.png": [0], "x/2.png": [], "y/3.png": [3]}))


def test_overlay_files_round_trip_and_bad_ones_are_named(tmp_path):
    overlay = Overlay("real", {"a.png": [3, 1, 3], "b.png": []}, classes=("c0", "c1", "c2", "c3"))
    assert overlay.labels["a.png"] == (1, 3)  # sorted, without repeats
    back = read_overlay(write_overlay(overlay, tmp_path / "o.json"))
    assert back == overlay
    bad = tmp_path / "bad.json"
    for content, match in (("{", "is not JSON"),
                           (json.dumps({"kind": "other"}), "kind must be"),
                           (json.dumps([[1]]), "got 'list'"),
                           (json.dumps({"kind": "uqvision.label_overlay", "labels": {"a": [-1]}}),
                            r"labels\['a'\] must hold class indices"),
                           (json.dumps({"kind": "uqvision.label_overlay", "labels": {"a": 1}}),
                            r"labels\['a'\] must be a list"),
                           (json.dumps({"kind": "uqvision.label_overlay", "labels": [1]}),
                            "labels must be a mapping")):
        bad.write_text(content)
        with pytest.raises(InputError, match=f"overlay file '{bad}'.*{match}"):
            read_overlay(bad)


def test_real_json_is_keyed_by_validation_file_name(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps([[5], [], [2, 7]]))  # images 1, 2 and 3
    ids = ["n01/ILSVRC2012_val_00000003.JPEG", "ILSVRC2012_val_00000002.JPEG",
           "n01/ILSVRC2012_val_00000009.JPEG", "n01/other.JPEG"]
    overlay = real_overlay(real, ids)
    assert dict(overlay.labels) == {ids[0]: (2, 7), ids[1]: ()}
    real.write_text(json.dumps({"a": 1}))
    with pytest.raises(InputError, match="must hold a list of label lists"):
        real_overlay(real, ids)
