"""ImageNet in the layouts it ships in (uqvision.layouts): class folders, the flat validation
folder with the devkit's or Kaggle's label file, tars of either and tars of per-class tars read
as the same classes, samples and pixels; and the identity (fingerprint) of each.

Every layout is built in miniature from real files (``layouts_support``, the fixtures in
``conftest.py``) and compared with the same images in class folders.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from layouts_support import IMAGE_CLASS, PICKED, TRANSFORM, _name, _tensors, _write_csv
from timm.data.readers.reader_image_in_tar import ReaderImageInTar
from torch.utils.data import DataLoader

from uqvision.data import (
    ImageFolderDataset,
    check_images,
    dataset_fingerprint,
    earlier_fingerprint,
    folder_fingerprint,
    readable_images,
)
from uqvision.layouts import LAYOUTS

# -- the same classes, targets and pixels in every layout ----------------------------------

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


# -- identity: the layout and the label file's content ---------------------------------------

def _old_fingerprint(root: Path) -> str:
    """The class-folder fingerprint as it was before it covered content (``size:``)."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    h = hashlib.sha256(json.dumps(classes).encode())
    for i, c in enumerate(classes):
        for f in sorted(p.relative_to(root).as_posix() for p in (root / c).rglob("*.JPEG")):
            h.update(f"{f}\0{i}\0{(root / f).stat().st_size}\n".encode())
    return "size:" + h.hexdigest()


def test_fingerprints_capture_layout_and_labelling(sets, tmp_path):
    # the earlier scheme's (names, labels, sizes) is never today's: its caches are refused
    assert dataset_fingerprint(sets["folders"]) != _old_fingerprint(sets["folders"])
    assert earlier_fingerprint(_old_fingerprint(sets["folders"])).startswith("names, labels")
    assert earlier_fingerprint(dataset_fingerprint(sets["folders"])) is None
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



def test_a_child_forked_while_a_thread_opens_the_archive_reads_it(tmp_path):
    """A DataLoader worker is forked while another thread of the process (a sweep's other
    cell) may be opening the archive under the source's lock. The child's copy of that lock
    is then held for ever, by a thread the child does not have: the worker hung at its first
    read. Now a forked child takes a lock of its own: here the fork happens with the lock
    held, and the child reads the image's bytes."""
    import io
    import multiprocessing

    from uqvision.layouts.sources import TarSource

    data = b"the bytes of one image"
    with tarfile.open(tmp_path / "a.tar", "w") as tf:
        info = tarfile.TarInfo("c/x.jpg")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    with tarfile.open(tmp_path / "a.tar") as tf:
        member = tf.getmember("c/x.jpg")
    source = TarSource(tmp_path / "a.tar", {"c/x.jpg": ("c/x.jpg", member.offset_data,
                                                        member.size)})

    def read() -> None:
        (tmp_path / "read").write_bytes(source.read("c/x.jpg"))

    child = multiprocessing.get_context("fork").Process(target=read)
    with source._process_lock():  # what a thread opening the archive holds
        child.start()
    child.join(timeout=30)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    assert not hung and child.exitcode == 0
    assert (tmp_path / "read").read_bytes() == data
