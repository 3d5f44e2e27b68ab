"""Hostile image folders (the image-folder audit): a PNG whose zlib data is damaged under valid
CRCs, an image that breaks inside a DataLoader worker, folder links (and loops of them),
hidden names at every depth, class names in two Unicode normalisations, 32-bit integer and
1-pixel images, the device decoder's distance from Pillow, and ``data subset`` / ``train`` on
unreadable images. Every file is a real one, written here with Pillow."""

from __future__ import annotations

import io
import json
import os
import struct
import tarfile
import unicodedata
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import xarray as xr
from PIL import Image
from safetensors.torch import save_file
from torchvision.datasets import ImageFolder
from uqmetrics import InputError

import uqvision.data.images as images_module
from uqvision.cli import main
from uqvision.data import (
    DataConfig,
    ImageFolderDataset,
    check_image,
    check_images,
    check_split_classes,
    eval_transform,
    load_image,
    match_classes,
)
from uqvision.exceptions import BadImageError
from uqvision.predict.decoded import split_transform
from uqvision.predict.device_decode import DeviceTransform, EncodedImages, decode_batch
from uqvision.training.loop import ImageTrainConfig, train_model

# torchvision 0.29 deprecates its image codecs in favour of TorchCodec (README: decoders)
pytestmark = pytest.mark.filterwarnings(
    "ignore:The image decoding and encoding capabilities of TorchVision:DeprecationWarning")

PREDICT = ["--quiet", "predict", "--model", "test_byobnet", "--random-init"]


@pytest.fixture(autouse=True)
def _fresh_checks():
    """Each test checks its own files: the per-process results of the image check start
    empty (a tmp_path may reuse a path with the size and time of an earlier test's file)."""
    images_module._CHECKED.clear()
    yield
    images_module._CHECKED.clear()


def _png(path: Path, seed: int = 0, size=(24, 20)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


def _folder(root: Path, classes=("cat", "dog"), n: int = 3) -> Path:
    for k, c in enumerate(classes):
        for i in range(n):
            _png(root / c / f"{i}.png", seed=10 * k + i)
    return root


def _damage_zlib(path: Path) -> None:
    """Flip bytes of a PNG's zlib stream and recompute every chunk's CRC: the chunks verify,
    the pixels do not inflate; the size is unchanged."""
    b = path.read_bytes()
    out, i = [b[:8]], 8
    while i < len(b):
        (n,), kind = struct.unpack(">I", b[i:i + 4]), b[i + 4:i + 8]
        data = bytearray(b[i + 8:i + 8 + n])
        if kind == b"IDAT":
            for k in range(20, len(data) - 8, 13):
                data[k] ^= 0x5A
        crc = zlib.crc32(kind + bytes(data)) & 0xFFFFFFFF
        out.append(struct.pack(">I", n) + kind + bytes(data) + struct.pack(">I", crc))
        i += 12 + n
    path.write_bytes(b"".join(out))


def _samples(folder) -> list[str]:
    return sorted(folder.sample_ids)


def _tv_samples(root: Path) -> list[str]:
    return sorted(Path(p).relative_to(root).as_posix() for p, _ in ImageFolder(root).samples)


# -- F1: a PNG is decoded by the check -------------------------------------------------------

def test_a_png_with_damaged_zlib_data_under_valid_crcs_is_found_by_the_check(
        tmp_path, refused, capsys):
    """Such a PNG passed the check (which only verified the CRCs), stopped the prediction
    half-way and was not left out by --skip-bad-images."""
    root = _folder(tmp_path / "data")
    bad = root / "cat" / "1.png"
    _damage_zlib(bad)
    assert check_image(bad).startswith("truncated or corrupt")
    out = tmp_path / "out"
    line = refused([*PREDICT, "--data", root, "--out", out])
    assert str(bad) in line and "unreadable" in line and "--skip-bad-images" in line
    assert not out.exists()  # refused before anything is written
    assert main([*PREDICT, "--data", str(root), "--out", str(out), "--skip-bad-images"]) == 0
    (cache,) = out.glob("*.nc")
    with xr.open_dataset(cache) as ds:
        assert ds.sizes["sample"] == 5 and "cat/1.png" not in ds["sample"].values
        assert json.loads(ds.attrs["skipped_images"]) == {"cat/1.png": check_image(bad)}
    # a damaged CRC is still found (verify), a sound PNG passes
    b = bytearray((root / "dog" / "0.png").read_bytes())
    b[-20] ^= 0xFF
    (root / "dog" / "0.png").write_bytes(bytes(b))
    assert "truncated or corrupt" in check_image(root / "dog" / "0.png")
    assert check_image(root / "dog" / "1.png") is None


# -- F2: an image that fails in a DataLoader worker --------------------------------------------

def _broken_after_the_check(root: Path) -> Path:
    """Check the folder (its results kept per process), then damage an image in place, its
    size and modification time kept: the check passes it, the loader fails on it."""
    assert check_images(ImageFolderDataset(root)) == {}
    path = root / "cat" / "1.png"
    st = path.stat()
    _damage_zlib(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return path


def test_an_image_failing_in_a_worker_is_the_same_one_line_as_without(tmp_path, refused):
    """With --workers >= 1 the error was torch's wrapping: "Caught BadImageError in DataLoader
    worker process 0. Original Traceback ..." with the worker's traceback in the line."""
    root = _folder(tmp_path / "data")
    path = _broken_after_the_check(root)
    lines = [refused([*PREDICT, "--data", root, "--out", tmp_path / f"out{w}", "--workers", w])
             for w in (0, 1)]
    assert lines[0] == lines[1], lines
    assert lines[0].startswith(f"uqvision predict: error: image '{path}': truncated or corrupt")
    assert "Caught" not in lines[1] and "Traceback" not in lines[1]


def test_training_checks_its_images_first_and_says_a_worker_failure_in_one_line(tmp_path,
                                                                                 refused):
    """``train`` had no image check: it stopped at the first batch holding a bad image, and
    with --workers >= 1 in torch's wrapping of the worker's traceback."""
    root = _folder(tmp_path / "data")
    bad = _png(root / "dog" / "bad.png")
    _damage_zlib(bad)
    line = refused(["--quiet", "train", "--arch", "test_byobnet", "--data", root, "--out",
                    tmp_path / "m", "--epochs", 1, "--input-size", 16])
    assert str(bad) in line and "unreadable" in line and "--skip-bad-images" not in line
    assert not list(tmp_path.glob("m*"))
    bad.unlink()
    path = _broken_after_the_check(root)
    config = ImageTrainConfig(arch="test_byobnet", epochs=1, input_size=16, batch_size=4,
                              num_workers=1)
    with pytest.raises(BadImageError) as err:
        train_model(root, tmp_path / "m", config, progress=False)
    assert str(err.value).startswith(f"image '{path}': truncated or corrupt")
    assert "\n" not in str(err.value) and "Caught" not in str(err.value)


# -- F3: links to folders ----------------------------------------------------------------------

def test_images_in_a_linked_sub_folder_are_read_as_torchvision_reads_them(tmp_path, refused):
    """A class folder's sub-folder that is a link was skipped: its images were silently
    dropped, where torchvision's ImageFolder (os.walk followlinks=True) reads them."""
    root = _folder(tmp_path / "data")
    outside = _folder(tmp_path / "elsewhere", classes=("more",), n=2) / "more"
    (root / "cat" / "linked").symlink_to(outside, target_is_directory=True)
    (root / "fox").symlink_to(outside, target_is_directory=True)  # a linked class folder
    ds = ImageFolderDataset(root)
    assert ds.classes == ImageFolder(root).classes == ["cat", "dog", "fox"]
    assert _samples(ds) == _tv_samples(root)
    assert {"cat/linked/0.png", "cat/linked/1.png"} <= set(ds.sample_ids) and len(ds) == 10
    # a link back to a folder that holds it would be followed for ever: refused, named
    (root / "cat" / "linked").unlink()
    (root / "dog" / "loop").symlink_to(root / "dog", target_is_directory=True)
    with pytest.raises(InputError, match=r"'dog/loop' is a link to .*a folder that holds it"):
        ImageFolderDataset(root)
    (root / "dog" / "loop").unlink()
    (root / "cat" / "up").symlink_to(tmp_path, target_is_directory=True)  # above the data
    line = refused([*PREDICT, "--data", root, "--out", tmp_path / "out"])
    assert "'cat/up' is a link to" in line and "remove the link" in line


# -- F4: hidden names ----------------------------------------------------------------------------

def test_hidden_names_follow_one_rule_at_every_depth(tmp_path):
    """A hidden class folder was skipped while ``cat/.thumbs/t.png`` was read and ``cat/._0.png``
    (a macOS resource fork) stopped the command; hidden names are now never read, in a folder
    and in a tar alike."""
    root = _folder(tmp_path / "data")
    _png(root / "cat" / ".thumbs" / "t.png")
    (root / "cat" / "._0.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (root / ".ipynb_checkpoints").mkdir()  # a hidden folder without images: ignored
    (root / ".DS_Store").write_bytes(b"\x00" * 16)
    ds = ImageFolderDataset(root)
    assert ds.classes == ["cat", "dog"] and len(ds) == 6 and check_images(ds) == {}
    tar = tmp_path / "data.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(root, arcname="data")
    assert _samples(ImageFolderDataset(tar)) == _samples(ds)
    flat = tmp_path / "flat"
    _png(flat / "a.png")
    (flat / "._a.png").write_bytes(b"\x00\x05\x16\x07")
    assert ImageFolderDataset(flat, unlabelled=True).sample_ids == ["a.png"]


def test_a_hidden_class_level_folder_with_images_is_refused(tmp_path, refused):
    """``.Trash-1000/deleted.png`` beside the class folders was skipped silently; torchvision's
    ImageFolder and timm count it as class 0, so under folder order every label would be off
    by one against a model they trained."""
    root = _folder(tmp_path / "data")
    _png(root / ".Trash-1000" / "files" / "deleted.png")
    assert ImageFolder(root).classes[0] == ".Trash-1000"
    line = refused([*PREDICT, "--data", root, "--out", tmp_path / "out"])
    assert "hidden folder '.Trash-1000' holds 1 image(s)" in line and "class 0" in line
    assert "the indices of the 2 class(es) after it ('cat', ...)" in line
    assert not (tmp_path / "out").exists()
    tar = tmp_path / "data.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(root, arcname="data")
    with pytest.raises(InputError, match=r"archive .*hidden folder '.Trash-1000' holds 1"):
        ImageFolderDataset(tar)


# -- F5: class names in two Unicode normalisations ---------------------------------------------

def test_class_names_are_matched_under_unicode_normalisation(tmp_path, capsys):
    """NFD folder names (macOS, zip) against the NFC names of a sidecar were "2 class(es)
    that model does not have: ['café', 'crème']" (the same names, shown)."""
    names = ["café", "crème", "eel"]
    root = tmp_path / "data"
    for k, c in enumerate(names):
        for i in range(2):
            _png(root / unicodedata.normalize("NFD", c) / f"{i}.png", seed=10 * k + i)
    ckpt = tmp_path / "nfc.safetensors"
    torch.manual_seed(0)
    save_file(timm.create_model("test_byobnet", num_classes=3).state_dict(), str(ckpt))
    # the model's order is not the folder's: labels must come from the names
    recorded = ["eel", "crème", "café"]
    ckpt.with_suffix(".json").write_text(json.dumps({"classes": recorded}, ensure_ascii=False))
    out = tmp_path / "out"
    assert main(["--quiet", "predict", "--model", f"test_byobnet={ckpt}", "--data", str(root),
                 "--out", str(out)]) == 0, capsys.readouterr().err
    (cache,) = out.glob("*.nc")
    with xr.open_dataset(cache) as ds:
        samples = [str(s) for s in ds["sample"].values]
        labels = ds["label"].values.tolist()
        assert ds.attrs["class_mapping"] == "name"
    assert all(s.split("/")[0] == unicodedata.normalize("NFD", s.split("/")[0])
               for s in samples)  # sample ids keep the folder's own names
    want = [recorded.index(unicodedata.normalize("NFC", s.split("/")[0])) for s in samples]
    assert labels == want == [2, 2, 1, 1, 0, 0]
    with pytest.raises(InputError, match=r"one name in two Unicode normalisations"):
        match_classes(["caf\u00e9", "cafe\u0301"], ["caf\u00e9"], folder="f", model="m")
    # the splits of a reproduction: one class, two forms; sorted as stored, 'é' composed
    # (U+00E9) comes after 'f', decomposed ('e' + U+0301) before it
    for split, form in (("train", "NFC"), ("val", "NFD")):
        for c in ("\u00e9", "f"):
            _png(tmp_path / "splits" / split / unicodedata.normalize(form, c) / "0.png")
    train, val = tmp_path / "splits" / "train", tmp_path / "splits" / "val"
    assert check_split_classes(train, {"test": val}) == ["f", "\u00e9"]
    with pytest.raises(InputError, match=r"another Unicode normalisation.*class 0 there"):
        check_split_classes(train, {"val": val}, same={"val"})  # read in its own order


# -- F8, F9: the device decoder ----------------------------------------------------------------

def test_a_one_pixel_png_under_the_device_decoder_is_writable(tmp_path):
    """A 1x1 non-JPEG reached torch as Pillow's read-only array ("The given NumPy array is not
    writable", printed by --decoder torchvision)."""
    root = tmp_path / "data"
    _png(root / "cat" / "t.png", size=(1, 1))
    _png(root / "dog" / "u.png", size=(3, 2))
    transform = eval_transform(DataConfig((3, 16, 16), (0.5,) * 3, (0.25,) * 3))
    enc = EncodedImages(ImageFolderDataset(root), DeviceTransform.of(transform))
    item, _, _ = enc[0]
    assert item.shape == (3, 1, 1) and item.flags.writeable and item.flags.c_contiguous
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = enc.to_device([item, enc[1][0]], [0, 1], "cpu")
    assert x.shape == (2, 3, 16, 16)


@pytest.mark.parametrize(("interpolation", "levels"), [("bilinear", 1), ("bicubic", 2)])
def test_device_pixels_of_an_extreme_aspect_ratio_stay_within_the_documented_levels(
        interpolation, levels):
    """docs/conventions.md said "at most one level" from Pillow; a 1000 x 3 JPEG upscaled by
    bicubic is two levels off (the horizontal pass's one level through the vertical pass's
    negative lobes), as the audit measured on a 4000 x 10 one."""
    transform = eval_transform(DataConfig((3, 32, 32), (0.5,) * 3, (0.25,) * 3,
                                          interpolation=interpolation))
    head, device = split_transform(transform).head, DeviceTransform.of(transform)
    worst = 0
    for seed in range(6):
        pixels = np.random.default_rng(seed).integers(0, 256, (3, 1000, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        want = np.asarray(head(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")),
                          dtype=np.int64)
        (decoded,) = decode_batch([np.frombuffer(buf.getvalue(), np.uint8).copy()], "cpu",
                                  ["wide.jpg"])
        got = device.image(decoded).permute(1, 2, 0).numpy().astype(np.int64)
        worst = max(worst, int(np.abs(got - want).max()))
    assert worst <= levels


# -- F10: 32-bit integer images ------------------------------------------------------------------

def test_a_32_bit_integer_image_is_read_as_torchvision_reads_it_or_refused(tmp_path):
    """A mode-I TIFF holding 0 ... 255 was scaled as 16-bit (255 -> 1: nearly black) where
    torchvision's loader keeps the values; 16-bit images are still scaled, not clipped."""
    grey = np.arange(256, dtype=np.int32).reshape(16, 16)
    tif = tmp_path / "i32.tif"
    Image.fromarray(grey, "I").save(tif)
    assert Image.open(tif).mode == "I" and check_image(tif) is None
    assert np.array_equal(np.asarray(load_image(tif)), np.asarray(Image.open(tif).convert("RGB")))
    wide = tmp_path / "i32_12bit.tif"
    Image.fromarray(grey * 16, "I").save(wide)
    with pytest.raises(BadImageError, match=r"'.*i32_12bit.tif': integer pixel values outside "
                                            r"\[0, 255\] \(mode I, range 0..4080\)"):
        load_image(wide)
    assert check_image(wide).startswith("integer pixel values outside [0, 255]")
    png16 = tmp_path / "w16.png"
    Image.fromarray(np.array([[0, 257, 65535]], dtype=np.uint16)).save(png16)
    assert np.asarray(load_image(png16))[0, :, 0].tolist() == [0, 1, 255]
    pgm = tmp_path / "g12.pgm"  # Pillow opens it as mode I scaled to 0 ... 65535: 16-bit
    pgm.write_bytes(b"P5\n3 1\n4095\n" + np.array([0, 2048, 4095], ">u2").tobytes())
    assert Image.open(pgm).mode == "I"
    assert np.asarray(load_image(pgm))[0, :, 0].tolist() == [0, 128, 255]


# -- data subset ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["truncated", "dangling link"])
def test_data_subset_refuses_a_chosen_image_that_does_not_read(tmp_path, refused, kind):
    """``data subset`` copied a truncated JPEG unchecked, and on a dangling link said
    "error: .../broken.jpg: does not exist" without naming --src."""
    src = _folder(tmp_path / "src", classes=("cat",), n=2)
    bad = src / "cat" / "bad.jpg"  # drawn: every image of the class is
    if kind == "truncated":
        buf = io.BytesIO()
        Image.fromarray(np.zeros((64, 64, 3), np.uint8) + 90).save(buf, "JPEG")
        bad.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    else:
        bad.symlink_to(tmp_path / "nowhere.jpg")
    out = tmp_path / "out"
    line = refused(["data", "subset", "--out", out, "--src", src, "--per-class", 3])
    assert line.startswith(f"uqvision data subset: error: --src '{src}' has 1 unreadable image(s): "
                           f"'{bad}': "), line
    assert ("truncated" in line) if kind == "truncated" else ("symbolic link" in line)
    assert "--skip-bad-images" not in line and not out.exists()
