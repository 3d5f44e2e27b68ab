"""ImageNet in the layouts it ships in (uqvision.layouts): class folders, the flat validation
folder with the devkit's or Kaggle's label file, tars of either and tars of per-class tars, and
the 200-class variants scored in the 1000-class space.

Every layout is built in miniature from real files (JPEGs, a devkit ``meta.mat`` written with
``scipy.io.savemat`` in the devkit's structure, a ``LOC_val_solution.csv``, tars made with
``tarfile``) and compared with the same images in class folders.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pickle
import pkgutil
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import timm
import torch
import xarray as xr
from PIL import Image
from timm.data import ImageNetInfo
from timm.data.readers.reader_image_in_tar import ReaderImageInTar
from torch.utils.data import DataLoader
from uqmetrics import InputError

from uqvision.cli import main
from uqvision.data import (
    DataConfig,
    ImageFolderDataset,
    check_images,
    dataset_fingerprint,
    eval_transform,
    folder_fingerprint,
    readable_images,
)
from uqvision.exceptions import BadImageError
from uqvision.layouts import LABEL_SEARCH, LAYOUTS, find_label_file

IN1K = ImageNetInfo("imagenet-1k").label_names()
#: Three ImageNet-1k classes (timm's order: sorted WordNet ids) and the devkit's
#: ILSVRC2012_ID of each, deliberately not their position: the devkit orders classes its own way.
PICKED = [IN1K[3], IN1K[101], IN1K[950]]
ILSVRC_ID = {PICKED[0]: 449, PICKED[1]: 7, PICKED[2]: 120}
#: Class of validation image i + 1 (ILSVRC2012_val_00000001 ... _00000008).
IMAGE_CLASS = [2, 0, 1, 0, 2, 1, 0, 2]
TRANSFORM = eval_transform(DataConfig((3, 16, 16), (0.5,) * 3, (0.25,) * 3, crop_pct=1.0))


def _name(i: int) -> str:
    return f"ILSVRC2012_val_{i:08d}.JPEG"


def _jpeg(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, w = 18 + seed % 5, 22 - seed % 4
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path, "JPEG")


def _write_meta(path: Path, extra_leaf: str = "n01440764") -> None:
    """A devkit ``meta.mat``: the ``synsets`` struct array (n x 1, as in the devkit) with
    ILSVRC2012_ID, WNID, words, gloss, num_children; leaves and one inner synset."""
    rows = [(ILSVRC_ID[w], w, ImageNetInfo().label_name_to_description(w), "a leaf", 0)
            for w in PICKED]
    rows += [(1, extra_leaf, "tench, Tinca tinca", "a leaf", 0),
             (1001, "n00001740", "entity", "the root", 3)]
    dt = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("gloss", "O"),
          ("num_children", "O")]
    synsets = np.zeros((len(rows), 1), dtype=dt)
    for i, row in enumerate(rows):
        synsets[i, 0] = row
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(path, {"synsets": synsets})


def _write_devkit(folder: Path, classes=IMAGE_CLASS) -> Path:
    devkit = folder / "ILSVRC2012_devkit_t12"
    _write_meta(devkit / "data" / "meta.mat")
    (devkit / "data" / "ILSVRC2012_validation_ground_truth.txt").write_text(
        "".join(f"{ILSVRC_ID[PICKED[c]]}\n" for c in classes))
    return devkit


def _write_csv(path: Path, classes=IMAGE_CLASS) -> Path:
    rows = [f"{_name(i + 1)[:-5]},{PICKED[c]} 1 2 30 40 {PICKED[c]} 3 4 10 12\n"
            for i, c in enumerate(classes)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("ImageId,PredictionString\n" + "".join(rows[::-1]))  # any row order
    return path


@pytest.fixture
def sets(tmp_path):
    """The same 8 validation images in every layout."""
    cf = tmp_path / "folders" / "val"
    flat = tmp_path / "imagenet" / "val"
    for i, c in enumerate(IMAGE_CLASS):
        _jpeg(flat / _name(i + 1), i)
        (cf / PICKED[c]).mkdir(parents=True, exist_ok=True)
        shutil.copy(flat / _name(i + 1), cf / PICKED[c] / _name(i + 1))
    devkit = _write_devkit(tmp_path / "imagenet")
    csv = _write_csv(tmp_path / "kaggle" / "LOC_val_solution.csv")
    with tarfile.open(tmp_path / "imagenet" / "ILSVRC2012_img_val.tar", "w") as tf:
        for i in range(len(IMAGE_CLASS)):
            tf.add(flat / _name(i + 1), arcname=_name(i + 1))
    with tarfile.open(tmp_path / "val_folders.tar", "w") as tf:
        tf.add(cf, arcname="val")  # one top folder, class folders in it
    with tarfile.open(tmp_path / "train_like.tar", "w") as outer:
        for w in PICKED:  # one <wnid>.tar per class, flat images inside, as ILSVRC2012_img_train
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as inner:
                for f in sorted((cf / w).iterdir()):
                    inner.add(f, arcname=f.name)
            ti = tarfile.TarInfo(f"{w}.tar")
            ti.size = len(buf.getvalue())
            outer.addfile(ti, io.BytesIO(buf.getvalue()))
    return {"folders": cf, "flat": flat, "devkit": devkit, "csv": csv,
            "tar_flat": tmp_path / "imagenet" / "ILSVRC2012_img_val.tar",
            "tar_folders": tmp_path / "val_folders.tar", "tar_tars": tmp_path / "train_like.tar"}


def _tensors(ds):
    ds = ds.with_transform(TRANSFORM)
    return torch.stack([ds[i][0] for i in range(len(ds))])


# -- 1. the same classes, targets and pixels in every layout ----------------------------------

@pytest.mark.parametrize("layout, key, labels", [
    ("flat", "flat", None),  # the devkit found beside the folder
    ("flat", "flat", "csv"),
    ("flat", "flat", "devkit_tgz"),
    ("tar/flat", "tar_flat", None),
    ("tar/flat", "tar_flat", "csv"),
    ("tar/class_folders", "tar_folders", None),
    ("tar/class_tars", "tar_tars", None),
])
def test_every_layout_gives_the_class_folders_samples(sets, tmp_path, layout, key, labels):
    if labels == "devkit_tgz":
        with tarfile.open(tmp_path / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as tf:
            tf.add(sets["devkit"], arcname="ILSVRC2012_devkit_t12")
        shutil.rmtree(sets["devkit"])
        label_path = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    else:
        label_path = sets.get(labels)
    ref = ImageFolderDataset(sets["folders"])
    ds = ImageFolderDataset(sets[key], labels=label_path)
    assert ds.layout == layout and LAYOUTS.lookup(layout.split("/")[0])
    assert ds.classes == ref.classes == sorted(PICKED)
    assert ds.targets == ref.targets
    assert [Path(r).name for r in ds.sample_ids] == [Path(r).name for r in ref.sample_ids]
    if layout.startswith("tar/class"):  # the path the image has once extracted
        assert ds.sample_ids == ref.sample_ids
    assert torch.equal(_tensors(ds), _tensors(ref))
    assert check_images(ds) == {} and readable_images(ds) is ds


def test_the_devkit_maps_ilsvrc_ids_through_meta_mat_not_by_position(sets):
    ds = ImageFolderDataset(sets["flat"])
    label_of = {rel: ds.classes[y] for rel, y in ds.samples}
    assert [label_of[_name(i + 1)] for i in range(8)] == [PICKED[c] for c in IMAGE_CLASS]
    assert ds.label_file.kind == "devkit" and ds.label_file.path == sets["devkit"]


def test_tar_members_and_bytes_match_timm_reader_image_in_tar(sets):
    """timm's ReaderImageInTar (tar of per-class tars, tar of class folders) lists the same
    images with the same bytes as the in-place reader."""
    for key in ("tar_tars", "tar_folders"):
        ds = ImageFolderDataset(sets[key])
        reader = ReaderImageInTar(str(sets[key]), cache_tarinfo=False)
        theirs = {}
        for i in range(len(reader)):
            fileobj, target = reader[i]
            name = f"{reader.class_idx_to_name[int(target)]}/{reader.filename(i, basename=True)}"
            theirs[name] = fileobj.read()
        ours = {rel: ds.source.read(rel) for rel in ds.sample_ids}
        assert ours == theirs and len(ours) == 8


def test_a_tar_dataset_pickles_and_reads_in_dataloader_workers(sets):
    ds = ImageFolderDataset(sets["tar_tars"], TRANSFORM)
    serial = _tensors(ds)
    assert torch.equal(pickle.loads(pickle.dumps(ds))[5][0], serial[5])
    ds[0]  # the parent's descriptor is open before the workers fork
    batches = DataLoader(ds, batch_size=3, num_workers=2)
    assert torch.equal(torch.cat([x for x, _, _ in batches]), serial)


# -- 2. identity: the layout and the label file's content ---------------------------------------

def _old_fingerprint(root: Path) -> str:
    """The class-folder fingerprint as it was before the layouts (caches must stay valid)."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    h = hashlib.sha256(json.dumps(classes).encode())
    for i, c in enumerate(classes):
        for f in sorted(p.relative_to(root).as_posix() for p in (root / c).rglob("*.JPEG")):
            h.update(f"{f}\0{i}\0{(root / f).stat().st_size}\n".encode())
    return "size:" + h.hexdigest()


def test_fingerprints_capture_layout_and_labelling(sets, tmp_path):
    assert dataset_fingerprint(sets["folders"]) == _old_fingerprint(sets["folders"])
    prints = {
        "folders": dataset_fingerprint(sets["folders"]),
        "devkit": dataset_fingerprint(sets["flat"]),
        "csv": dataset_fingerprint(sets["flat"], labels=sets["csv"]),
        "tar_flat": dataset_fingerprint(sets["tar_flat"]),
        "tar_folders": dataset_fingerprint(sets["tar_folders"]),
        "tar_tars": dataset_fingerprint(sets["tar_tars"]),
    }
    assert len(set(prints.values())) == len(prints)
    moved = shutil.copy(sets["csv"], tmp_path / "elsewhere.csv")  # same content: same identity
    assert dataset_fingerprint(sets["flat"], labels=moved) == prints["csv"]
    relabelled = _write_csv(tmp_path / "other" / "LOC_val_solution.csv",
                            [1, 0, 1, 0, 2, 1, 0, 2])  # image 1: another class
    other = ImageFolderDataset(sets["flat"], labels=relabelled)
    assert folder_fingerprint(other) != prints["csv"]
    assert other.targets != ImageFolderDataset(sets["flat"], labels=sets["csv"]).targets
    # a devkit archive holds the same files as the folder: the same labelling, the same identity
    with tarfile.open(tmp_path / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as tf:
        tf.add(sets["devkit"], arcname="ILSVRC2012_devkit_t12")
    assert dataset_fingerprint(sets["flat"], labels=tmp_path / "ILSVRC2012_devkit_t12.tar.gz") \
        == prints["devkit"]


# -- 3. where a label file is looked for -----------------------------------------------------------

def test_label_file_search_order(tmp_path):
    val = tmp_path / "a" / "b" / "val"
    _jpeg(val / _name(1), 0)
    assert find_label_file(val) is None
    _write_csv(tmp_path / "a" / "LOC_val_solution.csv")  # one folder up
    assert find_label_file(val) == tmp_path / "a" / "LOC_val_solution.csv"
    _write_csv(tmp_path / "a" / "b" / "LOC_val_solution.csv")  # beside: first
    assert find_label_file(val) == tmp_path / "a" / "b" / "LOC_val_solution.csv"
    devkit = _write_devkit(tmp_path / "a" / "b")  # the devkit before the csv in one folder
    assert find_label_file(val) == devkit
    kaggle = tmp_path / "kaggle" / "ILSVRC" / "Data" / "CLS-LOC" / "val"  # the Kaggle tree
    _jpeg(kaggle / _name(1), 0)
    _write_csv(tmp_path / "kaggle" / "LOC_val_solution.csv", [0])
    assert find_label_file(kaggle) == tmp_path / "kaggle" / "LOC_val_solution.csv"
    assert ImageFolderDataset(kaggle).classes == [PICKED[0]]


# -- 4. errors -------------------------------------------------------------------------------

def test_a_flat_folder_without_label_file_names_what_was_looked_for(tmp_path):
    val = tmp_path / "x" / "val"
    _jpeg(val / _name(1), 0)
    with pytest.raises(FileNotFoundError) as err:
        ImageFolderDataset(val)
    msg = str(err.value)
    assert "\n" not in msg and str(val) in msg and "--labels" in msg
    assert all(name in msg for name in LABEL_SEARCH)


def test_absent_and_unlabelled_images_are_refused_or_skipped(sets):
    (sets["flat"] / _name(3)).unlink()
    _jpeg(sets["flat"] / "extra.JPEG", 9)
    ds = ImageFolderDataset(sets["flat"])
    assert _name(3) in ds.sample_ids and "extra.JPEG" not in ds.sample_ids
    with pytest.raises(BadImageError) as err:
        readable_images(ds)
    msg = str(err.value)
    assert "1 image(s) listed in the label file are absent (e.g. 'ILSVRC2012_val_00000003.JPEG')"\
        in msg and "1 image(s) have no label there (e.g. 'extra.JPEG')" in msg
    assert "--subset" in msg and "--skip-bad-images" in msg and "\n" not in msg
    # an absent image is not an unreadable one: --skip-bad-images does not leave it out
    with pytest.raises(BadImageError, match=r"1 image\(s\) listed .* absent.*--subset") as err:
        readable_images(ds, skip_bad=True)
    assert "extra.JPEG" not in str(err.value)
    kept = readable_images(ImageFolderDataset(sets["flat"], subset=True), skip_bad=True)
    assert len(kept) == 7 and set(kept.skipped) == {"extra.JPEG"}
    assert check_images(kept) == {}
    with pytest.raises(BadImageError, match="does not exist"):
        ds[ds.sample_ids.index(_name(3))]  # a direct reader is stopped at the image too
    # the same in an archive: a member missing from ILSVRC2012_img_val.tar
    tar = sets["tar_flat"].with_name("short.tar")
    with tarfile.open(tar, "w") as tf:
        for i in (1, 2, 4, 5, 6, 7, 8):
            tf.add(sets["folders"] / PICKED[IMAGE_CLASS[i - 1]] / _name(i), arcname=_name(i))
    with pytest.raises(BadImageError, match=r"archive .*1 image\(s\) listed .* absent"):
        readable_images(ImageFolderDataset(tar))


def test_unreadable_member_of_an_archive_is_named(sets, tmp_path):
    tar = tmp_path / "broken.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(sets["folders"], arcname="")
        ti = tarfile.TarInfo(f"{PICKED[0]}/bad.JPEG")
        ti.size = 10
        tf.addfile(ti, io.BytesIO(b"\xff\xd8 not a jpeg"))
    with pytest.raises(BadImageError, match=r"broken.tar:.*bad.JPEG.*not an image"):
        readable_images(ImageFolderDataset(tar))
    assert len(readable_images(ImageFolderDataset(tar), skip_bad=True)) == 8


@pytest.mark.parametrize("case, error, match", [
    ("labels for class folders", InputError, "class-folder layout"),
    ("gzip image tar", InputError, "gzip-compressed"),
    ("bad csv header", InputError, r"not a LOC_val_solution.csv"),
    ("csv without wnid", InputError, r"line 2: .* does not start with a WordNet id"),
    ("inner synset in ground truth", InputError, r"line 2 of the ground truth is '1001'"),
    ("devkit without meta.mat", InputError, r"lacks .*meta.mat"),
    ("unknown label file", InputError, "is not a label file"),
    ("missing label file", FileNotFoundError, "does not exist"),
    ("no image labelled", InputError, "none of its 8 images is listed"),
])
def test_bad_label_files_and_archives_are_one_line_errors(sets, tmp_path, case, error, match):
    data, labels = sets["flat"], None
    if case == "labels for class folders":
        data, labels = sets["folders"], sets["csv"]
    elif case == "gzip image tar":
        data = tmp_path / "val.tar"
        data.write_bytes(gzip.compress(sets["tar_folders"].read_bytes()))
    elif case == "bad csv header":
        labels = tmp_path / "l.csv"
        labels.write_text("image,label\nILSVRC2012_val_00000001,n01440764\n")
    elif case == "csv without wnid":
        labels = tmp_path / "l.csv"
        labels.write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,12 3 4 5\n")
    elif case == "inner synset in ground truth":
        (sets["devkit"] / "data" / "ILSVRC2012_validation_ground_truth.txt").write_text(
            "449\n1001\n")
    elif case == "devkit without meta.mat":
        (sets["devkit"] / "data" / "meta.mat").unlink()
        labels = sets["devkit"] / "data" / "ILSVRC2012_validation_ground_truth.txt"
    elif case == "unknown label file":
        labels = tmp_path / "labels.json"
        labels.write_text("{}")
    elif case == "missing label file":
        labels = tmp_path / "nope.csv"
    elif case == "no image labelled":
        labels = tmp_path / "l.csv"
        labels.write_text(f"ImageId,PredictionString\nother_image,{PICKED[0]} 1 2 3 4\n")
    with pytest.raises(error, match=match) as err:
        ImageFolderDataset(data, labels=labels)
    assert "\n" not in str(err.value)


def test_an_unknown_wordnet_id_is_named_with_its_description(tmp_path):
    from uqvision.data import match_classes

    with pytest.raises(InputError, match=r"'n01440764' \(tench, Tinca tinca\)\]"):
        match_classes(["n01440764"], ["0", "1"], folder="f", model="m")


# -- 5. end to end: predict in the 1000-class space ---------------------------------------------

@pytest.fixture(scope="module")
def in1k_checkpoint(tmp_path_factory):
    """A 1,000-class ImageNet-1k timm checkpoint without a sidecar: its classes are the WordNet
    ids in timm's order (random weights: only the label space is checked)."""
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("in1k") / "r.safetensors"
    torch.manual_seed(0)
    save_file(timm.create_model("test_resnet.r160_in1k").state_dict(), str(path))
    return f"test_resnet.r160_in1k={path}"


def _cache(out: Path) -> xr.Dataset:
    (path,) = sorted(out.glob("*.nc"))
    with xr.open_dataset(path) as ds:
        return ds.load()


def test_cli_predict_on_a_flat_folder_labels_in_1000_class_space(sets, tmp_path, in1k_checkpoint,
                                                                 capsys):
    out = tmp_path / "caches"
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(sets["flat"]),
                 "--out", str(out), "--batch-size", "4"]) == 0
    ds = _cache(out)
    assert ds["logits"].shape == (8, 1000) and ds.attrs["class_names_source"] == "imagenet-1k"
    want = {_name(i + 1): IN1K.index(PICKED[c]) for i, c in enumerate(IMAGE_CLASS)}
    assert ds["label"].values.tolist() == [want[s] for s in ds["sample"].values]
    assert int(ds["in_folder"].sum()) == 3
    # the same folder with another label file: its cache is refused on resume, not reused
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(sets["flat"]),
                 "--labels", str(sets["csv"]), "--out", str(out), "--batch-size", "4"]) == 2
    assert "computed from other inputs" in capsys.readouterr().err
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(sets["flat"]),
                 "--labels", str(sets["csv"]), "--out", str(tmp_path / "c2"),
                 "--batch-size", "4"]) == 0
    assert np.array_equal(_cache(tmp_path / "c2")["label"], ds["label"])


def test_cli_predict_imagenet_r_like_folder_and_its_tar(tmp_path, in1k_checkpoint):
    """Three WordNet ids of ImageNet-R (200 of the 1,000): labels are their indices among the
    model's 1,000 classes, logits stay 1,000 wide; the same from the tar it ships as."""
    # timm ships ImageNet-R's 200 WordNet ids and their ImageNet-1k indices (its validate.py
    # masks the 1,000 logits with them); the indices are the oracle of the labels here
    r_wnids = pkgutil.get_data("timm.data", "_info/imagenet_r_synsets.txt").decode().split()
    r_index = pkgutil.get_data("timm.data", "_info/imagenet_r_indices.txt").decode().split()
    rows = [0, 77, 199]
    picked = [r_wnids[k] for k in rows]
    root = tmp_path / "imagenet-r"
    for k, w in enumerate(picked):
        for j in range(2):
            _jpeg(root / w / f"art_{j}.jpg", 3 * k + j)
    (root / "README.txt").write_text("not an image")
    with tarfile.open(tmp_path / "imagenet-r.tar", "w") as tf:
        tf.add(root, arcname="imagenet-r")
    caches = {}
    for key, data in (("folder", root), ("tar", tmp_path / "imagenet-r.tar")):
        assert main(["predict", "--model", in1k_checkpoint, "--data", str(data),
                     "--out", str(tmp_path / key), "--batch-size", "4"]) == 0
        caches[key] = _cache(tmp_path / key)
    ds = caches["folder"]
    assert ds["logits"].shape == (6, 1000) and ds.attrs["class_mapping"] == "name"
    assert ds["label"].values.tolist() == [int(r_index[k]) for k in rows for _ in range(2)]
    assert json.loads(ds.attrs["folder_classes"]) == picked
    assert list(caches["tar"]["sample"].values) == list(ds["sample"].values)
    np.testing.assert_array_equal(caches["tar"]["label"], ds["label"])
    np.testing.assert_allclose(caches["tar"]["logits"], ds["logits"], rtol=0, atol=1e-5)
    assert caches["tar"].attrs["dataset_fingerprint"] != ds.attrs["dataset_fingerprint"]


def test_sweep_cells_read_a_flat_folder_with_its_label_file(sets, tmp_path, in1k_checkpoint):
    """A sweep of a flat folder whose label file lies elsewhere (given, not found): the cells,
    which scan the folder again on their worker, read the same label file."""
    import distributed

    from uqvision.cli import build_parser
    from uqvision.predict import PredictConfig
    from uqvision.sweep import sweep_predictions

    csv = shutil.move(sets["csv"], tmp_path / "labels.csv")
    shutil.rmtree(sets["devkit"])
    args = build_parser().parse_args(["sweep", "--models", "m", "--data", "d", "--out", "o",
                                      "--labels", str(csv)])
    assert args.labels == str(csv)
    folder = ImageFolderDataset(sets["flat"], labels=csv)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        report = sweep_predictions([in1k_checkpoint], folder, tmp_path / "caches",
                                   PredictConfig(batch_size=4), client=client, threads=1)
    assert not report.failed and len(report.computed) == 1
    ds = _cache(tmp_path / "caches")
    want = {_name(i + 1): IN1K.index(PICKED[c]) for i, c in enumerate(IMAGE_CLASS)}
    assert ds["label"].values.tolist() == [want[s] for s in ds["sample"].values]
    assert ds.attrs["dataset_fingerprint"] == folder_fingerprint(folder)


# -- 6. hostile layouts (issue 24) ---------------------------------------------------------------

def _cache_attrs(out: Path) -> dict:
    with xr.open_dataset(min(out.glob("*.nc"))) as ds:
        return dict(ds.attrs)


@pytest.mark.parametrize("kind", ["folder", "tar"])
def test_a_half_converted_folder_is_refused_as_a_mixed_layout(sets, tmp_path, kind):
    """Flat images beside class folders (a conversion stopped half-way, its label file beside)
    were read as class folders, the flat images silently dropped."""
    val = sets["flat"]
    for i in (1, 2, 4):  # three images moved into their class folders, five left flat
        (val / PICKED[IMAGE_CLASS[i - 1]]).mkdir(exist_ok=True)
        (val / _name(i)).rename(val / PICKED[IMAGE_CLASS[i - 1]] / _name(i))
    _write_csv(val.parent / "LOC_val_solution.csv")
    data = val
    if kind == "tar":
        data = tmp_path / "half.tar"
        with tarfile.open(data, "w") as tf:
            tf.add(val, arcname="val")
    with pytest.raises(InputError) as err:
        ImageFolderDataset(data)
    msg = str(err.value)
    assert "mixes two layouts" in msg and str(data) in msg and "\n" not in msg
    assert "5 image(s) directly in it" in msg and _name(3) in msg
    assert "2 class folder(s) holding 3 image(s)" in msg and PICKED[0] in msg


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def test_a_tar_truncated_at_a_member_boundary_is_refused(sets, tmp_path):
    """A copy cut where a member's header would start reads, for tarfile, as a smaller archive:
    the end-of-archive marker (two zero blocks) is required."""
    tar = shutil.copy(sets["tar_folders"], tmp_path / "cut.tar")
    with tarfile.open(tar) as tf:
        images = [ti for ti in tf.getmembers() if ti.isfile()]
    _truncate(Path(tar), images[4].offset)  # four images, then the end of the file
    with pytest.raises(InputError) as err:
        ImageFolderDataset(tar)
    msg = str(err.value)
    assert str(tar) in msg and "truncated" in msg and "end-of-archive marker" in msg
    assert "\n" not in msg
    # cut inside a member's data, and one per-class tar cut at a boundary inside the archive
    tar2 = shutil.copy(sets["tar_folders"], tmp_path / "cut2.tar")
    _truncate(Path(tar2), images[4].offset_data + 100)
    with pytest.raises(InputError, match=r"cut2.tar.*truncated"):
        ImageFolderDataset(tar2)
    outer = tmp_path / "train_cut.tar"
    with tarfile.open(sets["tar_tars"]) as src, tarfile.open(outer, "w") as dst:
        for ti in src.getmembers():
            data = src.extractfile(ti).read()
            if ti.name == f"{PICKED[0]}.tar":
                with tarfile.open(fileobj=io.BytesIO(data)) as inner:
                    data = data[:inner.getmembers()[1].offset]  # its first image only
            ti.size = len(data)
            dst.addfile(ti, io.BytesIO(data))
    with pytest.raises(InputError, match=rf"member '{PICKED[0]}.tar' of archive .*train_cut.tar"
                                         r".*truncated"):
        ImageFolderDataset(outer)


def test_a_dangling_symlink_is_an_unreadable_image_not_a_dropped_one(sets):
    cf = sets["folders"]
    ghost = cf / PICKED[0] / "ghost.JPEG"
    ghost.symlink_to(cf / "nowhere.JPEG")
    ds = ImageFolderDataset(cf)
    assert f"{PICKED[0]}/ghost.JPEG" in ds.sample_ids and len(ds) == 9
    assert folder_fingerprint(ds).startswith("size:")  # the dangling link enters with size -1
    with pytest.raises(BadImageError) as err:
        readable_images(ds)
    msg = str(err.value)
    assert str(ghost) in msg and "symbolic link" in msg and "nowhere.JPEG" in msg
    kept = readable_images(ds, skip_bad=True)
    assert len(kept) == 8 and list(kept.skipped) == [f"{PICKED[0]}/ghost.JPEG"]
    # in a flat folder read as a subset: a dangling link is present, hence unreadable, never
    # taken for an absent image and left out
    flat = sets["flat"]
    (flat / _name(3)).unlink()
    (flat / _name(3)).symlink_to(flat / "gone.JPEG")
    sub = ImageFolderDataset(flat, subset=True)
    assert sub.subset is None and _name(3) in sub.sample_ids
    with pytest.raises(BadImageError, match=r"unreadable.*symbolic link"):
        readable_images(sub)


def test_tar_link_members_are_read_as_extraction_would_read_them(sets, tmp_path):
    """Hard and symbolic links named as images were dropped from an archive; they read as
    the files extraction writes (a dangling one as the dangling link it extracts to)."""
    cf = sets["folders"]
    target = min((cf / PICKED[0]).iterdir()).name
    tar = tmp_path / "links.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(cf, arcname="val")
        for name, kind, link in (
                (f"val/{PICKED[0]}/hard.JPEG", tarfile.LNKTYPE, f"val/{PICKED[0]}/{target}"),
                (f"val/{PICKED[1]}/soft.JPEG", tarfile.SYMTYPE, f"../{PICKED[0]}/{target}"),
                (f"val/{PICKED[2]}/chain.JPEG", tarfile.SYMTYPE, "../" + PICKED[1]
                 + "/soft.JPEG"),
                (f"val/{PICKED[2]}/dangling.JPEG", tarfile.SYMTYPE, "nowhere.JPEG")):
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname = kind, link
            tf.addfile(ti)
    extracted = tmp_path / "extracted"
    with tarfile.open(tar) as tf:
        tf.extractall(extracted, filter="tar")
    ds, ref = ImageFolderDataset(tar), ImageFolderDataset(extracted / "val")
    assert ds.sample_ids == ref.sample_ids and len(ds) == 12
    assert ds.targets == ref.targets
    with pytest.raises(BadImageError, match=r"links.tar:.*dangling.JPEG.*symbolic link to "
                                            r"'nowhere.JPEG'"):
        readable_images(ds)
    kept, kept_ref = readable_images(ds, skip_bad=True), readable_images(ref, skip_bad=True)
    assert list(kept.skipped) == list(kept_ref.skipped) == [f"{PICKED[2]}/dangling.JPEG"]
    assert {rel: ds.source.read(rel) for rel in kept.sample_ids} \
        == {rel: (ref.root / rel).read_bytes() for rel in kept_ref.sample_ids}
    assert torch.equal(_tensors(kept), _tensors(kept_ref))


def test_a_file_name_that_is_not_utf8_is_named_at_the_scan(sets, tmp_path, in1k_checkpoint,
                                                          capsys):
    """A name with bytes that are not UTF-8 could not be written to a cache or a message: it is
    named up front (its bytes as \\xNN), refused or skipped like an unreadable image."""
    cf = sets["folders"]
    raw = os.fsencode(cf / PICKED[0]) + b"/\xff.JPEG"
    with open(raw, "wb") as f:
        f.write((cf / PICKED[0] / _name(2)).read_bytes())
    shown = f"{PICKED[0]}/\\xff.JPEG"
    ds = ImageFolderDataset(cf)
    assert len(ds) == 8 and ds.scan_problems == {shown: ds.scan_problems[shown]}
    with pytest.raises(BadImageError) as err:
        readable_images(ds)
    msg = str(err.value)
    assert f"{PICKED[0]}/\\\\xff.JPEG" in msg  # the name as repr() writes it
    assert "not valid UTF-8 (b'\\xff.JPEG')" in msg and msg.encode("utf-8")
    tar = tmp_path / "names.tar"
    with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as tf:
        tf.add(cf, arcname="")
    assert set(ImageFolderDataset(tar).scan_problems) == {shown}
    # the command line: refused in one line, or skipped and recorded
    out = tmp_path / "caches"
    command = ["predict", "--model", in1k_checkpoint, "--data", str(cf), "--out", str(out),
               "--batch-size", "4"]
    assert main(command) == 2
    err_text = capsys.readouterr().err
    assert err_text.count("\n") == 1 and "not valid UTF-8 (b'\\xff.JPEG')" in err_text
    assert main([*command, "--skip-bad-images"]) == 0
    attrs = _cache_attrs(out)
    assert attrs["n_skipped_images"] == 1 and shown in json.loads(attrs["skipped_images"])


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_meta_mat_is_one_line_naming_it(sets, tmp_path, damage, in1k_checkpoint,
                                                  capsys):
    meta = sets["devkit"] / "data" / "meta.mat"
    if damage == "garbage":  # random bytes (scipy raises NotImplementedError for these)
        meta.write_bytes(np.random.default_rng(724).bytes(2048))
    else:  # cut short (scipy: OSError 'could not read bytes')
        _truncate(meta, 200)
    with pytest.raises(InputError) as err:
        ImageFolderDataset(sets["flat"])
    assert str(meta) in str(err.value) and "\n" not in str(err.value)
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(sets["flat"]),
                 "--out", str(tmp_path / "c")]) == 2
    text = capsys.readouterr().err
    assert text.count("\n") == 1 and str(meta) in text and "cannot be read" in text
    # the same meta.mat in the devkit's archive: named as archive:member
    archive = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(sets["devkit"], arcname="ILSVRC2012_devkit_t12")
    with pytest.raises(InputError, match=r"tar.gz:ILSVRC2012_devkit_t12/data/meta.mat"):
        ImageFolderDataset(sets["flat"], labels=archive)


@pytest.mark.parametrize("command", ["predict", "sweep"])
def test_an_output_folder_inside_the_data_is_refused(sets, tmp_path, in1k_checkpoint, capsys,
                                                     command):
    """`--out val/caches` worked once, then the next run took `caches` for a class folder."""
    for data in (sets["flat"], sets["folders"]):
        out = data / "caches"
        models = ["--model", in1k_checkpoint] if command == "predict" \
            else ["--models", in1k_checkpoint]
        assert main([command, *models, "--data", str(data), "--out", str(out)]) == 2
        text = capsys.readouterr().err
        assert "--out" in text and "inside --data" in text and text.count("\n") == 1
        assert not out.exists()


def test_loc_csv_image_ids_with_their_extension_are_accepted(sets, tmp_path):
    plain = ImageFolderDataset(sets["flat"], labels=sets["csv"])
    text = sets["csv"].read_text().splitlines()
    csv = tmp_path / "LOC_val_solution.csv"
    csv.write_text("\n".join([text[0]] + [line.replace(",", ".JPEG,", 1)
                                          for line in text[1:]]) + "\n")
    assert "ILSVRC2012_val_00000001.JPEG,n" in csv.read_text()
    ds = ImageFolderDataset(sets["flat"], labels=csv)
    assert ds.samples == plain.samples and ds.label_problems == {}


def test_the_label_file_is_said_and_recorded_and_the_devkit_first_rule_shown(
        sets, tmp_path, in1k_checkpoint, capsys):
    """A devkit and a LOC_val_solution.csv that disagrees on image 3, side by side: the devkit is
    read, the line on stderr says so and how the csv differs; every cache records the label
    file by path and content hash."""
    _write_csv(sets["devkit"].parent / "LOC_val_solution.csv", [2, 0, 0, 0, 2, 1, 0, 2])
    out = tmp_path / "caches"
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(sets["flat"]),
                 "--out", str(out), "--batch-size", "4"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "labels of" in line]
    assert len(lines) == 1
    line = lines[0]
    assert f"devkit {str(sets['devkit'])!r}" in line and "found by the search" in line
    assert "LOC_val_solution.csv" in line and "devkit comes first" in line
    assert f"labels 1 of the 8 images present otherwise (e.g. {_name(3)!r}" in line
    attrs = _cache_attrs(out)
    folder = ImageFolderDataset(sets["flat"])
    assert attrs["label_file"] == str(sets["devkit"].resolve())
    assert attrs["label_file_kind"] == "devkit"
    assert attrs["label_file_sha256"] == folder.label_file.sha256
    assert "subset_n_present" not in attrs


def test_a_subset_of_the_label_file_is_its_own_option_recorded_compactly(
        sets, tmp_path, in1k_checkpoint, capsys):
    """Three of the eight images of the devkit: without --subset the absent images stop the
    command (and --skip-bad-images does not hide them); with it they are left out and each
    cache records counts and a hash, not a list of names."""
    for i in (1, 5, 6, 7, 8):
        (sets["flat"] / _name(i)).unlink()
    full = ImageFolderDataset(sets["flat"])
    with pytest.raises(BadImageError, match=r"5 image\(s\) listed .* absent.*--subset"):
        readable_images(full, skip_bad=True)
    ds = ImageFolderDataset(sets["flat"], subset=True)
    present = sorted(_name(i) for i in (2, 3, 4))
    assert sorted(ds.sample_ids) == present and ds.label_problems == {}
    assert (ds.subset.n_labelled, ds.subset.n_present) == (8, 3)
    assert ds.subset.sha256 == hashlib.sha256("".join(f"{n}\n" for n in present).encode()) \
        .hexdigest()
    assert readable_images(ds) is ds and ds.classes == sorted({PICKED[0], PICKED[1]})
    assert folder_fingerprint(ds) != folder_fingerprint(full)
    assert dataset_fingerprint(sets["flat"], subset=True) == folder_fingerprint(ds)
    # nothing absent: --subset changes nothing, identity included
    assert dataset_fingerprint(sets["tar_flat"], subset=True) \
        == dataset_fingerprint(sets["tar_flat"])
    with pytest.raises(InputError, match=r"class_folders layout .*--subset"):
        ImageFolderDataset(sets["folders"], subset=True)
    # the command line
    out = tmp_path / "caches"
    command = ["predict", "--model", in1k_checkpoint, "--data", str(sets["flat"]), "--out",
               str(out), "--batch-size", "4"]
    assert main([*command, "--skip-bad-images"]) == 2
    assert "--subset" in capsys.readouterr().err
    assert main([*command, "--subset"]) == 0
    assert "subset: 3 of the 8 images of the label file" in capsys.readouterr().err
    attrs = _cache_attrs(out)
    assert (attrs["subset_n_labelled"], attrs["subset_n_present"]) == (8, 3)
    assert attrs["subset_sha256"] == ds.subset.sha256 and "skipped_images" not in attrs
    assert attrs["dataset_fingerprint"] == folder_fingerprint(ds)
    assert attrs["label_file"] == str(sets["devkit"].resolve())
    assert sorted(_cache(out)["sample"].values) == present


def test_sweep_cells_read_a_subset(sets, tmp_path, in1k_checkpoint):
    """A sweep's cells scan the folder again on their worker: as the subset the plan read."""
    import distributed

    from uqvision.predict import PredictConfig
    from uqvision.sweep import sweep_predictions

    for i in (1, 5, 6, 7, 8):
        (sets["flat"] / _name(i)).unlink()
    folder = ImageFolderDataset(sets["flat"], subset=True)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        report = sweep_predictions([in1k_checkpoint], folder, tmp_path / "caches",
                                   PredictConfig(batch_size=4), client=client, threads=1)
    assert not report.failed and len(report.computed) == 1
    attrs = _cache_attrs(tmp_path / "caches")
    assert attrs["dataset_fingerprint"] == folder_fingerprint(folder)
    assert attrs["subset_n_present"] == 3
