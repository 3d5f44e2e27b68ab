"""The label files of ImageNet's flat layouts (uqvision.layouts): where one is looked for, and
the errors of a missing or malformed label file, an absent or unlabelled image, an unreadable
or compressed archive (one line each).
"""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest
from layouts_support import IMAGE_CLASS, PICKED, _jpeg, _name, _write_csv, _write_devkit
from uqmetrics import InputError

from uqvision.data import ImageFolderDataset, check_images, readable_images
from uqvision.exceptions import BadImageError
from uqvision.layouts import LABEL_SEARCH, find_label_file

# -- where a label file is looked for -----------------------------------------------------------

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


# -- errors -------------------------------------------------------------------------------

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
    # the caller's own option for skipping (evaluate's TOML key), or none (train)
    for option in ("[predict] skip-bad-images = true", None):
        with pytest.raises(BadImageError) as err:
            readable_images(ds, skip_option=option)
        said = str(err.value)
        assert "--skip-bad-images" not in said and "have no label there" in said
        assert (f"pass {option} to leave the unlabelled ones out" in said) == (option is not None)
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


