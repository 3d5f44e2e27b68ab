"""Label ambiguity in the ``hierarchy`` generator (docs/conventions.md#v-0, issue 41): the default
unchanged byte for byte, blended images whose labels are drawn from their exact label
distributions, the reader of those distributions, and nested class-stratified subsets."""

from __future__ import annotations

import csv
import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from scipy.stats import kstest
from uqmetrics import InputError

from uqvision import hierarchy
from uqvision.data import ImageFolderDataset
from uqvision.hierarchy import (
    LABEL_DISTRIBUTIONS,
    MIXED,
    SCALES,
    SPLITS,
    make_hierarchy,
    read_hierarchy,
    read_label_distributions,
    stratified_subset,
)
from uqvision.hierarchy.dataset import _ambiguity_draw, _n_blended, _rng
from uqvision.hierarchy.patterns import _colour, _draw, _jitter

SMOKE = SCALES["smoke"]
AMBIGUITY = 0.5
#: SHA-256 over every file of ``make_hierarchy(scale="smoke", seed=0)`` (sorted relative path;
#: a PNG by its decoded pixels, so the zlib build does not matter; other files by their bytes),
#: computed with the generator as it was before the ``ambiguity`` option existed.
SMOKE_SEED0_DIGEST = "21c720e537cacb3f55dc0a4380c8fbe3970c94b449f0399aa7d466e973a22c28"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return make_hierarchy(tmp_path_factory.mktemp("plain") / "h", scale="smoke", seed=0)


@pytest.fixture(scope="module")
def ambiguous(tmp_path_factory):
    return make_hierarchy(tmp_path_factory.mktemp("amb") / "h", scale="smoke", seed=0,
                          ambiguity=AMBIGUITY)


def _digests(root):
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _pixel_digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        if p.suffix == ".png":
            with Image.open(p) as im:
                a = np.asarray(im)
            h.update(repr((im.mode, a.shape)).encode() + a.tobytes())
        else:
            h.update(p.read_bytes())
    return h.hexdigest()


def _rows(root, split):
    with open(root / split / LABEL_DISTRIBUTIONS, newline="") as f:
        return list(csv.DictReader(f))


def _blends(root):
    """``(split, row)`` of every blended image of a set made with ambiguity."""
    return [(s, r) for s in SPLITS for r in _rows(root, s)
            if r["file"].split("/")[1].startswith("blend-")]


# --------------------------------------------------------------------------------------------
# the default is today's set

def test_default_is_byte_identical_to_the_set_before_the_option(plain, tmp_path):
    assert _pixel_digest(plain) == SMOKE_SEED0_DIGEST
    explicit = make_hierarchy(tmp_path / "zero", scale="smoke", seed=0, ambiguity=0.0)
    assert _digests(explicit) == _digests(plain)
    meta = json.loads((plain / "classes.json").read_text())
    assert "ambiguity" not in meta and "label_distributions" not in meta
    assert read_hierarchy(plain).ambiguity == 0.0
    assert not any(plain.rglob(LABEL_DISTRIBUTIONS))


def test_plain_set_reads_as_one_hot_distributions_in_imagefolder_order(plain):
    for split in SPLITS:
        ld = read_label_distributions(plain, split)
        ds = ImageFolderDataset(plain / split)
        assert list(ld.files) == ds.sample_ids
        np.testing.assert_array_equal(ld.probs, np.eye(len(ds.classes))[ds.targets])
        assert np.all(ld.entropy == 0) and not ld.blended.any()


# --------------------------------------------------------------------------------------------
# a set with ambiguity

def test_ambiguous_set_is_deterministic_and_changes_only_the_blended_slots(plain, ambiguous,
                                                                          tmp_path):
    # the seed fixes every byte: the val split written again (the whole set would cost seconds)
    tree = hierarchy.dataset._class_tree(SMOKE, 0)
    hierarchy.dataset._write_ambiguous_split(tmp_path / "val", tree, SMOKE, 0, "val", AMBIGUITY)
    assert _digests(tmp_path / "val") == _digests(ambiguous / "val")
    amb = _digests(ambiguous)
    ref = _digests(plain)
    # the mixed set and every image not blended are the default's files, byte for byte
    same = [k for k in amb if k.endswith(".png") and "/blend-" not in k]
    assert same and all(amb[k] == ref[k] for k in same)
    assert all(amb[k] == ref[k] for k in ref if k.startswith(f"{MIXED}/"))
    info = read_hierarchy(ambiguous)
    assert info.ambiguity == AMBIGUITY
    assert info.meta["label_distributions"] == {s: f"{s}/{LABEL_DISTRIBUTIONS}" for s in SPLITS}
    # the fraction and the weight law are recorded in the data's metadata (V.8); the default
    # set (ambiguity 0) records neither (its bytes unchanged)
    assert info.meta["ambiguity_weight_law"] == "uniform(0, 1)"
    assert "ambiguity_weight_law" not in read_hierarchy(plain).meta


def test_each_class_blends_its_first_slots_with_a_partner_of_its_superclass(ambiguous):
    info = read_hierarchy(ambiguous)
    index = {c: i for i, c in enumerate(info.classes)}
    sup = info.superclass_index
    for split in SPLITS:
        n, k = getattr(SMOKE, split), _n_blended(getattr(SMOKE, split), AMBIGUITY)
        slots = {}
        for r in _rows(ambiguous, split):
            folder, name = r["file"].split("/")
            if name.startswith("blend-"):
                i, j = (int(t) for t in name[len("blend-"):-len(".png")].split("-"))
                a, b = index[r["class_a"]], index[r["class_b"]]
                assert (a, info.classes[a]) == (i, r["class_a"]) and a != b
                assert sup[a] == sup[b] and index[folder] in (a, b)
            else:
                i, j = index[folder], int(name[:-len(".png")])
                assert r["class_a"] == r["class_b"] == folder and float(r["alpha"]) == 1.0
            slots.setdefault(i, []).append(j)
        # every slot exactly once; blends are the first floor(F n + 1/2)
        assert {i: sorted(js) for i, js in slots.items()} == {
            i: list(range(n)) for i in range(len(info.classes))}
        assert k == round(AMBIGUITY * n) > 0


def test_recorded_distributions_sum_to_one_align_with_imagefolder_and_give_entropy(ambiguous):
    for split in SPLITS:
        ld = read_label_distributions(ambiguous, split)
        ds = ImageFolderDataset(ambiguous / split)
        assert list(ld.files) == ds.sample_ids
        np.testing.assert_array_equal(ld.labels, ds.targets)
        assert ld.probs.shape == (len(ds), len(ds.classes)) and ld.probs.dtype == np.float64
        np.testing.assert_allclose(ld.probs.sum(1), 1.0, atol=1e-12)
        assert ld.probs.min() >= 0
        # the filed label has positive probability under the image's distribution
        assert np.all(ld.probs[np.arange(len(ds)), ds.targets] > 0)
        q = ld.probs[ld.blended]
        q = np.sort(q, 1)[:, -2:]
        np.testing.assert_allclose(ld.entropy[ld.blended],
                                   -(q * np.log(q)).sum(1), rtol=1e-12, atol=1e-15)
        assert np.all(ld.entropy[~ld.blended] == 0) and ld.entropy.max() <= np.log(2)
        assert ld.blended.sum() == len(ds.classes) * _n_blended(getattr(SMOKE, split),
                                                                AMBIGUITY)
    mixed = read_label_distributions(ambiguous, MIXED)
    np.testing.assert_allclose(mixed.probs, read_hierarchy(ambiguous).soft_labels)


def test_drawn_labels_match_the_weights_within_binomial_error(ambiguous):
    """In each quarter of alpha, the count of blends labelled ``class_a`` lies within 4
    standard errors (sum of alpha (1 - alpha)) of its expectation (sum of alpha); a swapped
    weight or a majority label fails by many standard errors."""
    rows = [r for _, r in _blends(ambiguous)]
    alpha = np.array([float(r["alpha"]) for r in rows])
    is_a = np.array([r["file"].split("/")[0] == r["class_a"] for r in rows])
    assert len(rows) >= 200
    for lo in (0.0, 0.25, 0.5, 0.75):
        m = (alpha >= lo) & (alpha < lo + 0.25 + (lo == 0.75))
        assert m.sum() >= 30
        se = np.sqrt((alpha[m] * (1 - alpha[m])).sum())
        assert abs(is_a[m].sum() - alpha[m].sum()) <= 4 * se


def test_the_ambiguity_draw_follows_its_documented_law():
    """10,000 draws: alpha ~ U(0, 1) (Kolmogorov-Smirnov at 0.1 %), the partner another class
    of the superclass, uniformly (4 binomial standard errors), and the label ``class_a`` with
    probability alpha in every tenth of alpha (4 standard errors)."""
    n, per = 10_000, 3
    draws = [_ambiguity_draw(np.random.default_rng([7, j]), 4, per) for j in range(n)]
    alpha = np.array([d.alpha for d in draws])
    partner = np.array([d.class_b for d in draws])
    is_a = np.array([d.label == d.class_a for d in draws])
    assert {d.class_a for d in draws} == {4} and set(partner) == {3, 5}
    assert abs((partner == 3).sum() - n / 2) <= 4 * np.sqrt(n / 4)
    assert kstest(alpha, "uniform").pvalue > 1e-3
    for lo in np.arange(10) / 10:
        m = (alpha >= lo) & (alpha < lo + 0.1 + (lo == 0.9))
        se = np.sqrt((alpha[m] * (1 - alpha[m])).sum())
        assert abs(is_a[m].sum() - alpha[m].sum()) <= 4 * se


def test_the_uniform_law_is_the_default_draw_byte_for_byte(ambiguous, tmp_path):
    """``weight_law="uniform"`` (named, or as classes.json records it) is the default: the
    same draws from the same streams, the same files."""
    for j in range(200):
        assert _ambiguity_draw(np.random.default_rng([3, j]), 4, 3) == _ambiguity_draw(
            np.random.default_rng([3, j]), 4, 3, hierarchy.parse_weight_law("uniform(0, 1)"))
    tree = hierarchy.dataset._class_tree(SMOKE, 0)
    hierarchy.dataset._write_ambiguous_split(tmp_path / "val", tree, SMOKE, 0, "val", AMBIGUITY,
                                             ("uniform", ()))
    assert _digests(tmp_path / "val") == _digests(ambiguous / "val")
    again = make_hierarchy(tmp_path / "u", scale="smoke", seed=0, ambiguity=AMBIGUITY,
                           weight_law="uniform")
    assert _digests(again) == _digests(ambiguous)


#: Beta laws checked: skewed towards class_b, and U-shaped (most blends nearly pure).
BETA_LAWS = [(2.0, 5.0), (0.5, 0.5)]


@pytest.mark.parametrize("a, b", BETA_LAWS)
def test_the_beta_law_draws_beta_weights_from_the_slot_stream(a, b):
    """n = 20,000 draws of ``beta(a, b)``: by the Dvoretzky-Kiefer-Wolfowitz inequality (with
    Massart's constant), P(sup |F_n - F| > eps) <= 2 exp(-2 n eps^2), so with eps for a
    false-alarm probability of 1e-6 the test fails a correct generator once in a million
    runs. The weights are rounded to 6 decimals (|round(x) - x| <= h = 5e-7), which moves the
    empirical CDF by at most sup_x F(x + h) - F(x) more: added to eps. The label is class_a
    with probability alpha (4 binomial standard errors per tenth of alpha), and the image draw
    before it is the slot's own (the partner: the same as the uniform law's)."""
    from scipy.stats import beta as beta_law

    n, per, h, false_alarm = 20_000, 3, 5e-7, 1e-6
    law = hierarchy.parse_weight_law(f"beta({a}, {b})")
    draws = [_ambiguity_draw(np.random.default_rng([11, j]), 4, per, law) for j in range(n)]
    alpha = np.sort([d.alpha for d in draws])
    cdf = beta_law(a, b).cdf
    ecdf_hi = np.arange(1, n + 1) / n
    ecdf_lo = np.arange(n) / n
    sup = max(np.max(np.abs(ecdf_hi - cdf(alpha))), np.max(np.abs(ecdf_lo - cdf(alpha))))
    grid = np.concatenate([[0.0], np.linspace(0, 1 - h, 200_001), [1 - h]])
    slack = float(np.max(cdf(grid + h) - cdf(grid)))
    eps = np.sqrt(np.log(2 / false_alarm) / (2 * n))
    assert sup <= eps + slack, (sup, eps, slack)
    # the same bound refuses U(0, 1) draws: the test can fail
    uniform = np.sort([d.alpha for d in (_ambiguity_draw(np.random.default_rng([11, j]), 4,
                                                          per) for j in range(n))])
    assert np.max(np.abs(ecdf_hi - cdf(uniform))) > eps + slack
    # the partner is drawn before the weight, from the same stream: unchanged by the law
    assert [d.class_b for d in draws[:500]] == [
        _ambiguity_draw(np.random.default_rng([11, j]), 4, per).class_b for j in range(500)]
    is_a = np.array([d.label == d.class_a for d in draws])
    alpha = np.array([d.alpha for d in draws])
    for lo in np.arange(10) / 10:
        m = (alpha >= lo) & (alpha < lo + 0.1 + (lo == 0.9))
        se = np.sqrt((alpha[m] * (1 - alpha[m])).sum())
        assert abs(is_a[m].sum() - alpha[m].sum()) <= 4 * se + 1e-9


def test_a_beta_set_records_its_law_and_its_distributions(ambiguous, tmp_path):
    root = make_hierarchy(tmp_path / "b", scale="smoke", seed=0, ambiguity=AMBIGUITY,
                          weight_law="beta(2, 0.5)")
    info = read_hierarchy(root)
    # the fraction and the law with its parameters, in the data's metadata (V.8)
    assert (info.ambiguity, info.meta["ambiguity_weight_law"]) == (AMBIGUITY, "beta(2, 0.5)")
    assert hierarchy.parse_weight_law(info.meta["ambiguity_weight_law"]) == ("beta", (2.0, 0.5))
    # only the blends differ from the uniform set: the plain images and the mixed set are its
    new, ref = _digests(root), _digests(ambiguous)
    plain_files = [k for k in ref if k.endswith(".png") and "/blend-" not in k]
    assert all(new[k] == ref[k] for k in plain_files)
    assert [float(r["alpha"]) for r in _rows(root, "train")] != [
        float(r["alpha"]) for r in _rows(ambiguous, "train")]
    # the truth keeps its definition: each image's distribution is (alpha, 1 - alpha) over
    # its two classes, its entropy the binary entropy of alpha
    for split in SPLITS:
        dist = read_label_distributions(root, split)
        rows = {r["file"]: float(r["alpha"]) for r in _rows(root, split)}
        files = list(dist.files)  # ImageFolder order
        w = np.array([rows[f] for f in files])
        h = -(w * np.log(w, where=w > 0, out=np.zeros_like(w))
              + (1 - w) * np.log(1 - w, where=w < 1, out=np.zeros_like(w)))
        np.testing.assert_allclose(dist.entropy, h, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(dist.probs.max(axis=1), np.maximum(w, 1 - w), rtol=1e-12)


def test_blended_image_is_the_alpha_blend_of_the_two_patterns_under_the_slot_draw(ambiguous):
    info = read_hierarchy(ambiguous)
    tree = hierarchy.dataset._class_tree(SMOKE, 0)
    index = {c: i for i, c in enumerate(info.classes)}
    size = SMOKE.image_size
    for split, r in _blends(ambiguous):
        folder, name = r["file"].split("/")
        i, j = (int(t) for t in name[len("blend-"):-len(".png")].split("-"))
        rng = _rng(0, split, i, j)
        draw = _draw(rng, size)
        amb = _ambiguity_draw(rng, i, SMOKE.classes_per_superclass)
        assert (info.classes[amb.class_a], info.classes[amb.class_b], f"{amb.alpha:.6f}",
                info.classes[amb.label]) == (r["class_a"], r["class_b"], r["alpha"], folder)
        a, b = index[r["class_a"]], index[r["class_b"]]
        w = float(r["alpha"])

        def image(c, d=draw):
            return _jitter(_colour(tree[c], size, d), d)

        expected = np.clip(w * image(a) + (1 - w) * image(b), 0, 1) * 255
        stored = np.asarray(Image.open(ambiguous / split / r["file"]), dtype=float)
        # uint8 rounding: at most half a level (plus float error)
        assert np.abs(stored - expected).max() <= 0.5 + 1e-6


# --------------------------------------------------------------------------------------------
# errors

@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.5"])
def test_ambiguity_outside_the_unit_interval_is_refused(tmp_path, bad):
    with pytest.raises(InputError, match="ambiguity"):
        make_hierarchy(tmp_path / "h", scale="smoke", ambiguity=bad)
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("law, message", [
    ("gamma(2, 2)", "unknown weight law 'gamma'; known: uniform, beta(a, b)"),
    ("beta(0, 2)", "a must be a positive finite number, got 0"),
    ("beta(2, -0.5)", "b must be a positive finite number, got -0.5"),
    ("beta(inf, 1)", "a must be a positive finite number, got inf"),
    ("beta(2)", "beta takes 2 parameters (a, b), got 1"),
    ("beta(a, b)", "the parameters must be numbers, got (a, b)"),
    ("uniform(0, 2)", ("uniform takes no parameters (or those it is recorded with: "
                       "uniform(0, 1)), got (0, 2)")),
    ("", "not a weight law; give NAME or NAME(p1, p2), one of uniform, beta(a, b)"),
])
def test_a_bad_weight_law_is_refused_naming_the_option(tmp_path, law, message):
    with pytest.raises(InputError) as err:
        make_hierarchy(tmp_path / "h", scale="smoke", ambiguity=0.5, weight_law=law)
    assert str(err.value) == f"weight_law (--weight-law) {law!r}: {message}"
    assert not (tmp_path / "h").exists()


def test_a_weight_law_without_ambiguity_is_refused(tmp_path):
    # no image would draw from it: refused rather than ignored
    with pytest.raises(InputError, match=r"^weight_law \(--weight-law\) 'beta\(2, 5\)' needs "
                       r"ambiguity > 0 \(--ambiguity F\)"):
        make_hierarchy(tmp_path / "h", scale="smoke", weight_law="beta(2, 5)")
    assert not (tmp_path / "h").exists()


def test_reader_refuses_an_unknown_split_or_a_file_list_that_does_not_match(ambiguous,
                                                                            tmp_path):
    with pytest.raises(InputError, match="split"):
        read_label_distributions(ambiguous, "holdout")
    import shutil

    copy = tmp_path / "h"
    shutil.copytree(ambiguous, copy)
    next((copy / "val").rglob("*.png")).unlink()
    with pytest.raises(InputError, match="does not list exactly"):
        read_label_distributions(copy, "val")


def test_data_hierarchy_command_passes_ambiguity_to_the_generator(tmp_path, monkeypatch, capsys):
    from uqvision.cli import main

    calls = []
    monkeypatch.setattr(hierarchy.dataset, "_write",
                        lambda root, sc, seed, ambiguity=0.0, law=("uniform", ()):
                        calls.append((sc.name, seed, ambiguity, law)))
    assert main(["data", "hierarchy", "--scale", "smoke", "--out", str(tmp_path / "a"),
                 "--ambiguity", "0.3"]) == 0
    assert main(["data", "hierarchy", "--scale", "smoke", "--out", str(tmp_path / "b")]) == 0
    assert main(["data", "hierarchy", "--scale", "smoke", "--out", str(tmp_path / "d"),
                 "--ambiguity", "0.3", "--weight-law", "beta(2, 0.5)"]) == 0
    assert calls == [("smoke", 0, 0.3, ("uniform", ())), ("smoke", 0, 0.0, ("uniform", ())),
                     ("smoke", 0, 0.3, ("beta", (2.0, 0.5)))]
    capsys.readouterr()
    assert main(["data", "hierarchy", "--scale", "smoke", "--out", str(tmp_path / "c"),
                 "--ambiguity", "2"]) == 2
    assert "ambiguity must be a fraction in [0, 1], got 2.0" in capsys.readouterr().err
    assert main(["data", "hierarchy", "--scale", "smoke", "--out", str(tmp_path / "e"),
                 "--ambiguity", "0.3", "--weight-law", "beta(0, 1)"]) == 2
    assert capsys.readouterr().err.strip() == (
        "uqvision data hierarchy: error: weight_law (--weight-law) 'beta(0, 1)': a must be a positive "
        "finite number, got 0")
    assert len(calls) == 3  # nothing written for the refused ones


# --------------------------------------------------------------------------------------------
# nested class-stratified subsets

@settings(deadline=None)
@given(counts=st.lists(st.integers(1, 40), min_size=1, max_size=6),
       f=st.lists(st.floats(0.001, 1.0), min_size=2, max_size=2), seed=st.integers(0, 2**16))
def test_stratified_subsets_are_nested_per_class_and_seeded(counts, f, seed):
    y = np.random.default_rng(seed).permutation(np.repeat(np.arange(len(counts)), counts))
    small, large = sorted(f)
    a, b = stratified_subset(y, small, seed=seed), stratified_subset(y, large, seed=seed)
    assert set(a) <= set(b) and np.all(np.diff(a) > 0)
    np.testing.assert_array_equal(a, stratified_subset(y, small, seed=seed))
    for c, n in enumerate(counts):
        assert (y[a] == c).sum() == max(1, int(np.floor(small * n + 0.5)))
    np.testing.assert_array_equal(stratified_subset(y, 1.0, seed=seed), np.arange(len(y)))


def test_training_subsets_of_the_written_split_are_nested_10_50_100(ambiguous):
    y = np.asarray(ImageFolderDataset(ambiguous / "train").targets)
    s10, s50, s100 = (set(stratified_subset(y, f, seed=3)) for f in (0.1, 0.5, 1.0))
    assert s10 < s50 < s100 == set(range(len(y)))
    counts = np.bincount(y[sorted(s50)], minlength=y.max() + 1)
    np.testing.assert_array_equal(counts, np.floor(0.5 * np.bincount(y) + 0.5))
    assert s50 != set(stratified_subset(y, 0.5, seed=4))


@pytest.mark.parametrize("kwargs, match", [
    ({"fraction": 0.0}, "fraction"), ({"fraction": 1.2}, "fraction"),
    ({"fraction": 0.5, "seed": -1}, "seed"),
    ({"fraction": 0.5, "labels": [[0, 1]]}, "labels"),
    ({"fraction": 0.5, "labels": [0.5, 1.0]}, "labels"),
])
def test_stratified_subset_refuses_bad_arguments(kwargs, match):
    kwargs = {"labels": [0, 0, 1], **kwargs}
    with pytest.raises(InputError, match=match):
        stratified_subset(**kwargs)
