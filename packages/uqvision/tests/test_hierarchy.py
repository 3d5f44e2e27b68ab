"""The generated ``hierarchy`` image set (docs/conventions.md#v-0): determinism, balance, roles,
soft labels, superclass structure recovered by Ward clustering, and a small CNN's accuracy
band."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.stats import kstest
from sklearn.metrics import adjusted_rand_score

from uqvision import hierarchy
from uqvision.data import ImageFolderDataset
from uqvision.hierarchy import (
    FAMILIES,
    MIXED,
    SCALES,
    SPLITS,
    HierarchyScale,
    class_prototypes,
    make_hierarchy,
    read_hierarchy,
)

SMOKE = SCALES["smoke"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return make_hierarchy(tmp_path_factory.mktemp("hier") / "h", scale="smoke", seed=0)


@pytest.fixture(scope="module")
def info(smoke):
    return read_hierarchy(smoke)


def _digests(root):
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _load(info, split):
    """Images (n, 3, H, W) in [-0.5, 0.5] and labels (n,), in ImageFolder order."""
    ds = ImageFolderDataset(info.splits[split])
    x = np.stack([np.asarray(Image.open(ds.root / rel)) for rel in ds.sample_ids])
    return (torch.tensor(x).permute(0, 3, 1, 2).float() / 255 - 0.5,
            torch.tensor(ds.targets))


# --------------------------------------------------------------------------------------------
# determinism and layout

def test_same_seed_gives_byte_identical_files_and_another_seed_other_images(smoke, tmp_path):
    again = make_hierarchy(tmp_path / "again", scale="smoke", seed=0)
    ref = _digests(smoke)
    assert _digests(again) == ref
    other = _digests(make_hierarchy(tmp_path / "other", scale="smoke", seed=1))
    assert other.keys() == ref.keys()
    images = [k for k in ref if k.endswith(".png")]
    # every image has its own pixel noise: no image of seed 1 repeats its seed-0 counterpart
    assert all(other[k] != ref[k] for k in images)


def test_every_class_has_exactly_the_scale_counts_of_32px_rgb_images(smoke, info):
    assert len(info.classes) == SMOKE.n_classes == len(set(info.classes))
    for split in (*SPLITS, MIXED):
        n = getattr(SMOKE, split)
        ds = ImageFolderDataset(info.splits[split])
        assert ds.classes == list(info.classes)
        assert np.bincount(ds.targets, minlength=len(info.classes)).tolist() \
            == [n] * len(info.classes)
    with Image.open(info.splits["test"] / info.classes[0] / "00000.png") as im:
        assert (im.mode, im.size) == ("RGB", (SMOKE.image_size, SMOKE.image_size))
    # nothing but the documented files (and the record of them, uqmetrics.runs.io.folder_replaced),
    # no temporary folder left beside the output
    assert sorted(p.name for p in smoke.iterdir()) == sorted(
        [".uqmetrics-written.json", "classes.json", *SPLITS, MIXED])
    assert [p.name for p in smoke.parent.iterdir()] == [smoke.name]


def test_classes_json_records_format_scale_seed_and_difficulty(info):
    meta = json.loads((info.root / "classes.json").read_text())
    assert meta["format_version"] == hierarchy.FORMAT_VERSION == info.format_version
    assert (info.scale, info.seed) == ("smoke", 0)
    assert meta["scale"]["train"] == SMOKE.train
    assert meta["augmentation"]["noise_std"] == hierarchy.AUGMENTATION.noise_std
    # sorted folder order is superclass-major: the class index groups superclasses together
    assert list(info.classes) == sorted(info.classes)
    assert np.all(np.diff(info.superclass_index) >= 0)
    assert len(info.superclasses) == SMOKE.superclasses
    families = [e["family"] for e in meta["classes"]]
    assert set(families) <= set(FAMILIES.names())
    assert len(set(families)) == SMOKE.superclasses  # one family per superclass


@pytest.mark.parametrize("name", SCALES.names())
def test_roles_upstream_is_first_half_downstream_whole_superclasses_in_groups(name):
    sc = SCALES[name]
    tree = hierarchy.dataset._class_tree(sc, seed=0)
    superclasses = list(dict.fromkeys(c.superclass for c in tree))
    upstream_sc = set(superclasses[:sc.superclasses // 2])
    assert {c.superclass for c in tree if c.role == "upstream"} == upstream_sc
    down = [c for c in tree if c.role == "downstream"]
    assert all(c.group is None for c in tree if c.role == "upstream")
    groups = {}
    for c in down:
        groups.setdefault(c.group, set()).add(c.superclass)
    assert len(groups) == sc.downstream_groups >= 2
    # each downstream superclass lies in exactly one group, and none is upstream
    flat = [s for ss in groups.values() for s in ss]
    assert len(flat) == len(set(flat)) == sc.superclasses - len(upstream_sc)
    assert not set(flat) & upstream_sc


def test_scales_meet_the_protocol_minimum_sizes():
    cpu = SCALES["cpu"]
    assert cpu.superclasses >= 8 and cpu.classes_per_superclass >= 6 and cpu.n_classes >= 48
    assert SMOKE.downstream_groups >= 2
    assert "smoke" in SCALES.describe() and "cpu" in SCALES.describe()


def test_reader_exposes_roles_and_groups_of_the_written_set(info):
    assert set(info.roles.values()) == {"upstream", "downstream"}
    grouped = [c for cs in info.downstream_groups.values() for c in cs]
    assert sorted(grouped) == sorted(c for c in info.classes if info.roles[c] == "downstream")
    assert set(grouped).isdisjoint(info.upstream_classes)
    assert len(info.upstream_classes) == (SMOKE.superclasses // 2) * SMOKE.classes_per_superclass


def test_prototypes_differ_between_classes_and_lie_in_unit_range():
    p = class_prototypes("smoke", seed=0)
    assert p.shape == (SMOKE.n_classes, SMOKE.image_size, SMOKE.image_size, 3)
    assert p.min() >= 0 and p.max() <= 1
    flat = p.reshape(len(p), -1)
    d = np.abs(flat[:, None] - flat[None]).mean(-1)
    assert np.all(d[~np.eye(len(p), dtype=bool)] > 0.01)


# --------------------------------------------------------------------------------------------
# soft labels of the mixed set

def test_soft_labels_are_distributions_over_two_classes_of_one_superclass(info):
    ds = ImageFolderDataset(info.splits[MIXED])
    assert list(info.mixed_files) == ds.sample_ids
    p = info.soft_labels
    assert p.shape == (len(ds), len(info.classes))
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
    assert np.all((info.mixed_alpha >= 0) & (info.mixed_alpha <= 1))
    a, b = info.mixed_pairs.T
    assert np.all(a != b)
    sup = info.superclass_index
    assert np.all(sup[a] == sup[b])
    # each image is filed under its class of larger weight
    assert np.array_equal(p.argmax(1), ds.targets)
    # alpha ~ U(0, 1): Kolmogorov-Smirnov at the 0.1 % level
    assert kstest(info.mixed_alpha, "uniform").pvalue > 1e-3


def test_mixed_image_is_the_alpha_blend_of_the_two_class_images_under_one_draw(info):
    sc = SCALES[info.scale]
    tree = hierarchy.dataset._class_tree(sc, info.seed)
    index = {c: i for i, c in enumerate(info.classes)}
    for rel, (a, b), alpha in zip(info.mixed_files, info.mixed_pairs, info.mixed_alpha):
        folder, stem = rel.split("/")
        a2, b2, alpha2, draw = hierarchy.dataset._mixed_draw(
            info.seed, index[folder], int(stem[:-4]), sc.image_size, sc.classes_per_superclass)
        assert (a2, b2, alpha2) == (a, b, alpha)

        def image(c, d=draw):
            drawn = hierarchy.patterns._colour(tree[c], sc.image_size, d)
            return hierarchy.patterns._jitter(drawn, d)

        expected = np.clip(alpha * image(a) + (1 - alpha) * image(b), 0, 1) * 255
        stored = np.asarray(Image.open(info.splits[MIXED] / rel), dtype=float)
        # uint8 rounding: at most half a level (plus float error)
        assert np.abs(stored - expected).max() <= 0.5 + 1e-6


# --------------------------------------------------------------------------------------------
# structure: features cluster by superclass; a small CNN is neither at chance nor perfect

def test_ward_clustering_of_class_mean_features_recovers_the_superclasses(info):
    x, y = _load(info, "train")
    x = x.numpy().reshape(len(x), 3, -1)
    proj = np.random.default_rng(0).normal(size=(x.shape[1] * x.shape[2], 8))
    feats = np.concatenate([x.mean(-1), x.reshape(len(x), -1) @ proj / np.sqrt(proj.shape[0])], 1)
    means = np.stack([feats[y.numpy() == k].mean(0) for k in range(len(info.classes))])
    means = (means - means.mean(0)) / means.std(0)
    clusters = fcluster(linkage(means, "ward"), t=len(info.superclasses), criterion="maxclust")
    truth = info.superclass_index
    ari = adjusted_rand_score(truth, clusters)
    # null: the same clustering scored against permuted superclass labels; exceeding all 999
    # permutations has probability 1/1000 if the clusters carried no superclass information
    rng = np.random.default_rng(0)
    null = [adjusted_rand_score(rng.permutation(truth), clusters) for _ in range(999)]
    assert ari > max(null)


def test_small_cnn_beats_chance_by_binomial_margin_and_is_not_perfect(info, tmp_path):
    """The V.0 difficulty band, with the project's own components: ``uqvision_cnn`` trained by
    the one loop (AdamW + OneCycle, 15 epochs, no augmentation) on ``train/``, scored through the
    one prediction path on ``test/``."""
    from uqvision.predict import PredictConfig, predict
    from uqvision.training.loop import ADAMW_RECIPE, ImageTrainConfig, train_model

    run = train_model(info.splits["train"], tmp_path / "cnn", ImageTrainConfig(
        arch="uqvision_cnn", model_kwargs={"width": 16}, hparams=ADAMW_RECIPE, epochs=15,
        batch_size=64, augment=None))
    (cache,) = predict(f"uqvision_cnn={run.checkpoint}", info.splits["test"], PredictConfig())
    acc = float((cache["logits"].values.argmax(1) == cache["label"].values).mean())
    c, n = len(info.classes), cache.sizes["sample"]
    # under chance each test image is right with p0 = 1/C: 4 binomial standard errors above it
    p0 = 1 / c
    assert acc > p0 + 4 * np.sqrt(p0 * (1 - p0) / n)
    assert acc < 1.0


# --------------------------------------------------------------------------------------------
# arguments, overwrite, atomic writing, reader errors

@pytest.mark.parametrize("kwargs, match", [
    ({"scale": "huge"}, "huge"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
])
def test_bad_arguments_raise_value_error_naming_them(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_hierarchy(tmp_path / "h", **kwargs)
    assert not (tmp_path / "h").exists()


def test_existing_output_is_refused_unless_overwrite(smoke, tmp_path):
    out = tmp_path / "h"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match=str(out)):
        make_hierarchy(out, scale="smoke")
    assert (out / "keep.txt").read_text() == "mine"
    # --overwrite replaces only a folder the dataset makers wrote (issue 36)
    with pytest.raises(ValueError, match="is not a folder uqvision data wrote"):
        make_hierarchy(out, scale="smoke", overwrite=True)
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    make_hierarchy(out, scale="smoke", seed=1)
    make_hierarchy(out, scale="smoke", overwrite=True)
    assert _digests(out) == _digests(smoke)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h"]
    # an existing empty folder holds nothing to overwrite
    empty = tmp_path / "empty"
    empty.mkdir()
    assert read_hierarchy(make_hierarchy(empty, scale="smoke")).classes


def test_a_failure_midway_leaves_neither_output_nor_temporary_folder(tmp_path, monkeypatch):
    calls = []
    png = hierarchy.dataset._png

    def failing(arr):
        calls.append(1)
        if len(calls) > 20:
            raise RuntimeError("disk full")
        return png(arr)

    monkeypatch.setattr(hierarchy.dataset, "_png", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        make_hierarchy(tmp_path / "h", scale="smoke")
    assert list(tmp_path.iterdir()) == []


def test_reader_refuses_missing_or_foreign_folders(smoke, tmp_path):
    with pytest.raises(FileNotFoundError, match="classes.json"):
        read_hierarchy(tmp_path)
    meta = json.loads((smoke / "classes.json").read_text())
    (tmp_path / "classes.json").write_text(json.dumps({**meta, "format_version": 999}))
    with pytest.raises(ValueError, match="version 999"):
        read_hierarchy(tmp_path)


@pytest.mark.parametrize("change, match", [
    ({"superclasses": len(FAMILIES) + 1}, "superclasses"),
    ({"classes_per_superclass": 1}, "classes_per_superclass"),
    ({"downstream_groups": 1}, "downstream_groups"),
    ({"downstream_groups": 4}, "downstream_groups"),
    ({"train": 0}, "train"),
])
def test_scale_definitions_are_validated(change, match):
    fields = {k: getattr(SMOKE, k) for k in SMOKE.__dataclass_fields__}
    with pytest.raises(ValueError, match=match):
        HierarchyScale(**{**fields, **change})
