"""The dataset fingerprint covers the images' content, in every layout (issue 36, row 14).

An image rewritten in place with other pixels, its byte size and modification time kept (a
re-quantised JPEG), changes the fingerprint of its folder, flat folder, tar (whole, one folder
of it, per-class tars) and image list; a resumed ``uqvision predict`` then refuses the stale
cache instead of reusing it. A cache that records a fingerprint of the earlier scheme (names,
labels and sizes: ``size:``) is refused naming it as such, in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
from layouts_support import PICKED, _name
from PIL import Image
from uqmetrics import read_dataset, write_dataset

from uqvision.cli import main
from uqvision.data import (
    FINGERPRINT_PREFIX,
    ImageFolderDataset,
    folder_fingerprint,
    load_image,
    sample_digests,
)
from uqvision.layouts import TarSource
from uqvision.predict import PredictConfig, predict_to_files


def _requantised(data: bytes) -> bytes:
    """A JPEG's bytes with the first value of its first quantisation table changed: another
    valid image of the same size, whose pixels differ (its DC coefficients scale)."""
    at = data.index(b"\xff\xdb") + 5  # marker, length (2), precision and table id, values
    out = bytearray(data)
    out[at] = out[at] + 1 if out[at] < 200 else out[at] - 1
    return bytes(out)


def _rewrite_in_place(ds: ImageFolderDataset, rel: str) -> Path:
    """Rewrite sample ``rel`` in place with other pixels, its size kept, and put the file's
    (or archive's) modification time back; return the file written."""
    source = ds.source
    if isinstance(source, TarSource):
        _, offset, size = source.members[rel]
        path = source.root
        st = path.stat()
        with open(path, "r+b") as f:
            f.seek(offset)
            new = _requantised(f.read(size))
            f.seek(offset)
            f.write(new)
    else:
        path = source.open(rel)
        st = path.stat()
        path.write_bytes(_requantised(path.read_bytes()))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    return path


def _image_list(sets, tmp_path) -> Path:
    """An image list (OOD, label -1) of three of the flat folder's images."""
    lst = tmp_path / "list.txt"
    rel = sets["flat"].relative_to(tmp_path).as_posix()
    lst.write_text("".join(f"{rel}/{_name(i)} -1\n" for i in (1, 2, 3)))
    return lst


def test_an_image_changed_in_place_changes_the_fingerprint_in_every_layout(sets, tmp_path):
    """Before, the fingerprint was over names, labels and sizes: a re-quantised JPEG of the
    same size and modification time kept it, so its caches were reused."""
    cases = {"folders": sets["folders"], "flat": sets["flat"], "tar_flat": sets["tar_flat"],
             "tar_folders": sets["tar_folders"], "tar_tars": sets["tar_tars"],
             "tar_folder": sets["tar_folders"] / "val",  # a folder inside the archive
             "image_list": _image_list(sets, tmp_path)}
    for name, root in cases.items():
        ds = ImageFolderDataset(root)
        before = folder_fingerprint(ds)
        assert before.startswith(FINGERPRINT_PREFIX), name
        sizes = {rel: ds.source.size(rel) for rel in ds.sample_ids}
        rel = ds.sample_ids[0]
        pixels = np.asarray(load_image(ds.source.open(rel)) if not isinstance(
            ds.source, TarSource) else Image.open(ds.source.open(rel)).convert("RGB"))
        _rewrite_in_place(ds, rel)
        again = ImageFolderDataset(root)
        assert {r: again.source.size(r) for r in again.sample_ids} == sizes, name  # same sizes
        now = Image.open(again.source.open(rel)).convert("RGB")
        assert not np.array_equal(np.asarray(now), pixels), name  # other pixels
        assert folder_fingerprint(again) != before, name
        # the digests are the bytes' SHA-256, read through the layout's source
        assert sample_digests(again)[rel] == hashlib.sha256(again.source.read(rel)).hexdigest()


def _old_fingerprint(root: Path) -> str:
    """The class-folder fingerprint an earlier uqvision recorded (``size:``: SHA-256 over the
    class list and each sample's id, folder label and size)."""
    ds = ImageFolderDataset(root)
    h = hashlib.sha256(json.dumps(ds.classes).encode())
    for rel, y in ds.samples:
        h.update(f"{rel}\0{y}\0{ds.source.size(rel)}\n".encode())
    return "size:" + h.hexdigest()


def _predict(model, data, out):
    return main(["predict", "--model", model, "--data", str(data), "--out", str(out),
                 "--dataset-name", "v", "--batch-size", "4"])


def test_a_resume_after_an_image_changed_in_place_refuses_the_stale_cache(
        sets, tmp_path, in1k_checkpoint, capsys):
    data = shutil.copytree(sets["folders"], tmp_path / "val")
    out = tmp_path / "caches"
    assert _predict(in1k_checkpoint, data, out) == 0
    (cache,) = out.glob("*.nc")
    kept = cache.read_bytes()
    _rewrite_in_place(ImageFolderDataset(data), f"{PICKED[0]}/{_name(2)}")
    capsys.readouterr()
    assert _predict(in1k_checkpoint, data, out) == 2  # before: 0, the stale cache reused
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"cache {str(cache)!r} was computed from other inputs" in err
    assert f"dataset {str(data)!r} (content2:" in err, err
    assert cache.read_bytes() == kept  # refused, not replaced


def test_a_cache_with_a_fingerprint_of_the_earlier_scheme_is_refused_naming_it(
        sets, tmp_path, in1k_checkpoint, capsys):
    """A cache written before the fingerprint covered content records ``size:...``: its
    identity is an earlier one, never taken for today's, and the one-line message says so."""
    data = sets["folders"]
    out = tmp_path / "caches"
    old = _old_fingerprint(data)
    (cache,) = predict_to_files(in1k_checkpoint, data, out, PredictConfig(batch_size=4),
                                dataset_name="v")
    ds = read_dataset(cache)  # as a cache of the earlier scheme records it
    ds.attrs["dataset_fingerprint"] = old
    write_dataset(ds, cache, overwrite=True)
    capsys.readouterr()
    assert _predict(in1k_checkpoint, data, out) == 2  # before: 0, its fingerprint was today's
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "was computed from other inputs" in err
    assert (f"dataset {str(data.resolve())!r} ({old[:17]}..., an earlier fingerprint, of names, "
            "labels and file sizes only, not the images' content) vs") in err, err
