"""ImageNet-C's own ``motion_blur``, ``snow``, ``frost`` and ``elastic_transform``, as
``ImageNet-C/create_c/make_imagenet_c.py`` (hendrycks/robustness; Hendrycks & Dietterich 2019)
defines them, where the PyPI package ``imagecorruptions`` differs.

- ``elastic_transform``: a random affine warp (three points around the centre moved by up to
  ``c[2]`` px, OpenCV's ``getAffineTransform``/``warpAffine``, reflected border), then a
  displacement field of uniform noise smoothed by a Gaussian (σ ``c[1]``, truncated at 3σ,
  reflected) and scaled by ``c[0]``, applied by bilinear ``map_coordinates``. The constants are
  the original's, ``244 * (2, 0.7, 0.1)`` ... ``244 * (0.12, 0.01, 0.02)`` px (its comment: 244
  for 224, "ultimately nothing is incorrect"): a pixel moves 9-69 px on average at
  severities 1-2 and 3-6 px at 3-5. ``imagecorruptions`` has no affine step and other σ and α
  (1.5-3.2 px).
- ``motion_blur``: ImageMagick's ``MotionBlurImage`` (radius, sigma) per severity at an angle
  drawn from U(-45, 45), through Wand, on the image written as PNG by PIL and read back by
  OpenCV. ``imagecorruptions`` re-implements the kernel in numpy.
- ``snow``: the same ImageMagick motion blur on the snow layer (angle U(-135, -45)).
  ``imagecorruptions`` blurs that layer with its numpy kernel too.
- ``frost``: one of the first five frost textures (``randint(5)``: the sixth is never
  drawn), read by OpenCV, a crop of the image's size at a random offset, blended unscaled.
  ``imagecorruptions`` (same texture files) enlarges the texture by 1.1 (bicubic) first.

Each draws from numpy's global RNG in the original's order (elastic: the affine's 3x2
uniform offsets, then the x field, then the y field; motion blur: the angle; snow: the
HxW normal layer, then the angle; frost: the texture, then the row and column offsets), so
that after ``np.random.seed(s)`` an image is what the original code gives with the same
libraries. The constants are the 224 px ones, in pixels, at any size (``make_imagenet_c.py``
defines no other size); the original's hard-coded ``224`` in shapes reads the image's own
size here. Frost takes images up to :data:`FROST_MAX` px a side (its smallest textures are
315 px high).

Motion blur and snow need ImageMagick's library and the Python package Wand
(``uqvision[imagemagick]``); :func:`check_imagemagick` refuses their absence in one line,
naming what to install. There is no fallback to another blur.
"""

from __future__ import annotations

import io

import numpy as np
from uqmetrics import InputError

__all__ = ["FROST_MAX", "IMAGEMAGICK_CORRUPTIONS", "ORIGINAL_CORRUPTIONS", "check_imagemagick",
           "elastic_transform", "frost", "imagemagick_version", "motion_blur", "snow"]

#: Corruptions computed here, as ``make_imagenet_c.py`` (the others are imagecorruptions').
ORIGINAL_CORRUPTIONS = ("motion_blur", "snow", "frost", "elastic_transform")
#: Those of them that run ImageMagick (through Wand).
IMAGEMAGICK_CORRUPTIONS = ("motion_blur", "snow")
#: What to install for them (Debian's library; the package extra).
INSTALL = ("Debian's ImageMagick library (apt-get install libmagickwand-6.q16-6) and Wand "
           "(pip install 'uqvision[imagemagick]')")

#: (alpha, sigma, affine shift) per severity, px (the original's ``244 * ...``).
_ELASTIC = tuple((244 * a, 244 * s, 244 * t) for a, s, t in (
    (2, 0.7, 0.1), (2, 0.08, 0.2), (0.05, 0.01, 0.02), (0.07, 0.01, 0.02), (0.12, 0.01, 0.02)))
#: (radius, sigma) of ImageMagick's motion blur per severity.
_MOTION = ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15))
#: Snow: (layer mean, layer std, zoom, threshold, blur radius, blur sigma, image weight).
_SNOW = ((0.1, 0.3, 3, 0.5, 10, 4, 0.8), (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
         (0.55, 0.3, 4, 0.9, 12, 8, 0.7), (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
         (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55))
#: Frost: (image weight, texture weight) per severity; the textures the original draws from.
_FROST = ((1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75))
_FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg")
#: Largest image side frost takes: its textures' smallest side (315 px) less one, as the
#: original draws the crop's offset from ``randint(0, texture side - image side)``.
FROST_MAX = 314
_TEXTURES: dict[str, np.ndarray] = {}


def _wand_image():
    """Wand's ``Image`` class; :class:`~uqmetrics.InputError` (one line) where Wand or
    ImageMagick's library is missing."""
    try:
        from wand.image import Image
    except ImportError as exc:  # Wand absent, or its MagickWand library not found
        why = " ".join(str(exc).split()).split(". ")[0]
        raise InputError(f"corruptions: motion_blur and snow run ImageMagick's MotionBlurImage "
                         f"through Wand, which cannot be loaded ({why}); install {INSTALL}"
                         ) from None
    return Image


def check_imagemagick(corruptions) -> None:
    """Refuse ``corruptions`` naming one of :data:`IMAGEMAGICK_CORRUPTIONS` where Wand or
    ImageMagick's library is missing (:class:`~uqmetrics.InputError`, naming what to
    install); nothing is run (a process pool forks after this check)."""
    if any(c in IMAGEMAGICK_CORRUPTIONS for c in corruptions):
        _wand_image()


def imagemagick_version() -> str:
    """``"ImageMagick 6.9.11-60 Q16, Wand 0.7.2"``: the versions the blur runs on."""
    _wand_image()
    import wand.version
    return f"{' '.join(wand.version.MAGICK_VERSION.split()[:3])}, Wand {wand.version.VERSION}"


def _magick_motion_blur(img, radius: float, sigma: float, angle: float) -> np.ndarray:
    """``img`` (PIL) as PNG through ImageMagick's ``MotionBlurImage``, decoded by OpenCV as the
    original does (``IMREAD_UNCHANGED``: BGR, or one channel where ImageMagick wrote a grey
    PNG)."""
    import cv2

    buf = io.BytesIO()
    img.save(buf, format="PNG")
    with _wand_image()(blob=buf.getvalue()) as im:
        im.motion_blur(radius=radius, sigma=sigma, angle=angle)
        blob = im.make_blob()
    return cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_UNCHANGED)


def motion_blur(x: np.ndarray, severity: int = 1) -> np.ndarray:
    """ImageNet-C's motion blur of the uint8 HxWx3 image ``x`` (module docstring).

    Returns
    -------
    numpy.ndarray
        uint8 HxWx3.
    """
    from PIL import Image

    radius, sigma = _MOTION[severity - 1]
    out = _magick_motion_blur(Image.fromarray(x), radius, sigma, np.random.uniform(-45, 45))
    if out.ndim == 2:  # a grey image comes back as one channel (the original: shape (224, 224))
        return np.stack([out] * 3, axis=-1)
    return out[..., [2, 1, 0]]  # BGR -> RGB


def _clipped_zoom(img: np.ndarray, factor: float) -> np.ndarray:
    """The original's ``clipped_zoom``: the centre ``ceil(n / factor)`` px of each side zoomed
    by ``factor`` (scipy, order 1), trimmed to the centre ``n`` px (per side here; the original
    takes the height for both)."""
    from scipy.ndimage import zoom

    h, w = img.shape[:2]
    ch, cw = int(np.ceil(h / factor)), int(np.ceil(w / factor))
    top, left = (h - ch) // 2, (w - cw) // 2
    img = zoom(img[top:top + ch, left:left + cw], (factor, factor, 1), order=1)
    top, left = (img.shape[0] - h) // 2, (img.shape[1] - w) // 2
    return img[top:top + h, left:left + w]


def snow(x: np.ndarray, severity: int = 1) -> np.ndarray:
    """ImageNet-C's snow of the uint8 HxWx3 image ``x`` (module docstring).

    Returns
    -------
    numpy.ndarray
        float HxWx3 in [0, 255] (``np.uint8`` of it is the saved image).
    """
    import cv2
    from PIL import Image

    mean, std, factor, threshold, radius, sigma, weight = _SNOW[severity - 1]
    img = np.asarray(x, dtype=np.float32) / 255.
    h, w = img.shape[:2]
    layer = _clipped_zoom(np.random.normal(size=(h, w), loc=mean, scale=std)[..., None], factor)
    layer[layer < threshold] = 0
    grey = Image.fromarray((np.clip(layer[..., 0], 0, 1) * 255).astype(np.uint8))  # mode L
    layer = (_magick_motion_blur(grey, radius, sigma, np.random.uniform(-135, -45))
             / 255.)[..., None]
    img = weight * img + (1 - weight) * np.maximum(
        img, cv2.cvtColor(img, cv2.COLOR_RGB2GRAY).reshape(h, w, 1) * 1.5 + 0.5)
    return np.clip(img + layer + np.rot90(layer, k=2), 0, 1) * 255


def _frost_texture(name: str) -> np.ndarray:
    """Frost texture ``name`` as OpenCV reads it (BGR uint8), from the files imagecorruptions
    ships (the original's, byte for byte); read once per process."""
    if name not in _TEXTURES:
        import importlib.util
        import os

        import cv2

        spec = importlib.util.find_spec("imagecorruptions")
        path = os.path.join(spec.submodule_search_locations[0], "frost", name)
        texture = cv2.imread(path)
        if texture is None:
            raise FileNotFoundError(f"{path}: frost texture of imagecorruptions missing or "
                                    "unreadable; reinstall imagecorruptions")
        _TEXTURES[name] = texture
    return _TEXTURES[name]


def frost(x: np.ndarray, severity: int = 1) -> np.ndarray:
    """ImageNet-C's frost of the uint8 HxWx3 image ``x`` (module docstring; sides up to
    :data:`FROST_MAX` px).

    Returns
    -------
    numpy.ndarray
        float HxWx3 in [0, 255] (``np.uint8`` of it is the saved image).
    """
    weight, amount = _FROST[severity - 1]
    texture = _frost_texture(_FROST_FILES[np.random.randint(5)])
    h, w = np.shape(x)[:2]
    top = np.random.randint(0, texture.shape[0] - h)
    left = np.random.randint(0, texture.shape[1] - w)
    crop = texture[top:top + h, left:left + w][..., [2, 1, 0]]  # BGR -> RGB
    return np.clip(weight * np.asarray(x) + amount * crop, 0, 255)


def elastic_transform(x: np.ndarray, severity: int = 1) -> np.ndarray:
    """ImageNet-C's elastic transform of the uint8 HxWx3 image ``x`` (module docstring).

    Returns
    -------
    numpy.ndarray
        float32 HxWx3 in [0, 255] (``np.uint8`` of it is the saved image).
    """
    import cv2
    from scipy.ndimage import gaussian_filter, map_coordinates

    alpha, sigma, shift = _ELASTIC[severity - 1]
    img = np.asarray(x, dtype=np.float32) / 255.
    h, w, channels = img.shape
    # the random affine: three points around the centre, each moved by U(-shift, shift) px
    centre, side = np.float32((h, w)) // 2, min(h, w) // 3
    src = np.float32([centre + side, [centre[0] + side, centre[1] - side], centre - side])
    dst = src + np.random.uniform(-shift, shift, size=src.shape).astype(np.float32)
    img = cv2.warpAffine(img, cv2.getAffineTransform(src, dst), (w, h),
                         borderMode=cv2.BORDER_REFLECT_101)
    # the elastic field: U(-1, 1) noise smoothed (sigma, truncated at 3 sigma), times alpha
    dx, dy = ((gaussian_filter(np.random.uniform(-1, 1, size=(h, w)), sigma, mode="reflect",
                               truncate=3) * alpha).astype(np.float32) for _ in range(2))
    rows = np.arange(h)[:, None, None] + dy[..., None]  # float64, as the original's indices
    cols = np.arange(w)[None, :, None] + dx[..., None]
    coords = np.broadcast_arrays(rows, cols, np.arange(channels)[None, None, :])
    return np.clip(map_coordinates(img, coords, order=1, mode="reflect"), 0, 1) * 255
