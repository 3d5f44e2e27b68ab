"""``--overwrite`` of the data makers and ImageNet-C made locally (issue 36, security item 2,
rows 4, 5, 8, 11, 12, 13 and the full disk): nothing outside ``--out`` or not written by the
command is deleted, a name read from a file is checked before a path is built from it, an
output holding or inside an input is refused, an unfinished or damaged ImageNet-C is refused
when predicted, a changed source image is recomputed, a full disk names the file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from uqmetrics import InputError
from uqmetrics.runs.io import WRITTEN_RECORD
from uqmetrics.runs.testing.filesystems import full_filesystems

from uqvision.cli import main
from uqvision.data import ImageFolderDataset, make_digits_folder
from uqvision.data.corruptions import METADATA_FILE, make_corrupted_folder
from uqvision.evalsets import iter_member_folders

#: Two cheap corruptions at two severities, 32 px: 4 members of 10 images each.
KW = {"corruptions": ("brightness", "contrast"), "severities": (1, 2), "resize": 32,
      "crop": 32, "progress": False}
CLI = ["--corruptions", "brightness,contrast", "--severities", "1,2", "--resize", "32",
       "--crop", "32"]
RANDOM = "test_byobnet"


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """10 real digit images (one per class)."""
    return make_digits_folder(tmp_path_factory.mktemp("digits"), max_per_class=2) / "test"


@pytest.fixture(scope="module")
def clean2(tmp_path_factory):
    """20 real digit images (two per class)."""
    return make_digits_folder(tmp_path_factory.mktemp("digits2"), max_per_class=4) / "test"


def _src(clean, tmp_path) -> Path:
    """A copy of ``clean`` the test may change."""
    return Path(shutil.copytree(clean, tmp_path / "src"))


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"uqvision {command}: error: ") and err.count("\n") == 1, err
    return err


# -- security item 2: a tampered imagenet-c.json ---------------------------------------------

@pytest.mark.parametrize("name", ["../victim", "ABSOLUTE", "brightness/../../victim"])
def test_a_tampered_metadata_deletes_nothing_outside_out(clean, tmp_path, name, capsys):
    """A name of the metadata's ``corruptions`` is checked against the known corruptions
    before any path is built from it: ``"../victim"`` or an absolute path with ``--overwrite``
    deleted that folder (``shutil.rmtree(out / c)``); it is refused, one line naming the file
    and the name, and nothing is deleted."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("mine")
    out = make_corrupted_folder(clean, tmp_path / "c", **KW)
    before = _files(out)
    meta = json.loads((out / METADATA_FILE).read_text())
    meta["corruptions"].append(str(victim) if name == "ABSOLUTE" else name)
    (out / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(InputError, match=f"{METADATA_FILE}: corruptions: .* is not a corruption"):
        make_corrupted_folder(clean, out, **{**KW, "seed": 1}, overwrite=True)
    assert main(["data", "imagenet-c", "--src", str(clean), "--out", str(out), *CLI,
                 "--seed", "1", "--overwrite"]) == 2
    err = _one_line_error(capsys, "data imagenet-c")
    assert str(out / METADATA_FILE) in err and "is not a corruption of imagecorruptions" in err
    assert _files(victim) == {"thesis.tex": b"mine"}
    assert {k: v for k, v in _files(out).items() if k != METADATA_FILE} == {
        k: v for k, v in before.items() if k != METADATA_FILE}


@pytest.mark.parametrize("entry", [["../../../victim/thesis.tex", "0" * 64],
                                   ["/abs/x.JPEG", "0" * 64], ["a/b/c.JPEG", "0" * 64]])
def test_a_tampered_image_record_is_refused(clean, tmp_path, entry):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("mine")
    out = make_corrupted_folder(clean, tmp_path / "c", **KW)
    meta = json.loads((out / METADATA_FILE).read_text())
    meta["images"]["x.png"] = entry
    (out / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"images: 'x.png' -> .* is not \[<class>/<stem>.JPEG"):
        make_corrupted_folder(clean, out, **{**KW, "seed": 1}, overwrite=True)
    assert _files(victim) == {"thesis.tex": b"mine"}


def test_overwrite_deletes_only_the_files_the_earlier_run_wrote(clean, tmp_path):
    """Other options with ``--overwrite``: the earlier run's images go (its corruptions that
    this run does not make too), a file of the user's in the folder stays; before, each
    corruption's folder was removed whole."""
    out = make_corrupted_folder(clean, tmp_path / "c", **KW)
    (out / "brightness" / "notes.md").write_text("mine")
    (out / "contrast" / "1" / "0" / "keep.txt").write_text("mine too")
    again = make_corrupted_folder(clean, out, **{**KW, "corruptions": ("brightness",),
                                                 "seed": 1}, overwrite=True)
    files = _files(again)
    assert files["brightness/notes.md"] == b"mine"
    assert files["contrast/1/0/keep.txt"] == b"mine too"
    assert not [f for f in files if f.startswith("contrast/") and f.endswith(".JPEG")]
    assert not (out / "contrast" / "2").exists()  # emptied folders go
    fresh = make_corrupted_folder(clean, tmp_path / "fresh", **{
        **KW, "corruptions": ("brightness",), "seed": 1})
    assert {k: v for k, v in files.items() if k.endswith(".JPEG")} == {
        k: v for k, v in _files(fresh).items() if k.endswith(".JPEG")}


def test_a_folder_of_the_earlier_format_is_made_again_only_with_overwrite(clean, tmp_path):
    """Version 1 recorded no source images (nothing to resume against): refused without
    ``--overwrite``; with it, the ``*.JPEG`` of its member folders are deleted, nothing else."""
    out = make_corrupted_folder(clean, tmp_path / "c", **KW)
    meta = json.loads((out / METADATA_FILE).read_text())
    del meta["images"]
    (out / METADATA_FILE).write_text(json.dumps({**meta, "format": "uqvision-imagenet-c/1"}))
    (out / "brightness" / "1" / "0" / "notes.md").write_text("mine")
    with pytest.raises(FileExistsError, match="of an earlier uqvision .*; pass overwrite=True"):
        make_corrupted_folder(clean, out, **KW)
    before = _files(out)
    again = _files(make_corrupted_folder(clean, out, **KW, overwrite=True))
    assert again["brightness/1/0/notes.md"] == b"mine"
    assert {k: v for k, v in again.items() if k.endswith(".JPEG")} == {
        k: v for k, v in before.items() if k.endswith(".JPEG")}  # deterministic: the same


# -- row 13: --out inside --src ---------------------------------------------------------------

def test_out_inside_src_or_holding_it_is_refused_up_front(clean, tmp_path, capsys):
    """``--out`` inside ``--src``: the second run scanned the first's output as a class of
    the source and corrupted it again; refused before anything is written, both ways."""
    src = _src(clean, tmp_path)
    before = _files(src)
    for _ in range(2):
        assert main(["data", "imagenet-c", "--src", str(src), "--out", str(src / "c"),
                     *CLI]) == 2
        err = _one_line_error(capsys, "data imagenet-c")
        assert f"--out '{src / 'c'}' lies inside the input --src '{src}'" in err
    assert _files(src) == before
    with pytest.raises(InputError, match="holds the input --src"):
        make_corrupted_folder(src, tmp_path, **KW)
    assert _files(src) == before


# -- row 12: a source image changed -------------------------------------------------------------

def test_a_resume_recomputes_the_images_of_a_changed_or_removed_source(clean2, tmp_path):
    """The metadata records every source image's SHA-256: a resume after one changed
    rewrites its files (equal to a fresh run's on the new source), after one was removed
    deletes them; the other images are kept as they were."""
    src = _src(clean2, tmp_path)
    out = make_corrupted_folder(src, tmp_path / "c", **KW)
    ds = ImageFolderDataset(src)
    changed, gone = ds.samples[3][0], ds.samples[5][0]
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.JPEG")}
    img = np.asarray(Image.open(src / changed))
    Image.fromarray(255 - img).save(src / changed)  # other pixels, same name
    (src / gone).unlink()
    lines = []
    make_corrupted_folder(src, out, **{**KW, "progress": lines.append})
    fresh = make_corrupted_folder(src, tmp_path / "fresh", **KW)
    assert {k: v for k, v in _files(out).items() if k.endswith(".JPEG")} == {
        k: v for k, v in _files(fresh).items() if k.endswith(".JPEG")}
    assert any("2 source image(s) changed or gone" in ln for ln in lines), lines
    stem = Path(changed).stem
    for p, t in stamps.items():
        if p.exists() and p.stem != stem:
            assert p.stat().st_mtime_ns == t, p  # kept, not rewritten
    meta = json.loads((out / METADATA_FILE).read_text())
    assert meta["complete"] is True and gone not in meta["images"]
    assert meta["images"][changed] == [f"{Path(changed).parent}/{stem}.JPEG", hashlib.sha256(
        (src / changed).read_bytes()).hexdigest()]


# -- row 11: an unfinished folder, a member half deleted -----------------------------------------

def test_an_unfinished_or_damaged_folder_is_refused_when_predicted(clean2, tmp_path, capsys):
    """``"complete": false`` and half of one member deleted: the sweep predicted it (one
    severity with half the images) and the scores mixed the counts. Expanding the set, a
    sweep over it and ``uqvision predict`` on the member are refused, naming the member and
    its counts; a complete folder whose member lost images is refused too."""
    out = make_corrupted_folder(clean2, tmp_path / "c", **KW)
    assert len(list(iter_member_folders(out, "imagenet-c"))) == 75  # the complete one: fine
    meta = json.loads((out / METADATA_FILE).read_text())
    (out / METADATA_FILE).write_text(json.dumps({**meta, "complete": False}))
    for p in sorted((out / "contrast" / "2").rglob("*.JPEG"))[::2]:  # one of each class
        p.unlink()
    want = "contrast-2 has 10 of 20 images"
    with pytest.raises(InputError, match=f"was not finished .*: {want}; run uqvision data "
                                         "imagenet-c again"):
        list(iter_member_folders(out, "imagenet-c"))
    data = clean2
    assert main(["--threads", "1", "sweep", "--models", RANDOM, "--random-init", "--data",
                 str(data), "--out", str(tmp_path / "s"), "--calibration-size", "0.3",
                 "--sets", f"imagenet-c={out}"]) == 2
    assert want in _one_line_error(capsys, "sweep")
    assert not (tmp_path / "s" / "caches").exists()
    assert main(["--threads", "1", "predict", "--model", RANDOM, "--random-init", "--data",
                 str(out / "contrast" / "2"), "--eval-set", "imagenet-c", "--out",
                 str(tmp_path / "p")]) == 2
    assert want in _one_line_error(capsys, "predict")
    assert not list(tmp_path.glob("p/*.nc"))
    (out / METADATA_FILE).write_text(json.dumps(meta))  # "complete": true, files still gone
    with pytest.raises(InputError, match=f"has lost images since it was made: {want}"):
        list(iter_member_folders(out, "imagenet-c"))
    make_corrupted_folder(clean2, out, **KW)  # a resume completes it
    assert len(list(iter_member_folders(out, "imagenet-c"))) == 75


# -- the full disk ---------------------------------------------------------------------------------

def test_a_full_disk_names_the_image_being_written(clean, tmp_path, capsys):
    """A real full file system (a tmpfs filled up, :func:`uqmetrics.runs.testing.filesystems.
    full_filesystems`: the kernel's own ENOSPC): one line naming the JPEG being written and
    "no space left on the device", no temporary file left (it said ``[Errno 28] No space
    left on device`` without a file)."""
    with full_filesystems(tmp_path, size="1m") as make:
        folder = make(12288)
        out = folder / "c"
        assert main(["data", "imagenet-c", "--src", str(clean), "--out", str(out), *CLI]) == 2
        err = _one_line_error(capsys, "data imagenet-c")
        named = err.split("error: ", 1)[1].split(": ", 1)[0]
        assert named.startswith(f"{out}/") and named.endswith(".JPEG"), err
        assert Path(named).relative_to(out).parts[0] in ("brightness", "contrast")
        assert err.rstrip().endswith("cannot be written: no space left on the device"), err
        assert not list(out.rglob(".partial-*"))
        assert json.loads((out / METADATA_FILE).read_text())["complete"] is False


# -- the makers: rows 4, 5, 8 --------------------------------------------------------------------

def test_digits_overwrite_refuses_a_folder_that_is_not_a_dataset(tmp_path, capsys):
    """Row 5: ``data digits --out DIR --overwrite`` on a folder holding ``thesis.tex`` deleted
    it; refused, as ``data imagenet-c`` does; a dataset folder holding a file the maker did not
    write is refused too; the maker's own folder is replaced."""
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    assert main(["data", "digits", "--out", str(out), "--overwrite",
                 "--max-per-class", "2"]) == 2
    err = _one_line_error(capsys, "data digits")
    assert f"--out '{out}' exists and is not a uqvision dataset folder" in err
    assert _files(out) == {"thesis.tex": b"mine"}

    data = tmp_path / "digits"
    assert main(["data", "digits", "--out", str(data), "--max-per-class", "2"]) == 0
    (data / "train" / "notes.md").write_text("mine")
    assert main(["data", "digits", "--out", str(data), "--overwrite",
                 "--max-per-class", "3"]) == 2
    assert "holds files uqvision data did not write ('train/notes.md')" in _one_line_error(
        capsys, "data digits")
    (data / "train" / "notes.md").unlink()
    assert main(["data", "digits", "--out", str(data), "--overwrite",
                 "--max-per-class", "3"]) == 0  # its data.config.toml is its own
    capsys.readouterr()
    assert len(ImageFolderDataset(data / "train")) + len(ImageFolderDataset(data / "test")) == 30


def test_subset_with_out_as_src_is_refused(tmp_path, capsys):
    """Row 4: ``data subset --src D --out D --overwrite`` deleted the source images."""
    src = make_digits_folder(tmp_path / "d", max_per_class=4) / "train"
    before = _files(src.parent)
    for out in (src, src / "fit", src.parent):
        assert main(["data", "subset", "--src", str(src), "--out", str(out), "--overwrite",
                     "--per-class", "1"]) == 2
        err = _one_line_error(capsys, "data subset")
        assert "the input --src" in err and str(src) in err
    assert _files(src.parent) == before


@pytest.mark.parametrize("mask", [0o022, 0o027])
@pytest.mark.parametrize("maker", ["digits", "subset"])
def test_a_made_folder_honours_the_umask(tmp_path, maker, mask, capsys):
    """Row 8: the folders of ``data digits`` and ``data subset`` were 0700 whatever the umask
    (``tempfile.mkdtemp``)."""
    src = make_digits_folder(tmp_path / "d", max_per_class=2) / "train"
    extra = ["--src", str(src), "--per-class", "1"] if maker == "subset" else [
        "--max-per-class", "2"]
    old = os.umask(mask)
    try:
        assert main(["data", maker, "--out", str(tmp_path / "out"), *extra]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    for folder in [tmp_path / "out", *(p for p in (tmp_path / "out").rglob("*") if p.is_dir())]:
        assert oct(folder.stat().st_mode & 0o777) == oct(0o777 & ~mask), folder
    assert (tmp_path / "out" / WRITTEN_RECORD).is_file()
