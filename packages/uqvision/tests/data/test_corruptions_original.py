"""ImageNet-C's motion blur, snow, frost and elastic transform as ``make_imagenet_c.py`` defines
them (uqvision.data.corruptions_original), on scikit-learn's two photographs at 224 px.

The references below transcribe the original's definition step by step (hendrycks/robustness,
ImageNet-C/create_c/make_imagenet_c.py): its constants, its libraries (scikit-image's
``gaussian``, a flattened 3-D ``map_coordinates``, ImageMagick's ``MagickMotionBlurImage``
called through ctypes as the original's ``MotionImage`` does) and its order of draws from
numpy's global RNG. Each severity runs once, on one photograph in turn, under the seed the
generator gives it.
"""

import ctypes
import importlib.util
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from uqvision.cli import main
from uqvision.data.corruptions import (
    CORRUPTIONS,
    JPEG_QUALITY,
    METADATA_FILE,
    _corrupt,
    _prepare,
    _seed,
    implementations,
    make_corrupted_folder,
    reference_corruptions,
)
from uqvision.data.corruptions_original import ORIGINAL_CORRUPTIONS


@pytest.fixture(scope="module")
def photos():
    """scikit-learn's china.jpg and flower.jpg (the files of
    ``sklearn.datasets.load_sample_images``, read without importing scikit-learn's datasets),
    resized to 256 and centre-cropped to 224 as ImageNet-C (uint8 224x224x3)."""
    folder = Path(importlib.util.find_spec("sklearn").origin).parent / "datasets" / "images"
    return {n: _prepare(Image.open(folder / n), 256, 224) for n in ("china.jpg", "flower.jpg")}


def _cases(photos, corruption):
    """(severity, photograph, its seed) for severities 1..5, the photographs in turn."""
    names = sorted(photos)
    for s in range(1, 6):
        name = names[s % 2]
        yield s, photos[name], _seed(0, corruption, s, name)


# --- the original's definitions, transcribed ---------------------------------------------

def _original_elastic(img, severity):
    import cv2
    from scipy.ndimage import map_coordinates
    from skimage.filters import gaussian

    alpha, sigma, amp = [(244 * 2, 244 * 0.7, 244 * 0.1), (244 * 2, 244 * 0.08, 244 * 0.2),
                         (244 * 0.05, 244 * 0.01, 244 * 0.02),
                         (244 * 0.07, 244 * 0.01, 244 * 0.02),
                         (244 * 0.12, 244 * 0.01, 244 * 0.02)][severity - 1]
    a = np.array(img, dtype=np.float32) / 255.
    size = a.shape[:2]
    mid = np.float32(size) // 2
    third = min(size) // 3
    before = np.float32([mid + third, [mid[0] + third, mid[1] - third], mid - third])
    after = before + np.random.uniform(-amp, amp, size=before.shape).astype(np.float32)
    a = cv2.warpAffine(a, cv2.getAffineTransform(before, after), size[::-1],
                       borderMode=cv2.BORDER_REFLECT_101)
    fx = gaussian(np.random.uniform(-1, 1, size=size), sigma, mode="reflect", truncate=3)
    fy = gaussian(np.random.uniform(-1, 1, size=size), sigma, mode="reflect", truncate=3)
    fx = (fx * alpha).astype(np.float32)[..., None]
    fy = (fy * alpha).astype(np.float32)[..., None]
    gx, gy, gz = np.meshgrid(np.arange(a.shape[1]), np.arange(a.shape[0]),
                             np.arange(a.shape[2]))
    where = (np.reshape(gy + fy, (-1, 1)), np.reshape(gx + fx, (-1, 1)), np.reshape(gz, (-1, 1)))
    moved = map_coordinates(a, where, order=1, mode="reflect").reshape(a.shape)
    return np.clip(moved, 0, 1) * 255


def _magick_blur_png(pil, radius, sigma, angle):
    """The original's ``MotionImage.motion_blur``: PIL's PNG into Wand, the C function called
    through ctypes, PNG out, decoded by OpenCV unchanged."""
    import cv2
    from wand.api import library
    from wand.image import Image as WandImage

    library.MagickMotionBlurImage.argtypes = (ctypes.c_void_p, ctypes.c_double,
                                              ctypes.c_double, ctypes.c_double)
    buf = io.BytesIO()
    pil.save(buf, format="PNG")
    im = WandImage(blob=buf.getvalue())
    library.MagickMotionBlurImage(im.wand, radius, sigma, angle)
    blob = im.make_blob()
    im.close()
    return cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_UNCHANGED)


def _original_motion_blur(img, severity):
    radius, sigma = [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)][severity - 1]
    out = _magick_blur_png(Image.fromarray(img), radius, sigma, np.random.uniform(-45, 45))
    if out.shape != (224, 224):
        return np.clip(out[..., [2, 1, 0]], 0, 255)
    return np.clip(np.array([out, out, out]).transpose((1, 2, 0)), 0, 255)


def _original_snow(img, severity):
    import cv2
    from scipy.ndimage import zoom

    c = [(0.1, 0.3, 3, 0.5, 10, 4, 0.8), (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
         (0.55, 0.3, 4, 0.9, 12, 8, 0.7), (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
         (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)][severity - 1]
    x = np.array(img, dtype=np.float32) / 255.
    layer = np.random.normal(size=x.shape[:2], loc=c[0], scale=c[1])[..., None]
    n = layer.shape[0]  # the original's clipped_zoom: square, centre crop, centre trim
    k = int(np.ceil(n / c[2]))
    top = (n - k) // 2
    layer = zoom(layer[top:top + k, top:top + k], (c[2], c[2], 1), order=1)
    trim = (layer.shape[0] - n) // 2
    layer = layer[trim:trim + n, trim:trim + n]
    layer[layer < c[3]] = 0
    grey = Image.fromarray((np.clip(layer.squeeze(), 0, 1) * 255).astype(np.uint8))
    layer = _magick_blur_png(grey, c[4], c[5], np.random.uniform(-135, -45)) / 255.
    layer = layer[..., None]
    x = c[6] * x + (1 - c[6]) * np.maximum(
        x, cv2.cvtColor(x, cv2.COLOR_RGB2GRAY).reshape(224, 224, 1) * 1.5 + 0.5)
    return np.clip(x + layer + np.rot90(layer, k=2), 0, 1) * 255


def _original_frost(img, severity):
    import importlib.util

    import cv2

    c = [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)][severity - 1]
    files = ["frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg",
             "frost6.jpg"]  # imagecorruptions ships the original's six textures
    folder = Path(importlib.util.find_spec("imagecorruptions").submodule_search_locations[0])
    texture = cv2.imread(str(folder / "frost" / files[np.random.randint(5)]))
    r = np.random.randint(0, texture.shape[0] - 224)
    q = np.random.randint(0, texture.shape[1] - 224)
    texture = texture[r:r + 224, q:q + 224][..., [2, 1, 0]]
    return np.clip(c[0] * np.array(img) + c[1] * texture, 0, 255)


ORIGINALS = {"elastic_transform": _original_elastic, "motion_blur": _original_motion_blur,
             "snow": _original_snow, "frost": _original_frost}


def _original(corruption, img, severity, seed):
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        return np.uint8(ORIGINALS[corruption](img, severity))
    finally:
        np.random.set_state(state)


# --- the tests ----------------------------------------------------------------------------

def test_the_references_cover_every_original_corruption():
    assert set(ORIGINALS) == set(ORIGINAL_CORRUPTIONS) <= set(CORRUPTIONS)


@pytest.mark.parametrize("corruption", ["elastic_transform", "frost"])
def test_numpy_corruptions_are_the_originals(photos, corruption):
    """Bit-identical to the original at every severity (imagecorruptions' elastic is another
    corruption; its frost enlarges the texture by 1.1, bicubic, and differs on 56-98 % of the
    pixels)."""
    for s, img, seed in _cases(photos, corruption):
        before = np.random.get_state()[1].copy()
        got = _corrupt(img, corruption, s, seed)
        assert (np.random.get_state()[1] == before).all()  # the caller's RNG is left alone
        assert np.array_equal(got, _original(corruption, img, s, seed)), (corruption, s)


def _mean_displacement(out, rows, cols):
    out = out.astype(float)
    return float(np.hypot(out[..., 0] - rows, out[..., 1] - cols).mean())


def test_elastic_transform_moves_the_originals_distance():
    """On an image whose pixels hold their own row and column, the mean distance a pixel
    moves: the original's severities 1 and 2 (a random affine moving its points up to 24 and
    49 px, then a smooth field) move it more than 5 px (9-28 and 18-69 px over 40 seeds);
    imagecorruptions' elastic (no affine, other sigma and alpha) 1-3 px. (Severities 3-5 move
    the original's 3-6 px, imagecorruptions' 2-3 px: the equality test tells them apart.)"""
    rows, cols = np.meshgrid(np.arange(224), np.arange(224), indexing="ij")
    ramp = np.stack([rows, cols, np.zeros_like(rows)], axis=-1).astype(np.uint8)
    ref = reference_corruptions()
    for s in (1, 2):
        seed = _seed(0, "elastic_transform", s, "ramp")
        ours = _mean_displacement(_corrupt(ramp, "elastic_transform", s, seed), rows, cols)
        np.random.seed(seed)
        theirs = _mean_displacement(ref.corrupt(ramp, corruption_name="elastic_transform",
                                                severity=s), rows, cols)
        assert ours > 5 and 1 < theirs < 3, (s, ours, theirs)


@pytest.mark.parametrize("corruption", ["motion_blur", "snow"])
def test_imagemagick_corruptions_are_the_originals(photos, magick, corruption):
    """Bit-identical to ImageMagick's MotionBlurImage called as the original calls it, at every
    severity (imagecorruptions' numpy blur differs by one grey level on 0.2-0.5 % of the
    pixels of motion blur, and more on snow)."""
    for s, img, seed in _cases(photos, corruption):
        got = _corrupt(img, corruption, s, seed)
        assert np.array_equal(got, _original(corruption, img, s, seed)), (corruption, s)


def test_generator_uses_and_records_the_originals(photos, magick, tmp_path):
    """``uqvision data imagenet-c`` writes the original's images (JPEG, quality 85) and records
    which implementation made each corruption."""
    src = tmp_path / "src" / "photos"
    src.mkdir(parents=True)
    for name, img in photos.items():
        Image.fromarray(img).save(src / name.replace(".jpg", ".png"))
    names = ("motion_blur", "snow", "frost", "elastic_transform", "fog")
    out = make_corrupted_folder(src.parent, tmp_path / "c", corruptions=names, severities=(2,),
                                resize=224, crop=224, progress=False)
    for c in ORIGINAL_CORRUPTIONS:
        for name in photos:
            stem = name.replace(".jpg", "")
            img = _prepare(Image.open(src / f"{stem}.png"), 224, 224)
            want = io.BytesIO()
            Image.fromarray(_original(c, img, 2, _seed(0, c, 2, f"photos/{stem}.png"))).save(
                want, format="JPEG", quality=JPEG_QUALITY, optimize=True)
            assert (out / c / "2" / "photos" / f"{stem}.JPEG").read_bytes() == want.getvalue()
    made = json.loads((out / METADATA_FILE).read_text())["implementations"]
    assert made == implementations(names)
    assert made["fog"].startswith("imagecorruptions 1.")
    for c in ORIGINAL_CORRUPTIONS:
        assert made[c].startswith("make_imagenet_c.py of hendrycks/robustness"), made
    for c in ("motion_blur", "snow"):
        assert "; ImageMagick 6." in made[c] and ", Wand 0." in made[c], made


def test_missing_imagemagick_is_one_line(photos, tmp_path, monkeypatch, capsys):
    """Without Wand (or ImageMagick's library) motion blur and snow are refused before any
    work, in one line naming what to install; never another blur. Elastic needs neither."""
    src = tmp_path / "src" / "photos"
    src.mkdir(parents=True)
    Image.fromarray(photos["china.jpg"]).save(src / "china.png")
    monkeypatch.setitem(sys.modules, "wand.image", None)  # as where Wand is not installed
    assert main(["data", "imagenet-c", "--src", str(src.parent), "--out", str(tmp_path / "c"),
                 "--corruptions", "fog,motion_blur", "--severities", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("uqvision data imagenet-c: error: corruptions: "
                                              "motion_blur and snow run ImageMagick"), err
    assert "libmagickwand-6.q16-6" in err and "pip install 'uqvision[imagemagick]'" in err
    assert not (tmp_path / "c").exists()
    assert set(implementations(["elastic_transform"])) == {"elastic_transform"}


def test_frost_refuses_images_larger_than_its_textures(tmp_path):
    """The original crops frost from textures at least 315 px high: a larger crop is refused
    (not another texture scale, as imagecorruptions' enlarged one)."""
    with pytest.raises(ValueError, match=r"crop 315 is above 314 px, the largest image "
                       "ImageNet-C's frost textures cover; give crop <= 314 or leave frost out"):
        make_corrupted_folder(tmp_path / "src", tmp_path / "c", corruptions=("fog", "frost"),
                              resize=320, crop=315, progress=False)
    assert not (tmp_path / "c").exists()
