"""``uqvision data subset`` rerun after the source images changed in place: the subset's record
held the source's path and the chosen ids, not the images' bytes, so a rerun kept copies of
the old images silently. It records the chosen images' fingerprint now, and a rerun keeps the
subset only while the source's chosen images have it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from uqvision.cli import main
from uqvision.data import ImageFolderDataset, folder_fingerprint, make_digits_folder
from uqvision.data.makers import _COMPLETE, make_subset_folder


@pytest.fixture
def src(tmp_path) -> Path:
    """A digits training folder of 4 images per class (this test's own: it changes them)."""
    return make_digits_folder(tmp_path / "d", max_per_class=8) / "train"


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and modification time (ns), but the configuration file the command
    line writes at every run (``data.config.toml``: not the maker's)."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "data.config.toml"}


def _change_in_place(path: Path) -> bytes:
    """Rewrite the image ``path`` with other pixels, its modification time put back."""
    st = path.stat()
    arr = np.asarray(Image.open(path)).copy()
    arr[0, 0] = 255 - arr[0, 0]
    Image.fromarray(arr).save(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return path.read_bytes()


def _run(capsys, *args: str) -> tuple[int, str]:
    rc = main(["data", "subset", *args])
    return rc, capsys.readouterr().err


def test_a_changed_source_image_refuses_the_rerun_and_overwrite_copies_it(src, tmp_path, capsys):
    out = tmp_path / "fit"
    opts = ["--src", str(src), "--out", str(out), "--per-class", "2", "--seed", "3"]
    assert _run(capsys, *opts)[0] == 0
    record = json.loads((out / "subset.json").read_text())
    before = _files(out)

    # unchanged: kept, nothing rewritten; so with an image changed that was not chosen
    assert _run(capsys, *opts)[0] == 0
    assert _files(out) == before
    _change_in_place(src / next(r for r in ImageFolderDataset(src).sample_ids
                                if r not in record["samples"]))
    assert _run(capsys, *opts)[0] == 0
    assert _files(out) == before

    rel = record["samples"][3]
    new = _change_in_place(src / rel)
    rc, err = _run(capsys, *opts)
    assert rc == 2, "a subset of the old image was kept"
    assert err.startswith("uqvision data subset: error: ") and err.count("\n") == 1, err
    assert f"--out {str(out)!r}" in err and f"--src {str(src)!r}" in err
    assert str(src / rel) in err and "--overwrite" in err
    assert _files(out) == before  # refused: nothing written
    with pytest.raises(FileExistsError, match="made from other images"):
        make_subset_folder(out, src=src, n_per_class=2, seed=3)

    assert _run(capsys, *opts, "--overwrite")[0] == 0
    copy = out / Path(rel).parent.name / Path(rel).name
    assert copy.read_bytes() == new
    again = json.loads((out / "subset.json").read_text())
    assert again["samples"] == record["samples"] and again["fingerprint"] != record["fingerprint"]
    ds = ImageFolderDataset(src)  # the fingerprint of the chosen images only
    assert again["fingerprint"] == folder_fingerprint(
        ds.without([r for r in ds.sample_ids if r not in record["samples"]]))
    after = _files(out)
    assert _run(capsys, *opts)[0] == 0  # the new images: kept
    assert _files(out) == after


def test_a_subset_recorded_without_a_fingerprint_is_checked_against_its_copies(src, tmp_path):
    """A subset written before the fingerprint (its record lacks one) is kept while its byte
    copies equal the source images, and refused once one of those changed."""
    out = make_subset_folder(tmp_path / "fit", src=src, n_per_class=2)
    for name in ("subset.json", _COMPLETE):  # the record as the earlier code wrote it
        rec = json.loads((out / name).read_text())
        rec.pop("fingerprint", None)
        (out / name).write_text(json.dumps(rec, indent=1 if name == "subset.json" else None))
    before = _files(out)
    assert make_subset_folder(out, src=src, n_per_class=2) == out
    assert _files(out) == before  # verified, kept as it is

    rel = rec["samples"][0]
    _change_in_place(src / rel)
    with pytest.raises(FileExistsError) as err:
        make_subset_folder(out, src=src, n_per_class=2)
    assert str(out) in str(err.value) and str(src / rel) in str(err.value)
    assert "before subsets recorded" in str(err.value) and "--overwrite" in str(err.value)
    assert _files(out) == before

    make_subset_folder(out, src=src, n_per_class=2, overwrite=True)
    assert "fingerprint" in json.loads((out / _COMPLETE).read_text())
    assert (out / Path(rel).parent.name / Path(rel).name).read_bytes() == (src / rel).read_bytes()
