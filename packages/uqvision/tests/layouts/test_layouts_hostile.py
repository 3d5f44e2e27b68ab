"""Hostile ImageNet layouts (uqvision.layouts, issue 24): a half-converted folder (a mixed
layout), truncated tars, dangling and archived links, file names that are not UTF-8, a damaged
``meta.mat``, an output folder inside the data, the label file said and recorded, subsets.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from layouts_support import IMAGE_CLASS, PICKED, _cache, _name, _tensors, _write_csv
from uqmetrics import InputError

from uqvision.cli import main
from uqvision.data import (
    ImageFolderDataset,
    dataset_fingerprint,
    folder_fingerprint,
    readable_images,
)
from uqvision.exceptions import BadImageError

# -- hostile layouts (issue 24) ---------------------------------------------------------------

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
    assert folder_fingerprint(ds).startswith("content2:")  # the dangling link: size -1
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
