"""Hostile inputs to class matching and cache identity ("no silent wrong result, no lost file").

Classes are matched BY NAME between an evaluation folder and a model (a renamed class folder is
an error naming the classes; a subset of the model's classes is scored in the model's class
space), and a prediction cache is reused only when its full identity matches the request
(otherwise an error naming what differs, before anything is computed, or a recompute with
``--overwrite``). Every refusal exits with code 2 and ONE line naming the input, and leaves
every earlier output byte for byte as it was.
"""

import hashlib
import json
import shutil

import numpy as np
import pytest
import torch
from uqmetrics import InputError

from uqvision.cache import read_cache
from uqvision.cli import main
from uqvision.data import check_split_classes, match_classes
from uqvision.predict import PredictConfig, check_caches, predict, predict_to_files


def _hashes(folder, pattern="*"):
    """SHA-256 of every file under ``folder`` matching ``pattern`` (relative path -> digest)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob(pattern)) if p.is_file()}


def _caches(folder):
    """:func:`_hashes` of the cache files only (a run also writes its configuration file,
    ``predict.<digest>.config.toml``, beside them)."""
    return _hashes(folder, "*.nc")


def _error_line(capsys):
    """The command's stderr: exactly one line, returned."""
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err, err
    return err


def _predict(spec, data, out, *extra):
    return main(["predict", "--model", spec, "--data", str(data), "--out", str(out),
                 "--dataset-name", "t", "--batch-size", "32", *map(str, extra)])


def _copy_classes(src, dst, rename=None, keep=None):
    """Copy the class folders of ``src`` to ``dst`` (``keep``: only these; ``rename``: old ->
    new folder names)."""
    for d in sorted(p for p in src.iterdir() if p.is_dir()):
        if keep is None or d.name in keep:
            shutil.copytree(d, dst / (rename or {}).get(d.name, d.name))
    return dst


@pytest.fixture(scope="module")
def full_cache(spec, digits, tmp_path_factory):
    """The plain cache of the full digits test folder."""
    (path,) = predict_to_files(spec, digits / "test", tmp_path_factory.mktemp("full"),
                               PredictConfig(batch_size=32), dataset_name="t")
    return read_cache(path)


# -- 1. classes are matched by name ----------------------------------------------------------
def test_a_renamed_class_folder_is_an_error_listing_the_names(spec, digits, tmp_path, capsys):
    """Folder ``0`` renamed ``zero``: before, every label shifted silently (sorted order puts
    ``zero`` last); now an error naming the unknown class and the model's classes."""
    renamed = _copy_classes(digits / "test", tmp_path / "renamed", rename={"0": "zero"})
    out = tmp_path / "caches"
    assert _predict(spec, digits / "test", out) == 0  # an earlier result in the same --out
    capsys.readouterr()  # its output (the progress of its prediction on stderr)
    before = _hashes(out)
    assert _predict(spec, renamed, out, "--dataset-name", "r") == 2
    err = _error_line(capsys)
    assert str(renamed) in err and "['zero']" in err
    assert "'0', '1', '2', '3', '4', '5', '6', '7', '8', '9'" in err  # the model's classes
    assert _hashes(out) == before  # nothing written, nothing changed


def test_a_subset_folder_is_scored_in_the_model_class_space(spec, digits, tmp_path, full_cache):
    """3 of the 10 classes: labels are the model's indices of those classes, the logits and
    the accuracy those of the same images in the full folder, the mapping recorded."""
    sub = _copy_classes(digits / "test", tmp_path / "subset", keep={"2", "5", "7"})
    (path,) = predict_to_files(spec, sub, tmp_path / "c", PredictConfig(batch_size=32),
                               dataset_name="t")
    ds = read_cache(path)
    assert list(ds["class"].values) == [str(d) for d in range(10)]  # the model's classes
    assert set(ds["label"].values.tolist()) == {2, 5, 7}
    assert ds["in_folder"].values.tolist() == [0, 0, 1, 0, 0, 1, 0, 1, 0, 0]
    assert ds.attrs["class_mapping"] == "name" and ds.attrs["class_names_source"] == "sidecar"
    assert json.loads(ds.attrs["folder_classes"]) == ["2", "5", "7"]
    same = full_cache.sel(sample=ds["sample"].values)  # the same images, in the full folder
    np.testing.assert_array_equal(ds["label"].values, same["label"].values)
    np.testing.assert_allclose(ds["logits"].values, same["logits"].values, rtol=1e-5,
                               atol=1e-5)
    acc = (ds["logits"].values.argmax(1) == ds["label"].values).mean()
    assert acc == (same["logits"].values.argmax(1) == same["label"].values).mean()


def test_the_full_folder_records_its_mapping(full_cache):
    assert full_cache.attrs["class_mapping"] == "name"
    assert full_cache["in_folder"].values.tolist() == [1] * 10
    np.testing.assert_array_equal(  # labels of folder "d" are the model's class "d"
        full_cache["label"].values,
        [int(s.split("/")[0]) for s in full_cache["sample"].values])


def test_match_classes_names_unknown_and_model_classes():
    assert match_classes(["b", "d"], ["a", "b", "c", "d"], folder="F", model="M").tolist() == [1, 3]
    with pytest.raises(InputError, match=r"'F' has 2 class\(es\) that model 'M' does not have: "
                                         r"\['x', 'y'\]; the model's classes are \['a', 'b'\]"):
        match_classes(["a", "x", "y"], ["a", "b"], folder="F", model="M")


def test_a_model_without_class_names_takes_the_folder_order_and_records_it(digits, tmp_path):
    """A bare timm checkpoint (no sidecar): the folder's sorted classes, as many as the head's
    outputs, recorded as ``folder_order``; a subset of its classes needs the names, which a
    hand-written sidecar gives."""
    import timm

    ckpt = tmp_path / "bare.pth"
    torch.save(timm.create_model("test_resnet", num_classes=10).state_dict(), ckpt)
    renamed = _copy_classes(digits / "test", tmp_path / "renamed", rename={"0": "zero"})
    (ds,) = predict(f"test_resnet={ckpt}", renamed, PredictConfig(batch_size=32))
    assert ds.attrs["class_mapping"] == "folder_order" and ds.attrs["class_names_source"] == ""
    assert list(ds["class"].values) == [*map(str, range(1, 10)), "zero"]
    sub = _copy_classes(digits / "test", tmp_path / "subset", keep={"2", "5", "7"})
    with pytest.raises(InputError, match=r"records no class names and has a 10-class head, but "
                                         r"image folder .*subset' has 3 classes"):
        predict(f"test_resnet={ckpt}", sub, PredictConfig(batch_size=32))
    ckpt.with_suffix(".json").write_text(json.dumps({"classes": [str(d) for d in range(10)]}))
    (named,) = predict(f"test_resnet={ckpt}", sub, PredictConfig(batch_size=32))
    assert named.attrs["class_mapping"] == "name" and set(named["label"].values) == {2, 5, 7}


def test_an_imagenet_checkpoint_matches_wordnet_ids(tmp_path):
    """A 1,000-class checkpoint of an ImageNet-1k timm model without a sidecar: its classes are
    the WordNet ids, so a folder of 3 of them (as ImageNet-R holds 200) is scored by name."""
    import timm
    from PIL import Image
    from timm.data import ImageNetInfo

    wnids = ImageNetInfo("imagenet-1k").label_names()
    picked = [wnids[7], wnids[300], wnids[999]]
    root = tmp_path / "inet"
    rng = np.random.default_rng(0)
    for c in picked:
        (root / c).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(root / c / "a.png")
    ckpt = tmp_path / "r.safetensors"
    from safetensors.torch import save_file

    save_file(timm.create_model("test_resnet.r160_in1k").state_dict(), str(ckpt))
    (ds,) = predict(f"test_resnet.r160_in1k={ckpt}", root, PredictConfig(batch_size=4))
    assert ds.attrs["class_names_source"] == "imagenet-1k" and ds.sizes["class"] == 1000
    assert ds["label"].values.tolist() == [7, 300, 999]
    (root / "not_a_wnid").mkdir()
    shutil.copy(root / picked[0] / "a.png", root / "not_a_wnid" / "a.png")
    with pytest.raises(InputError, match=r"\['not_a_wnid'\]; the model's classes are "
                                         r"\['n01440764'"):
        predict(f"test_resnet.r160_in1k={ckpt}", root, PredictConfig(batch_size=4))


# -- 1. ... and in the reproductions' --data roots -----------------------------------------
@pytest.fixture
def renamed_root(digits, tmp_path):
    """A data root whose test classes are the train classes under other names (sorted in the
    reverse order: before, the Pitfalls study scored 0.000 accuracy instead of 0.625)."""
    root = tmp_path / "root"
    _copy_classes(digits / "train", root / "train")
    _copy_classes(digits / "train", root / "val")
    _copy_classes(digits / "test", root / "test", rename={str(d): f"k{9 - d}" for d in range(10)})
    return root


@pytest.mark.parametrize("driver", ["pitfalls", "uimnet", "url"])
def test_a_reproduction_refuses_test_classes_the_train_split_lacks(driver, renamed_root,
                                                                   tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.md").write_text("an earlier result\n")
    before = _hashes(out)
    data = (["--upstream", str(renamed_root), "--downstream", str(renamed_root)]
            if driver == "url" else ["--data", str(renamed_root)])
    assert main(["reproduce", driver, "--scale", "smoke", "--arch", "test_resnet",
                 "--out", str(out), *data]) == 2
    err = _error_line(capsys)
    assert str(renamed_root / "test") in err and "train folder" in err
    assert "'k0', 'k1', 'k2'" in err and "'0', '1', '2'" in err  # the names on both sides
    after = _hashes(out)
    assert {k: v for k, v in after.items() if k in before} == before
    assert not [k for k in after if k.endswith((".safetensors", ".nc"))]


def test_split_classes_allow_a_test_subset_but_not_a_val_subset(digits, tmp_path):
    sub = _copy_classes(digits / "test", tmp_path / "sub", keep={"1", "3"})
    assert check_split_classes(digits / "train", {"test": sub}) == [str(d) for d in range(10)]
    with pytest.raises(InputError, match=r"val folder .*sub' lacks 8 class\(es\) of the train "
                                         r"folder"):
        check_split_classes(digits / "train", {"val": sub}, same=("val",))


# -- 2. a cache is reused only when its full identity matches ------------------------------
IDENTITY_CASES = {
    # name: (first run's options, second run's options, what the message must name)
    "other_data": ([], ["--data-other"], "dataset"),
    "other_policy": (["--mode", "tta", "--passes", "1", "--tta-policy", "crop"],
                     ["--mode", "tta", "--passes", "1", "--tta-policy", "cifar"],
                     "tta_policy 'crop' vs 'cifar'"),
    "other_seed": (["--mode", "tta", "--passes", "1", "--tta-policy", "crop"],
                   ["--mode", "tta", "--passes", "1", "--tta-policy", "crop", "--seed", "7"],
                   "seed 0 vs 7"),
    "other_passes": (["--mode", "mc_dropout", "--passes", "2"],
                     ["--mode", "mc_dropout", "--passes", "3"], "passes 2 vs 3"),
}


@pytest.mark.parametrize("case", IDENTITY_CASES)
def test_a_cache_of_other_inputs_is_an_error_and_is_kept(case, spec, digits, tmp_path, capsys):
    """Before, the second run exited 0 and kept the first run's cache as if it were the one
    asked for; now it exits 2 naming the cache and the field (cached vs now), and
    ``--overwrite`` recomputes it."""
    first, second, named = IDENTITY_CASES[case]
    other = digits / "test"
    if "--data-other" in second:  # the training images: same classes, other files
        second, other = [], digits / "train"
    out = tmp_path / "caches"
    assert _predict(spec, digits / "test", out, *first) == 0
    capsys.readouterr()
    before = _hashes(out)  # every file: a refused run writes nothing, its configuration neither
    assert _predict(spec, other, out, *second) == 2
    err = _error_line(capsys)
    assert "was computed from other inputs" in err and named in err
    assert str(out / next(iter(_caches(out)))) in err  # the cache it refuses to replace
    if case == "other_data":
        assert f"'{digits / 'test'}'" in err and f"'{digits / 'train'}'" in err
    assert _hashes(out) == before
    assert _predict(spec, other, out, *second, "--overwrite") == 0
    assert _hashes(out) != before


def test_the_same_inputs_resume_and_new_tta_passes_are_added(spec, digits, tmp_path):
    out = tmp_path / "caches"
    tta = ["--mode", "tta", "--tta-policy", "crop"]
    assert _predict(spec, digits / "test", out, *tta, "--passes", "2") == 0
    before = _caches(out)
    assert _predict(spec, digits / "test", out, *tta, "--passes", "2") == 0
    assert _caches(out) == before  # complete caches of the same identity are kept
    assert _predict(spec, digits / "test", out, *tta, "--passes", "3") == 0
    after = _caches(out)  # pass p depends on (seed, p, sample) only: passes 0, 1 are reused
    assert {k: after[k] for k in before} == before and len(after) == 3


def test_nothing_is_computed_when_one_of_several_models_has_a_conflicting_cache(
        trained, digits, tmp_path, capsys):
    """``--model A --model B``: B's cache of another folder is found before A runs."""
    models = tmp_path / "models"
    models.mkdir()
    for stem in ("a", "b"):
        shutil.copy(trained.checkpoint, models / f"{stem}.safetensors")
        shutil.copy(trained.checkpoint.with_suffix(".json"), models / f"{stem}.json")
    a, b = (f"test_byobnet={models / s}.safetensors" for s in "ab")
    out = tmp_path / "caches"
    assert _predict(b, digits / "train", out) == 0
    capsys.readouterr()
    before = _hashes(out)
    assert main(["predict", "--model", a, "--model", b, "--data", str(digits / "test"),
                 "--out", str(out), "--dataset-name", "t"]) == 2
    assert "test_byobnet+b.t.plain-000.nc" in _error_line(capsys)
    assert _hashes(out) == before  # A's cache was not computed


def test_a_changed_checkpoint_is_named(trained, digits, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    ckpt = tmp_path / "m.safetensors"
    shutil.copy(trained.checkpoint, ckpt)
    shutil.copy(trained.checkpoint.with_suffix(".json"), ckpt.with_suffix(".json"))
    out = tmp_path / "caches"
    assert _predict(f"test_byobnet={ckpt}", digits / "test", out) == 0
    capsys.readouterr()
    before = _hashes(out)
    state = load_file(str(ckpt))  # retrained in place: other weights, the same file name
    save_file({k: v + 0.01 if v.is_floating_point() else v for k, v in state.items()}, str(ckpt))
    assert _predict(f"test_byobnet={ckpt}", digits / "test", out) == 2
    assert "checkpoint_sha256" in _error_line(capsys)
    assert _hashes(out) == before


def test_swag_samples_are_recomputed_when_their_batchnorm_folder_changed(digits, tmp_path,
                                                                         capsys):
    """SWAG recomputes each sample's BatchNorm statistics on the run's training folder, so its
    images make the samples' logits. Before, an image of that folder replaced by another left
    the caches reused (exit 0, the old folder's logits, not those a fresh run gives); now the
    folder's fingerprint is part of the identity: the same folder resumes, a changed one is
    refused naming ``train_data_fingerprint``, and ``--overwrite`` gives the fresh logits."""
    from uqvision.training.loop import ImageTrainConfig, train_model

    train = _copy_classes(digits / "train", tmp_path / "train")
    hp = {"batch_size": "16", "pretrain_epochs": "1", "swag_epochs": "1",
          "collect_epochs": "0.25", "rank": "3"}
    ckpt = train_model(train, tmp_path / "swag.safetensors", ImageTrainConfig(
        arch="test_byobnet", method="swag", input_size=16, seed=0, hparams=hp)).checkpoint
    swag = f"test_byobnet={ckpt}"
    out = tmp_path / "caches"
    assert _predict(swag, digits / "test", out, "--samples", "2") == 0
    before = _hashes(out)
    old = [read_cache(p)["logits"].values for p in sorted(out.glob("*.nc"))]
    assert _predict(swag, digits / "test", out, "--samples", "2") == 0
    assert _hashes(out) == before  # the same folder: resumed
    for a, b in zip(sorted((train / "3").iterdir())[:6], sorted((train / "5").iterdir()),
                    strict=False):
        shutil.copyfile(b, a)  # other images under the same names
    capsys.readouterr()
    assert _predict(swag, digits / "test", out, "--samples", "2") == 2
    assert "train_data_fingerprint" in _error_line(capsys)
    assert _hashes(out) == before
    fresh = [c["logits"].values for c in predict(swag, digits / "test",
                                                 PredictConfig(samples=2, batch_size=32))]
    assert _predict(swag, digits / "test", out, "--samples", "2", "--overwrite") == 0
    caches = [read_cache(p)["logits"].values for p in sorted(out.glob("*.nc"))]
    assert all(np.array_equal(c, f) for c, f in zip(caches, fresh, strict=True))
    assert all(np.abs(c - o).max() > 1e-4 for c, o in zip(caches, old, strict=True))


def test_swag_samples_are_recomputed_when_the_index_file_of_their_view_changed(digits,
                                                                                 tmp_path, capsys):
    """A run trained on an index file's view of its folder (UIMNET's in-domain split)
    recomputes its samples' BatchNorm on that view: the index file rewritten in place (other
    positions, the folder unchanged) changes the samples' logits, so it refuses the caches."""
    from uqvision.protocols.uimnet.index import make_index_files
    from uqvision.training.loop import ImageTrainConfig, train_model

    train = _copy_classes(digits / "train", tmp_path / "train")
    classes = tuple(sorted(p.name for p in train.iterdir() if p.is_dir()))
    files = [make_index_files(train, classes, tmp_path / f"index{k}", seed=k,
                              val_fraction=0.5)["train"] for k in (0, 1)]
    hp = {"batch_size": "16", "pretrain_epochs": "1", "swag_epochs": "1",
          "collect_epochs": "0.25", "rank": "3"}
    ckpt = train_model(train, tmp_path / "swag.safetensors", ImageTrainConfig(
        arch="test_byobnet", method="swag", input_size=16, seed=0, hparams=hp, classes=classes,
        index_file=str(files[0]))).checkpoint
    swag, out = f"test_byobnet={ckpt}", tmp_path / "caches"
    assert _predict(swag, digits / "test", out, "--samples", "2") == 0
    before = _hashes(out)
    shutil.copyfile(files[1], files[0])  # the other seed's positions, under the same name
    capsys.readouterr()
    assert _predict(swag, digits / "test", out, "--samples", "2") == 2
    line = _error_line(capsys)
    assert "train_data_fingerprint" in line and line.count("...+index:") == 2, line
    assert _hashes(out) == before


def test_a_foreign_file_at_a_cache_path_is_never_replaced(spec, digits, tmp_path, capsys):
    out = tmp_path / "caches"
    paths, missing = check_caches(spec, digits / "test", out, PredictConfig(),
                                  dataset_name="t")
    (path,) = paths.values()
    assert missing == {(0, 0)}
    out.mkdir()
    import xarray as xr
    from uqmetrics import write_dataset

    write_dataset(xr.Dataset({"x": ("n", np.arange(3.0))}), path)  # complete, not a cache
    before = _hashes(out)
    assert _predict(spec, digits / "test", out) == 2
    err = _error_line(capsys)
    assert str(path) in err and "not a uqvision prediction cache" in err
    assert _hashes(out) == before


def test_a_cache_that_left_images_out_is_reused_only_when_skipping_is_allowed(spec, digits,
                                                                              tmp_path):
    folder = _copy_classes(digits / "test", tmp_path / "f")
    (folder / "3" / "zz_bad.png").write_bytes(b"not an image")
    out = tmp_path / "caches"
    skip = PredictConfig(batch_size=32, skip_bad_images=True)
    (path,) = predict_to_files(spec, folder, out, skip, dataset_name="t")
    assert read_cache(path).attrs["n_skipped_images"] == 1
    before = _hashes(out)
    with pytest.raises(InputError, match=r"skipped_images 1 vs 0"):
        predict_to_files(spec, folder, out, PredictConfig(batch_size=32), dataset_name="t")
    _, missing = check_caches(spec, folder, out, skip, dataset_name="t")
    assert not missing  # the same request resumes
    with pytest.raises(InputError, match=r"skipped_images 1 vs 0"):  # the caches, checked alone
        check_caches(spec, folder, out, PredictConfig(), dataset_name="t")
    assert _hashes(out) == before
