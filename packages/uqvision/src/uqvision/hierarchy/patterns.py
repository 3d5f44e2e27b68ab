"""Drawing the ``hierarchy`` image set (:mod:`uqvision.hierarchy`): the procedural pattern
families (:data:`FAMILIES`: one per superclass, a class is one parameter setting), the
per-image randomness (:class:`Augmentation`: affine map, colour jitter, pixel noise) and the
rendering of a class's pattern in its palette under one draw, anti-aliased (a class of the
tree as drawn: :class:`_Class`).

Every function here is pure: its randomness comes from the generator it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from uqmetrics.metrics.registry import Registry

__all__ = [
    "AUGMENTATION",
    "FAMILIES",
    "Augmentation",
]

_SUPERSAMPLE = 2  # patterns are evaluated on a 2x finer grid and box-averaged (anti-aliasing)


# --------------------------------------------------------------------------------------------
# difficulty

@dataclass(frozen=True)
class Augmentation:
    """The per-image randomness: affine transform, colour jitter, pixel noise.

    These set the difficulty of the data (tuned so that a small CNN trained on the ``cpu``
    scale reaches 70–95 % test accuracy); they are recorded in ``classes.json``.

    Parameters
    ----------
    rotation_deg : float
        Rotation ~ U(-r, r) degrees.
    log_scale : float
        Zoom = exp(U(-s, s)).
    shear : float
        Shear coefficient ~ U(-h, h).
    translate : float
        Shift ~ U(-t, t) per axis, in units of the half image side.
    brightness, contrast, channel : float
        Gains ~ U(1 - j, 1 + j): overall, around grey 0.5, and per colour channel.
    noise_std : float
        Standard deviation of i.i.d. Gaussian pixel noise (intensities in [0, 1]).

    Notes
    -----
    With pattern colour ``x`` (H, W, 3) the image is
    ``clip(contrast * (brightness * gain_c * x - 0.5) + 0.5 + noise, 0, 1)``: affine in ``x``
    until the clip, so a blend ``alpha * x_a + (1 - alpha) * x_b`` under one draw equals the
    same blend of the two classes' images under that draw (what the mixed set relies on).
    """

    rotation_deg: float = 16.0
    log_scale: float = 0.15
    shear: float = 0.1
    translate: float = 0.3
    brightness: float = 0.2
    contrast: float = 0.25
    channel: float = 0.08
    noise_std: float = 0.12


#: The difficulty every scale uses.
AUGMENTATION = Augmentation()


# --------------------------------------------------------------------------------------------
# pattern families: name -> make(k, n, rng) -> pattern(u, v) with values in [0, 1]
#
# ``k`` is the class number within the family (0 .. n-1) and the one thing that differs between
# the classes of a family; ``rng`` draws the family's layout (blob and stroke places, phases) and
# is seeded alike for every class of the superclass. u, v are coordinates with the image spanning
# [-1, 1] (u to the right, v downwards). Most settings are confounded by the random affine map
# (an orientation by the rotation, a frequency or size by the zoom), which makes the classes of
# one family hard to tell apart.

Pattern = Callable[[np.ndarray, np.ndarray], np.ndarray]
FAMILIES: Registry[Callable[[int, int, np.random.Generator], Pattern]] = Registry(
    "pattern family")


def _wave(x):
    return 0.5 + 0.5 * np.cos(x)


def _geom(k, n, lo, hi):
    """The k-th of n settings spread geometrically over [lo, hi]."""
    return lo * (hi / lo) ** (k / (n - 1))


@FAMILIES.register(name="gratings")
def _gratings(k, n, rng):
    """Sine gratings; the class sets the orientation (n orientations over 180 degrees)."""
    theta, phase = np.pi * k / n, rng.uniform(0, 2 * np.pi)
    c, s = np.cos(theta), np.sin(theta)
    return lambda u, v: _wave(2 * np.pi * 1.25 * (c * u + s * v) + phase)


@FAMILIES.register(name="rings")
def _rings(k, n, rng):
    """Concentric rings around a point; the class sets the ring frequency."""
    f = _geom(k, n, 0.8, 3.0)
    cu, cv = rng.uniform(-0.3, 0.3, 2)
    return lambda u, v: _wave(2 * np.pi * f * np.hypot(u - cu, v - cv))


@FAMILIES.register(name="blobs")
def _blobs(k, n, rng):
    """A constellation of five Gaussian blobs; the class sets its size."""
    size = _geom(k, n, 0.35, 1.0)
    angle = 2 * np.pi * (np.arange(5) + rng.uniform(-0.3, 0.3, 5)) / 5
    centres = size * rng.uniform(0.35, 0.75, (5, 1)) * np.stack([np.cos(angle), np.sin(angle)], -1)
    width = size * 0.2

    def pattern(u, v):
        d2 = (u[..., None] - centres[:, 0]) ** 2 + (v[..., None] - centres[:, 1]) ** 2
        return np.minimum(np.exp(-d2 / (2 * width ** 2)).sum(-1), 1.0)

    return pattern


@FAMILIES.register(name="checkers")
def _checkers(k, n, rng):
    """Soft checkerboards; the class sets the number of cells."""
    f = _geom(k, n, 1.0, 3.5)
    pu, pv = rng.uniform(0, 2 * np.pi, 2)
    return lambda u, v: 0.5 + 0.5 * np.tanh(4 * np.sin(np.pi * f * u + pu)
                                            * np.sin(np.pi * f * v + pv))


@FAMILIES.register(name="strokes")
def _strokes(k, n, rng):
    """Eight parallel strokes at fixed random places; the class sets their orientation."""
    theta = np.pi * k / n
    mid = rng.uniform(-0.7, 0.7, (8, 2))
    half = 0.3 * np.array([np.cos(theta), np.sin(theta)])
    a, ab = mid - half, 2 * half

    def pattern(u, v):
        p = np.stack([u, v], -1)[..., None, :] - a                # (..., 8, 2)
        t = np.clip((p * ab).sum(-1) / (ab * ab).sum(), 0, 1)
        d2 = ((p - t[..., None] * ab) ** 2).sum(-1)
        return np.exp(-d2 / (2 * 0.07 ** 2)).max(-1)

    return pattern


@FAMILIES.register(name="spokes")
def _spokes(k, n, rng):
    """Radial spokes around the centre; the class sets the number of spokes."""
    m, phase = k + 3, rng.uniform(0, 2 * np.pi)
    return lambda u, v: _wave(m * np.arctan2(v, u) + phase)


@FAMILIES.register(name="dots")
def _dots(k, n, rng):
    """A square lattice of dots (radius 0.3 periods); the class sets the period."""
    period = _geom(k, n, 0.3, 0.9)
    ou, ov = rng.uniform(0, period, 2)

    def pattern(u, v):
        du = (u + ou) % period - period / 2
        dv = (v + ov) % period - period / 2
        return 1.0 / (1.0 + np.exp((np.hypot(du, dv) - 0.3 * period) / (0.06 * period)))

    return pattern


@FAMILIES.register(name="spirals")
def _spirals(k, n, rng):
    """Three-armed spirals; the class sets the winding (signed: left- or right-handed)."""
    c, phase = -2.5 + 5.0 * k / (n - 1), rng.uniform(0, 2 * np.pi)
    return lambda u, v: _wave(3 * np.arctan2(v, u) + 2 * np.pi * c * np.hypot(u, v) + phase)


@FAMILIES.register(name="waves")
def _waves(k, n, rng):
    """Wavy horizontal lines; the class sets the amplitude of the waviness."""
    a, phase = 3.0 * k / (n - 1), rng.uniform(0, 2 * np.pi)
    return lambda u, v: _wave(2 * np.pi * 1.5 * v + a * np.sin(2 * np.pi * 0.75 * u) + phase)


@FAMILIES.register(name="polygons")
def _polygons(k, n, rng):
    """Outlines of a regular polygon; the class sets the number of sides."""
    m, phase = k + 3, rng.uniform(0, 2 * np.pi)

    def pattern(u, v):
        phi = (np.arctan2(v, u) + phase) % (2 * np.pi / m) - np.pi / m
        edge = 0.6 * np.cos(np.pi / m) / np.cos(phi)
        return np.exp(-(np.hypot(u, v) - edge) ** 2 / (2 * 0.06 ** 2))

    return pattern


# --------------------------------------------------------------------------------------------
# rendering

@dataclass(frozen=True)
class _Class:
    """A class of the tree (:mod:`uqvision.hierarchy.dataset` builds them): its name,
    superclass, family and number in it, role and group, palette (``fg``, ``bg``) and the
    pattern its images draw (:func:`_colour`)."""

    name: str
    superclass: str
    family: str
    k: int
    role: str
    group: str | None
    fg: tuple[float, float, float]
    bg: tuple[float, float, float]
    pattern: Pattern = field(repr=False, compare=False)


@dataclass(frozen=True)
class _Draw:
    """One image's random draw: affine map of the coordinates, colour jitter, noise."""

    matrix: np.ndarray   # (2, 2)
    shift: np.ndarray    # (2,)
    gain: np.ndarray     # (3,) brightness * channel gain
    contrast: float
    noise: np.ndarray    # (H, W, 3)


def _draw(rng: np.random.Generator, size: int, aug: Augmentation = AUGMENTATION) -> _Draw:
    theta = np.deg2rad(rng.uniform(-aug.rotation_deg, aug.rotation_deg))
    zoom = np.exp(rng.uniform(-aug.log_scale, aug.log_scale))
    shear = rng.uniform(-aug.shear, aug.shear)
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    matrix = rot @ np.array([[1.0, shear], [0.0, 1.0]]) / zoom
    shift = rng.uniform(-aug.translate, aug.translate, 2)
    brightness = rng.uniform(1 - aug.brightness, 1 + aug.brightness)
    gain = brightness * rng.uniform(1 - aug.channel, 1 + aug.channel, 3)
    contrast = rng.uniform(1 - aug.contrast, 1 + aug.contrast)
    noise = rng.normal(0.0, aug.noise_std, (size, size, 3))
    return _Draw(matrix, shift, gain, float(contrast), noise)


def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    m = size * _SUPERSAMPLE
    x = (np.arange(m) + 0.5) / m * 2 - 1
    v, u = np.meshgrid(x, x, indexing="ij")
    return u, v


def _colour(c: _Class, size: int, d: _Draw | None) -> np.ndarray:
    """The class's pattern in its palette under the draw's affine map (none: the prototype),
    shape (H, W, 3), values in [0, 1]."""
    u, v = _grid(size)
    if d is not None:
        u, v = (d.matrix[0, 0] * u + d.matrix[0, 1] * v + d.shift[0],
                d.matrix[1, 0] * u + d.matrix[1, 1] * v + d.shift[1])
    val = c.pattern(u, v).reshape(size, _SUPERSAMPLE, size, _SUPERSAMPLE).mean((1, 3))
    fg, bg = np.asarray(c.fg), np.asarray(c.bg)
    return bg + val[..., None] * (fg - bg)


def _jitter(x: np.ndarray, d: _Draw) -> np.ndarray:
    """Colour jitter and noise (affine in ``x``; not clipped)."""
    return d.contrast * (x * d.gain - 0.5) + 0.5 + d.noise


def _to_uint8(x: np.ndarray) -> np.ndarray:
    return np.round(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)
