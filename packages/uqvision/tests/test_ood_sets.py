"""OpenOOD v1.5's ImageNet OOD sets: registered with their near/far split, recorded in the
caches; the ID/OOD overlap check by the decoded pixels (folders, archives, image lists: an ID
image re-saved as PNG is refused, one re-encoded or resized reported as a near duplicate by its
perceptual hash, and the kept hashes never trusted for a file changed in place); and
``uqvision sweep --ood-sets``, which predicts each OOD set once per model (resumed) after
checking it disjoint from ``--data``.

The sweeps run in process on a thread-based Dask cluster, as tests/test_sweep_sets.py's do
(its Dask hygiene fixture is reused).
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from PIL import Image
from test_sweep_sets import RANDOM, _dask_globals_kept, client  # noqa: F401  (fixtures)
from uqmetrics import InputError

from uqvision.cli import main
from uqvision.data import (
    NEAR_DUPLICATE_DISTANCE,
    ImageFolderDataset,
    NearDuplicateWarning,
    check_disjoint,
    content_hashes,
    make_digits_folder,
)
from uqvision.evalsets import EVAL_SETS, OOD_SPLITS, EvalSet, cache_eval_set, eval_set_attrs
from uqvision.predict import PredictConfig
from uqvision.sweep import check_ood_targets, sweep_targets

OPENOOD = {"ssb-hard": "near", "ninco": "near", "inaturalist": "far", "textures": "far",
           "openimage-o": "far", "imagenet-o": "far", "ood-near": "near", "ood-far": "far"}


def _noise(path, seed: int) -> None:
    rng = np.random.default_rng(seed + 100)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path, "JPEG")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """--data (digits), an OpenOOD tree with test_ninco.txt, a Textures class folder, and an
    OOD folder holding a copy of a --data image under another name."""
    base = tmp_path_factory.mktemp("ood")
    data = make_digits_folder(base / "digits", max_per_class=3) / "test"
    root = base / "openood" / "data"
    listed = [f"ninco/cls{i % 2}/img{i}.jpg" for i in range(4)]
    for i, rel in enumerate(listed):
        _noise(root / "images_largescale" / rel, i)
    lst = root / "benchmark_imglist" / "imagenet" / "test_ninco.txt"
    lst.parent.mkdir(parents=True)
    lst.write_text("".join(f"{rel} -1\n" for rel in listed))
    textures = base / "dtd" / "images"
    for i in range(3):
        _noise(textures / ("banded" if i < 2 else "woven") / f"t{i}.jpg", 10 + i)
    leaky = base / "leaky"
    for i in range(2):
        _noise(leaky / "x" / f"o{i}.jpg", 20 + i)
    first = ImageFolderDataset(data).sample_ids[0]
    shutil.copy(data / first, leaky / "x" / "copy_under_another_name.png")
    return {"data": data, "list": lst, "textures": textures, "leaky": leaky, "first": first}


def test_the_ood_sets_are_registered_with_their_openood_split():
    for name, split in OPENOOD.items():
        es = EVAL_SETS[name]
        assert (es.role, es.class_map, es.ood_split) == ("ood", "none", split), name
    assert {es.ood_split for es in EVAL_SETS.values() if es.role != "ood"} == {""}
    assert OOD_SPLITS == ("near", "far", "")
    with pytest.raises(ValueError, match="ood_split must be 'near' or 'far' for a set of role "
                                         "'ood'"):
        EvalSet("x", "ood", "none", "d")
    with pytest.raises(ValueError, match=r"eval set 'x' \(role 'clean'\) got 'far'"):
        EvalSet("x", "clean", "by_name", "d", ood_split="far")


def test_the_caches_record_the_split_and_older_caches_read_with_their_sets():
    attrs = eval_set_attrs("ssb-hard", None)
    assert attrs == {"eval_set": "ssb-hard", "role": "ood", "set_role": "ood-near",
                     "ood_split": "near"}
    assert cache_eval_set(attrs)["ood_split"] == "near"
    # written before ood_split: the registered set's; an unknown set's or a clean one's: ""
    assert cache_eval_set({"eval_set": "imagenet-o", "role": "ood"})["ood_split"] == "far"
    assert cache_eval_set({"eval_set": "gone", "role": "ood"})["ood_split"] == ""
    assert cache_eval_set({"eval_set": "imagenet-v2"})["ood_split"] == ""


def test_an_id_image_copied_under_another_name_is_found_by_its_pixels(tree, tmp_path):
    n = check_disjoint(tree["data"], tree["list"], name="ninco")  # disjoint: passes
    assert n == 4
    with pytest.raises(InputError, match=(
            r"^leaky: 1 of its 3 images are images of --data '.*test' \(the same pixels, "
            r"SHA-256 of the decoded RGB, whatever the file format\): "
            rf"\(ID '{tree['first']}', OOD 'x/copy_under_another_name.png'\); an ID "
            r"image in an OOD set is an error, not a silent overlap")):
        check_disjoint(tree["data"], tree["leaky"], name="leaky")
    # through an archive too, and the hashes kept on disk are read back
    archive = tmp_path / "leaky.tar"
    with tarfile.open(archive, "w") as tf:
        tf.add(tree["leaky"], arcname="leaky")
    kept = tmp_path / "hashes"
    with pytest.raises(InputError, match=r"1 of its 3 images"):
        check_disjoint(tree["data"], archive, name="tar", cache_dir=kept)
    assert len(list(kept.glob("*.json"))) == 2
    again = content_hashes(ImageFolderDataset(archive), cache_dir=kept)
    assert again == content_hashes(ImageFolderDataset(tree["leaky"]))


# -- uqvision sweep --ood-sets ------------------------------------------------------------------

def _sweep(tree, out, client, *extra):  # noqa: F811  (the fixture's name)
    return main(["--threads", "1", "sweep", "--models", RANDOM, "--random-init", "--data",
                 str(tree["data"]), "--calibration-size", "0.3", "--scheduler",
                 client.scheduler.address, "--out", str(out), *extra])


def test_the_sweep_predicts_each_ood_set_once_and_resumes(tree, tmp_path, client,  # noqa: F811
                                                          capsys):
    out = tmp_path / "s"
    ood = ["--ood-sets", f"ninco={tree['list']}", f"ood-far:dtd={tree['textures']}"]
    assert _sweep(tree, out, client, "--dry-run", *ood) == 0
    dry = capsys.readouterr().out
    assert "2 OOD set(s): checked disjoint from --data by content hash" in dry
    assert not (out / "caches").exists()
    assert _sweep(tree, out, client, *ood) == 0
    assert "computed 3, skipped 0" in capsys.readouterr().out
    names = {p.name: p for p in (out / "caches").glob("*.nc")}
    assert sorted(names) == [f"{RANDOM}.dtd.plain-000.nc", f"{RANDOM}.ninco.plain-000.nc",
                             f"{RANDOM}.test.plain-000.nc"]
    for dataset, eval_set, split, n in (("ninco", "ninco", "near", 4),
                                        ("dtd", "ood-far", "far", 3)):
        with xr.open_dataset(names[f"{RANDOM}.{dataset}.plain-000.nc"]) as ds:
            assert (ds.attrs["eval_set"], ds.attrs["role"], ds.attrs["ood_split"]) == (
                eval_set, "ood", split)
            assert ds.sizes["sample"] == n and set(ds["label"].values.tolist()) == {-1}
    assert len(list((out / "content_hashes").glob("*.json"))) == 3
    assert _sweep(tree, out, client, *ood) == 0  # resumed: nothing computed
    assert "computed 0, skipped 3" in capsys.readouterr().out


@pytest.mark.parametrize("value, message", [
    ("ood-near={leaky}", ("--ood-sets 'ood-near={leaky}': 1 of its 3 images are images of "
                         "--data")),
    ("imagenet-v2={leaky}", ("--ood-sets 'imagenet-v2={leaky}': evaluation set of role "
                            "'shifted', not 'ood', 'imagenet-v2'; known: imagenet-o, ssb-hard")),
    ("ninco", "--ood-sets 'ninco': not EVALSET=PATH (e.g. ninco=/data/ninco"),
])
def test_a_bad_or_overlapping_ood_set_is_one_line_before_any_model_runs(
        tree, tmp_path, client, capsys, value, message):  # noqa: F811
    value = value.format(leaky=tree["leaky"])
    out = tmp_path / "s"
    assert _sweep(tree, out, client, "--ood-sets", value) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqvision sweep: error: ") and err.count("\n") == 1, err
    assert message.format(leaky=tree["leaky"]) in err, err
    assert not list(out.glob("caches/*.nc"))


def test_ood_targets_take_the_sweeps_prediction_options(tree):
    config = PredictConfig(embeddings=True, extra_variables=("head_weight",))
    data = ImageFolderDataset(tree["data"])
    targets = sweep_targets(data, config, ood_sets=[f"ninco={tree['list']}"])
    assert [t.dataset_name for t in targets] == ["test", "ninco"]
    t = targets[1]
    assert (t.option, t.config.eval_set, t.config.embeddings, t.config.extra_variables) == (
        "--ood-sets", "ninco", True, ("head_weight",))
    assert check_ood_targets(data, targets) == 4
    with pytest.raises(InputError, match="its dataset name 'ninco' .* is --ood-sets "):
        sweep_targets(data, config, ood_sets=[f"ninco={tree['list']}", f"ninco={tree['leaky']}"])


# -- the same image in another file format, re-encoded or resized -------------------------------

def _photo(seed: int, size=(64, 48)) -> Image.Image:
    """A photograph-like image: a smooth random field and a little grain."""
    rng = np.random.default_rng(seed)
    low = Image.fromarray(rng.integers(0, 255, (4, 5, 3), dtype=np.uint8)).resize(size,
                                                                                  Image.BICUBIC)
    grain = rng.normal(0, 6, (size[1], size[0], 3))
    return Image.fromarray(np.clip(np.asarray(low) + grain, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """--data: 6 JPEG photographs in 2 classes; an OOD folder of 3 other photographs."""
    base = tmp_path_factory.mktemp("photos")
    for i in range(6):
        (base / "id" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        _photo(i).save(base / "id" / f"c{i % 2}" / f"p{i}.jpg", quality=90)
    (base / "ood" / "x").mkdir(parents=True)
    for i in range(3):
        _photo(50 + i).save(base / "ood" / "x" / f"o{i}.jpg", quality=90)
    return base


def _ood_with(photos, tmp_path, name: str, image: Image.Image, **save) -> Path:
    ood = tmp_path / "ood"
    shutil.copytree(photos / "ood", ood)
    image.save(ood / "x" / name, **save)
    return ood


def test_an_id_jpeg_resaved_as_png_is_refused_by_its_pixels(photos, tmp_path):
    """Before, the overlap check compared the files' bytes: a PNG of an ID JPEG's pixels was
    scored as OOD."""
    check_disjoint(photos / "id", photos / "ood", name="ood")  # disjoint, nothing near: passes
    pixels = Image.open(photos / "id" / "c1" / "p3.jpg").convert("RGB")
    ood = _ood_with(photos, tmp_path, "resaved.png", pixels)
    with pytest.raises(InputError, match=r"^ood: 1 of its 4 images are images of --data "
                                         r"'.*id' \(the same pixels, SHA-256 of the decoded "
                                         r"RGB, whatever the file format\): \(ID 'c1/p3.jpg', "
                                         r"OOD 'x/resaved.png'\)"):
        check_disjoint(photos / "id", ood, name="ood")
    # the same pixels in grey levels stored as RGB: the models see the same image too
    grey = Image.open(photos / "id" / "c0" / "p0.jpg").convert("L")
    (photos / "grey" / "g").mkdir(parents=True)
    grey.save(photos / "grey" / "g" / "a.png")
    grey.convert("RGB").save(ood / "x" / "grey_as_rgb.png")
    assert content_hashes(ood)["x/grey_as_rgb.png"] == content_hashes(photos / "grey")["g/a.png"]


@pytest.mark.parametrize("how, save", [
    ("jpeg q75", {"quality": 75}),
    ("jpeg q30", {"quality": 30}),
    ("half size", {"quality": 90}),
])
def test_an_id_image_reencoded_or_resized_is_reported_as_a_near_duplicate(photos, tmp_path, how,
                                                                          save):
    image = Image.open(photos / "id" / "c0" / "p2.jpg").convert("RGB")
    if how == "half size":
        image = image.resize((image.width // 2, image.height // 2), Image.BILINEAR)
    ood = _ood_with(photos, tmp_path, "again.jpg", image, **save)
    with pytest.warns(NearDuplicateWarning) as caught:
        assert check_disjoint(photos / "id", ood, name="ood") == 4  # reported, not refused
    (w,) = caught
    msg = str(w.message)
    assert msg.startswith(f"ood: 1 of its 4 images are near duplicates of images of --data "
                          f"{str(photos / 'id')!r} (perceptual hash within "
                          f"{NEAR_DUPLICATE_DISTANCE} of 64 bits"), msg
    assert "(ID 'c0/p2.jpg', OOD 'x/again.jpg', " in msg and "\n" not in msg
    check_disjoint(photos / "id", ood, name="ood", near_distance=None)  # not looked for


def test_kept_hashes_are_keyed_by_content_not_by_size_and_time(photos, tmp_path):
    """An OOD file overwritten in place with an ID image's pixels, its size and modification
    time kept: the kept hashes of the earlier check are never taken for it (before, they were
    keyed by path, size and time, and the copy passed)."""
    ood, kept = tmp_path / "ood", tmp_path / "kept"
    (ood / "x").mkdir(parents=True)
    _photo(70).save(ood / "x" / "a.png", compress_level=0)  # stored: the size is the pixels'
    _photo(71).save(ood / "x" / "b.png", compress_level=0)
    assert check_disjoint(photos / "id", ood, name="ood", cache_dir=kept) == 2
    target = ood / "x" / "a.png"
    st = target.stat()
    Image.open(photos / "id" / "c0" / "p4.jpg").convert("RGB").save(target, compress_level=0)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    with pytest.raises(InputError, match=r"\(ID 'c0/p4.jpg', OOD 'x/a.png'\)"):
        check_disjoint(photos / "id", ood, name="ood", cache_dir=kept)


def test_the_sweep_reports_near_duplicates_in_one_line_and_goes_on(photos, tmp_path, client,  # noqa: F811
                                                                   capsys):
    image = Image.open(photos / "id" / "c1" / "p1.jpg").convert("RGB")
    ood = _ood_with(photos, tmp_path, "again.jpg", image, quality=60)
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", RANDOM, "--random-init", "--data",
                 str(photos / "id"), "--calibration-size", "0.5", "--scheduler",
                 client.scheduler.address, "--out", str(out), "--ood-sets",
                 f"ood-far={ood}"]) == 0
    err = capsys.readouterr().err
    (line,) = [t for t in err.splitlines() if "near duplicates" in t]
    assert line.startswith(f"uqvision sweep: note: --ood-sets 'ood-far={ood}': 1 of its 4 "
                           "images are near duplicates of images of --data "), line
    assert "(ID 'c1/p1.jpg', OOD 'x/again.jpg', " in line
    assert len(list((out / "caches").glob("*.nc"))) == 2
