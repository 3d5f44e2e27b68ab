"""ImageNet-C made locally: the corruptions of ImageNet-C's ``make_imagenet_c.py`` applied to a
clean image folder (:func:`make_corrupted_folder`; ``uqvision data imagenet-c --src DIR --out
DIR``).

The convention follows ImageNet-C's own ``make_imagenet_c.py`` (Hendrycks & Dietterich 2019):
each image is resized (short side ``resize``, bilinear) and centre-cropped (``crop``) as
torchvision's ``Resize(256)`` + ``CenterCrop(224)``, corrupted, and saved as JPEG with PIL at
``quality=85, optimize=True`` (the original's exact call). The corruption functions are those
of the PyPI package ``imagecorruptions`` (bethgelab's release of ImageNet-C's code and frost
images), except four where that package is not the original: ``motion_blur``, ``snow``,
``frost`` and ``elastic_transform`` are :mod:`uqvision.data.corruptions_original`, as
``make_imagenet_c.py`` defines them (motion blur and snow through ImageMagick's
``MotionBlurImage`` via Wand, the ``uqvision[imagemagick]`` extra). The output is ImageNet-C's
layout, ``<out>/<corruption>/<severity>/<class>/<stem>.JPEG`` (the ``imagenet-c`` evaluation
set of :mod:`uqvision.evalsets` expands it), with a metadata file ``<out>/imagenet-c.json``
that records, among the options, which implementation made each corruption.

Every (image, corruption, severity) is deterministic: numpy's global RNG (the one every
corruption function draws from) is seeded with ``derive_seed(seed, corruption index, severity,
crc32(relative path)) % 2**32`` around the call, where the corruption index is the position in
:data:`CORRUPTIONS` and the relative path is the sample id of
:class:`~uqvision.data.ImageFolderDataset` (POSIX, UTF-8). Files are written once, under a
temporary name then renamed, so a killed run leaves no partial image and a rerun resumes.

The work units (one clean image, prepared once and written under every corruption and
severity) run in this process, on a pool of ``workers`` processes, or on a Dask cluster by its
scheduler's address (``scheduler``: the cluster of ``uqvision sweep --scheduler``; ``uqvision
data imagenet-c --scheduler ADDRESS``), with the same progress lines (images done, images/s,
ETA) and the same files, byte for byte.

``imagecorruptions`` 1.1.2 predates numpy 2, scikit-image 0.19 and setuptools 81; it is
loaded by :func:`reference_corruptions`, which supplies, to that package's module only, the
three names it needs (``np.float_``, ``gaussian(..., multichannel=True)`` as
``channel_axis=-1``, ``pkg_resources.resource_filename`` for its frost images) and makes its
impulse noise follow numpy's global seed (scikit-image >= 0.19's ``random_noise`` otherwise
draws from an unseeded generator); the corruption code itself is the package's.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import re
import sys
import threading
import time
import types
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from uqmetrics import InputError
from uqmetrics.runs.io import check_apart, named_write_error, remove_files
from uqmetrics.runs.sweep import ClusterSpec

from . import corruptions_original as original
from ._util import derive_seed

__all__ = ["BENCHMARK_CORRUPTIONS", "CORRUPTIONS", "JPEG_QUALITY", "MAX_JPEG_QUALITY",
           "METADATA_FILE", "check_complete", "implementations", "make_corrupted_folder",
           "make_imagenet_c_folder", "parse_corruptions", "parse_severities",
           "reference_corruptions"]

#: The 15 ImageNet-C benchmark corruptions, in ``imagecorruptions.get_corruption_names()``
#: order.
BENCHMARK_CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
    "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
    "elastic_transform", "pixelate", "jpeg_compression")
#: All 19 corruptions (the benchmark's and the 4 held-out extras), in
#: ``get_corruption_names("all")`` order; a corruption's index here enters its seed.
CORRUPTIONS = BENCHMARK_CORRUPTIONS + ("speckle_noise", "gaussian_blur", "spatter", "saturate")
#: JPEG quality of ImageNet-C's ``make_imagenet_c.py`` (``save(path, quality=85,
#: optimize=True)``).
JPEG_QUALITY = 85
#: The highest JPEG quality PIL takes (``quality`` is 1 to this).
MAX_JPEG_QUALITY = 95
#: Smallest crop (px): ``imagecorruptions.corrupt`` refuses images under 32 px a side.
MIN_CROP = 32
#: Metadata file written in ``out``.
METADATA_FILE = "imagenet-c.json"
#: Version 2 records every source image (its output file and the SHA-256 of its bytes);
#: version 1 did not: its folders are resumed only after ``--overwrite``.
_FORMAT = "uqvision-imagenet-c/2"
_TMP = ".partial-"
#: An image's output file below ``<corruption>/<severity>/``: ``<class>/<stem>.JPEG``.
_IMAGE_FILE = re.compile(r"^(?!\.\.?/)[^/\\\0]+/[^/\\\0]+\.JPEG\Z")

_LOCK = threading.Lock()  # numpy's global RNG: one seeded call at a time per process
_REF: types.ModuleType | None = None


class _NumpyCompat(types.ModuleType):
    """numpy, plus the ``np.float_`` alias that numpy 2 removed (for imagecorruptions only)."""

    float_ = np.float64

    def __getattr__(self, name: str):
        return getattr(np, name)


class _Proxy(types.ModuleType):
    """A module whose attributes are ``target``'s, except those given."""

    def __init__(self, target: types.ModuleType, **override):
        super().__init__(target.__name__)
        self._target = target
        self.__dict__.update(override)

    def __getattr__(self, name: str):
        return getattr(self._target, name)


def _seeded_random_noise(random_noise):
    """``skimage.util.random_noise`` drawing its generator's seed from numpy's global RNG.

    Since scikit-image 0.19 it draws from a fresh, unseeded ``default_rng()`` unless given
    ``rng``: impulse noise would differ on every run whatever ``np.random.seed`` says.
    """
    def _random_noise(image, mode="gaussian", rng=None, **kwargs):
        if rng is None:
            rng = int(np.random.randint(2**31))
        return random_noise(image, mode=mode, rng=rng, **kwargs)
    return _random_noise


def reference_corruptions() -> types.ModuleType:
    """The ``imagecorruptions`` package (imported on first use), runnable with numpy 2,
    scikit-image >= 0.19 and setuptools >= 81.

    Only names the package looks up are supplied, in its own module (nothing global is
    changed): ``pkg_resources.resource_filename`` while it is imported (when setuptools no
    longer ships it), ``np.float_`` and ``gaussian(..., multichannel=True)``; and
    ``sk.util.random_noise`` (impulse noise) is given a seed drawn from numpy's global RNG,
    so that ``np.random.seed`` determines every corruption.

    Returns
    -------
    module
        ``imagecorruptions`` (``corrupt``, ``get_corruption_names``).
    """
    global _REF
    if _REF is not None:
        return _REF
    shim = None
    try:
        import pkg_resources  # noqa: F401  (setuptools < 81)
    except ImportError:
        shim = types.ModuleType("pkg_resources")
        shim.resource_filename = lambda pkg, name: os.path.join(  # type: ignore[attr-defined]
            os.path.dirname(importlib.import_module(pkg).__file__), name)
        sys.modules["pkg_resources"] = shim
    try:
        with warnings.catch_warnings():  # scipy.ndimage.interpolation is deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            import imagecorruptions
            import imagecorruptions.corruptions as mod
    finally:
        if shim is not None and sys.modules.get("pkg_resources") is shim:
            del sys.modules["pkg_resources"]
    if not hasattr(np, "float_"):
        mod.np = _NumpyCompat("numpy")
    gaussian = mod.gaussian
    if "multichannel" not in inspect.signature(gaussian).parameters:
        def _gaussian(image, *args, multichannel=None, **kwargs):
            if multichannel:
                kwargs.setdefault("channel_axis", -1)
            return gaussian(image, *args, **kwargs)
        mod.gaussian = _gaussian
    if "rng" in inspect.signature(mod.sk.util.random_noise).parameters:
        util = _Proxy(mod.sk.util, random_noise=_seeded_random_noise(mod.sk.util.random_noise))
        mod.sk = _Proxy(mod.sk, util=util)
    _REF = imagecorruptions
    return _REF


def _seed(seed: int, corruption: str, severity: int, rel: str) -> int:
    """The numpy seed of one (image, corruption, severity) (module docstring)."""
    crc = zlib.crc32(rel.replace(os.sep, "/").encode("utf-8"))
    return derive_seed(seed, CORRUPTIONS.index(corruption), severity, crc) % 2**32


def _prepare(img, resize: int, crop: int) -> np.ndarray:
    """``Resize(resize)`` + ``CenterCrop(crop)`` (torchvision, as ImageNet-C) -> uint8 HxWx3."""
    from torchvision.transforms import functional as tf  # heavy: imported on first use
    img = tf.center_crop(tf.resize(img.convert("RGB"), resize), crop)
    return np.asarray(img, dtype=np.uint8)


def _corrupt(arr: np.ndarray, corruption: str, severity: int, seed: int) -> np.ndarray:
    """``corruption`` of ``arr`` under numpy seed ``seed`` (uint8 HxWx3): the original's
    function where :data:`~uqvision.data.corruptions_original.ORIGINAL_CORRUPTIONS` has it,
    else imagecorruptions'."""
    fn = getattr(original, corruption) if corruption in original.ORIGINAL_CORRUPTIONS else None
    ref = reference_corruptions() if fn is None else None
    with _LOCK:
        state = np.random.get_state()
        np.random.seed(seed)
        try:
            if fn is not None:
                return np.uint8(fn(arr, severity))  # as imagecorruptions.corrupt returns
            return ref.corrupt(arr, corruption_name=corruption, severity=severity)
        finally:
            np.random.set_state(state)


def implementations(corruptions: Iterable[str]) -> dict[str, str]:
    """Which code makes each of ``corruptions`` (recorded in :data:`METADATA_FILE`):
    ``"imagecorruptions 1.1.2"``, or ``make_imagenet_c.py``'s definition
    (:mod:`uqvision.data.corruptions_original`), with the ImageMagick and Wand versions of
    motion blur and snow.

    Raises
    ------
    uqmetrics.InputError
        Motion blur or snow asked for where Wand or ImageMagick's library is missing (one
        line naming what to install).
    """
    from importlib.metadata import version
    corruptions = list(corruptions)
    original.check_imagemagick(corruptions)
    made = {c: f"imagecorruptions {version('imagecorruptions')}" for c in corruptions}
    for c in set(corruptions) & set(original.ORIGINAL_CORRUPTIONS):
        made[c] = "make_imagenet_c.py of hendrycks/robustness (uqvision.data.corruptions_original)"
        if c in original.IMAGEMAGICK_CORRUPTIONS:
            made[c] += f"; {original.imagemagick_version()}"
    return made


def _save_jpeg(arr: np.ndarray, dest: Path, quality: int) -> None:
    """Write ``arr`` as JPEG to ``dest`` atomically (temporary name, then rename); a failed
    write removes its temporary file and raises an ``OSError`` naming ``dest`` (a full disk
    said as such: :func:`uqmetrics.runs.io.named_write_error`)."""
    from PIL import Image
    tmp = dest.with_name(f"{_TMP}{os.getpid()}-{dest.name}")
    try:
        Image.fromarray(np.uint8(arr)).save(tmp, format="JPEG", quality=quality, optimize=True)
        os.replace(tmp, dest)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise named_write_error(exc, dest) from None


def _write_metadata(path: Path, meta: dict) -> None:
    """Write the metadata file atomically; a failed write names ``path``."""
    tmp = path.with_name(f"{_TMP}{os.getpid()}-{path.name}")
    try:
        tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise named_write_error(exc, path) from None


def _read_metadata(path: Path) -> dict:
    """The metadata file ``path``, every name a path is built from checked against the known
    set first: corruptions in :data:`CORRUPTIONS`, severities 1..5, image files
    ``<class>/<stem>.JPEG`` (one folder, no ``..``); :class:`~uqmetrics.InputError` naming the
    file and the value otherwise."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError) as exc:
        raise InputError(f"{path}: not the metadata of uqvision data imagenet-c "
                         f"({' '.join(str(exc).split())})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: not the metadata of uqvision data imagenet-c (a JSON object)")
    names, levels = meta.get("corruptions"), meta.get("severities")
    bad = ([names] if not isinstance(names, list) else
           [c for c in names if not isinstance(c, str) or c not in CORRUPTIONS])
    if bad:
        raise InputError(f"{path}: corruptions: {bad[0]!r} is not a corruption of "
                         f"imagecorruptions (known: {', '.join(CORRUPTIONS)}); the file was not "
                         "written by uqvision data imagenet-c")
    bad = ([levels] if not isinstance(levels, list) else
           [v for v in levels if type(v) is not int or not 1 <= v <= 5])
    if bad:
        raise InputError(f"{path}: severities: {bad[0]!r} is not a severity 1..5; the file was "
                         "not written by uqvision data imagenet-c")
    images = meta.get("images", {})
    if not isinstance(images, dict):
        raise InputError(f"{path}: images: not a mapping of source images")
    for rel, entry in images.items():
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and _IMAGE_FILE.match(entry[0]) and isinstance(entry[1], str)):
            raise InputError(f"{path}: images: {rel!r} -> {entry!r} is not [<class>/<stem>.JPEG, "
                             "sha256]; the file was not written by uqvision data imagenet-c")
    return meta


def _member_files(out: Path, corruption: str, severity: int, *, images: bool = True,
                  partial: bool = True) -> list[str]:
    """The images (``*.JPEG``) and temporary files of one member folder found on disk, relative
    to ``out`` (real class folders only, no link followed)."""
    member = out / corruption / str(severity)
    found = []
    if member.is_symlink() or not member.is_dir():
        return found
    for cls in sorted(os.scandir(member), key=lambda e: e.name):
        if not cls.is_dir(follow_symlinks=False):
            continue
        for f in os.scandir(cls.path):
            if (images and f.name.endswith(".JPEG") and not f.name.startswith(_TMP)) or (
                    partial and f.name.startswith(_TMP)):
                found.append(f"{corruption}/{severity}/{cls.name}/{f.name}")
    return found


def _written(out: Path, meta: dict) -> list[str]:
    """The files a run of ``meta`` (read by :func:`_read_metadata`) wrote below ``out``: its
    images' files under each of its corruptions and severities (a version-1 folder, which
    recorded no images: the ``*.JPEG`` of its member folders), and its temporary files."""
    images = meta.get("images")
    files = []
    for c in meta["corruptions"]:
        for v in meta["severities"]:
            if images is None:
                files += _member_files(out, c, v)
            else:
                files += [f"{c}/{v}/{f}" for f, _ in images.values()]
                files += _member_files(out, c, v, images=False)
    return files


def check_complete(root: str | os.PathLike,
                   members: Iterable[tuple[str, int]] | None = None) -> None:
    """Refuse an ImageNet-C folder of :func:`make_corrupted_folder` that is unfinished or has
    lost images; any other folder (ImageNet-C as shipped: no :data:`METADATA_FILE`) passes.

    Parameters
    ----------
    root : path
        The folder's root (``--out`` of ``uqvision data imagenet-c``).
    members : iterable of (str, int), optional
        The (corruption, severity) members to count; default all of the folder's.

    Raises
    ------
    uqmetrics.InputError
        The metadata says ``"complete": false`` (a generation interrupted, or running), or a
        member holds another number of images than the source images recorded; the message
        names the members and their counts.
    """
    root = Path(root)
    path = root / METADATA_FILE
    if not path.is_file():
        return
    meta = _read_metadata(path)
    n = len(meta["images"]) if "images" in meta else None
    todo = [(c, int(v)) for c, v in (members if members is not None else
                                     ((c, v) for c in meta["corruptions"]
                                      for v in meta["severities"]))
            if c in meta["corruptions"] and v in meta["severities"]]
    counts = [(f"{c}-{v}", len(_member_files(root, c, v, partial=False))) for c, v in todo]
    short = [f"{m} has {k} of {n} images" for m, k in counts if n is not None and k != n]
    if meta.get("complete") is True and not short:
        return
    what = ("was not finished (its metadata says \"complete\": false: a generation "
            "interrupted or still running)" if meta.get("complete") is not True
            else "has lost images since it was made")
    detail = "; ".join(short[:5]) + (f" and {len(short) - 5} more members" if len(short) > 5
                                     else "")
    raise InputError(f"ImageNet-C folder {str(root)!r} {what}{': ' + detail if detail else ''}; "
                     "run uqvision data imagenet-c again with the same options to complete it")


_STATE: dict = {}


def _init_worker(dataset, options: dict) -> None:
    _STATE["dataset"], _STATE["options"] = dataset, options


def _work(index: int, jobs: list[tuple[str, int, str]]) -> int:
    """Corrupt sample ``index`` for ``jobs`` [(corruption, severity, destination)] (the
    dataset and options of :func:`_init_worker`)."""
    return _corrupt_sample(_STATE["dataset"], _STATE["options"], index, jobs)


def _corrupt_sample(ds, o: dict, index: int, jobs: list[tuple[str, int, str]]) -> int:
    """One work unit, in any process (a pool's or a Dask worker's): sample ``index`` of
    ``ds`` prepared once and written under every (corruption, severity, destination) of
    ``jobs``; returns how many images it wrote."""
    from uqmetrics.runs.sweep import heap_for_arrays

    heap_for_arrays()  # in a Dask worker
    rel = ds.samples[index][0]
    arr = _prepare(ds[index][0], o["resize"], o["crop"])
    for corruption, severity, dest in jobs:
        out = _corrupt(arr, corruption, severity, _seed(o["seed"], corruption, severity, rel))
        _save_jpeg(out, Path(dest), o["quality"])
    return len(jobs)


def _done_local(tasks: list, ds, options: dict, workers: int) -> Iterator[int]:
    """Run the work units here (``workers == 1``) or on a process pool; yields as each one
    finishes."""
    if workers == 1:
        _init_worker(ds, options)
        for i, jobs in tasks:
            yield _work(i, jobs)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed
    with ProcessPoolExecutor(min(workers, len(tasks)), initializer=_init_worker,
                             initargs=(ds, options)) as pool:
        futures = [pool.submit(_work, i, jobs) for i, jobs in tasks]
        try:
            for fut in as_completed(futures):
                yield fut.result()
        finally:
            for fut in futures:
                fut.cancel()


def _done_on_dask(tasks: list, ds, options: dict, scheduler: str | ClusterSpec,
                  say: Callable[[str], None] | None) -> Iterator[int]:
    """Run the work units on the Dask cluster at ``scheduler``, or on the cluster a
    :class:`~uqmetrics.runs.sweep.ClusterSpec` starts for the run (jobs of a queue) and closes
    after (the same units as the local path: :func:`_corrupt_sample`); yields as each one
    finishes. The scanned folder is sent to the workers once; they read the images and write
    the files by their paths (a file system the workers share). On an error or an interrupt
    the units not started are cancelled."""
    from dask.distributed import as_completed
    from uqmetrics.runs.sweep import open_client

    address = scheduler if isinstance(scheduler, str) else scheduler.address
    where = f"the Dask cluster at {address}" if address else scheduler.describe()
    with open_client(scheduler) as client:
        if say is not None:
            n = len(client.scheduler_info(n_workers=-1).get("workers", {}))
            say(f"imagenet-c: {len(tasks)} images to corrupt on {where} ({n} worker(s))")
        shared = client.scatter(ds, broadcast=True)
        futures = [client.submit(_corrupt_sample, shared, options, i, jobs, pure=False)
                   for i, jobs in tasks]
        try:
            for fut in as_completed(futures, loop=client.loop):
                yield fut.result()
        finally:
            client.cancel(futures)


def _check_options(corruptions, severities, resize, crop, quality, workers
                   ) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if corruptions is None:
        corruptions = BENCHMARK_CORRUPTIONS
    if isinstance(corruptions, str):
        corruptions = (corruptions,)
    corruptions = tuple(corruptions)
    for c in corruptions:
        if c not in CORRUPTIONS:
            raise ValueError(f"corruptions: unknown corruption {c!r}; known: "
                             f"{', '.join(CORRUPTIONS)}")
    if not corruptions or len(set(corruptions)) != len(corruptions):
        raise ValueError(f"corruptions must be distinct and not empty, got {list(corruptions)}")
    severities = tuple(severities)
    for s in severities:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 1 <= s <= 5:
            raise ValueError(f"severities: {s!r} is not a severity 1..5")
    if not severities or len(set(severities)) != len(severities):
        raise ValueError(f"severities must be distinct and not empty, got {list(severities)}")
    for name, v in (("resize", resize), ("crop", crop), ("quality", quality),
                    ("workers", workers)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if crop > resize:
        raise ValueError(f"crop {crop} is larger than resize {resize} (the short side after "
                         "resizing); give crop <= resize")
    if crop < MIN_CROP:
        raise ValueError(f"crop {crop} is below {MIN_CROP} px, the smallest size every "
                         "reference corruption accepts")
    if quality > MAX_JPEG_QUALITY:
        raise ValueError(f"quality must be 1..{MAX_JPEG_QUALITY} (PIL's JPEG qualities), got "
                         f"{quality}")
    if "frost" in corruptions and crop > original.FROST_MAX:
        raise ValueError(f"crop {crop} is above {original.FROST_MAX} px, the largest image "
                         "ImageNet-C's frost textures cover; give crop <= "
                         f"{original.FROST_MAX} or leave frost out")
    return corruptions, tuple(int(s) for s in severities)


def _progress_printer(progress) -> Callable[[str], None] | None:
    if progress is True:
        return lambda line: print(line, file=sys.stderr, flush=True)
    return progress or None


def _eta(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def make_corrupted_folder(src: str | os.PathLike, out: str | os.PathLike, *,
                          corruptions: Sequence[str] | str | None = None,
                          severities: Iterable[int] = (1, 2, 3, 4, 5), resize: int = 256,
                          crop: int = 224, quality: int = JPEG_QUALITY, seed: int = 0,
                          workers: int = 1, progress: bool | Callable[[str], None] = True,
                          overwrite: bool = False, scheduler: str | ClusterSpec | None = None
                          ) -> Path:
    """Write ImageNet-C for the clean images of ``src`` into ``out`` (module docstring).

    Parameters
    ----------
    src : path
        A clean image folder in any layout :class:`~uqvision.data.ImageFolderDataset` reads
        (class folders; flat with a label file; an archive).
    out : path
        Output folder: ``out/<corruption>/<severity>/<class>/<image stem>.JPEG`` and
        ``out/imagenet-c.json``. An ``out`` from an interrupted run with the same options is
        resumed (existing images are kept; they are written whole or not at all), except
        those of a source image whose bytes changed since (the metadata records each source
        image's SHA-256): they are recomputed. Neither inside ``src`` nor holding it.
    corruptions : sequence of str, optional
        Names from :data:`CORRUPTIONS`; default the 15 benchmark ones
        (:data:`BENCHMARK_CORRUPTIONS`).
    severities : iterable of int, default (1, 2, 3, 4, 5)
    resize, crop : int, default 256, 224
        Short side after resizing, then side of the centre crop (``crop <= resize``,
        ``crop >= 32``: :data:`MIN_CROP`; with frost, ``crop <= 314``:
        :data:`~uqvision.data.corruptions_original.FROST_MAX`).
    quality : int, default 85
        JPEG quality (ImageNet-C's, :data:`JPEG_QUALITY`).
    seed : int, default 0
        Enters every image's seed (module docstring).
    workers : int, default 1
        Processes corrupting images in parallel (the output does not depend on it).
    progress : bool or callable, default True
        Progress lines (images done, images/s, ETA) to stderr, or to this function.
    overwrite : bool, default False
        Replace an ``out`` written with other options: the files that run wrote (its
        metadata's images under its corruptions and severities, and its temporary files) are
        deleted, nothing else; a name in the metadata outside the known corruptions,
        severities and ``<class>/<stem>.JPEG`` is refused before any path is built from it.
    scheduler : str or uqmetrics.runs.sweep.ClusterSpec, optional
        Address of a Dask scheduler (``tcp://host:8786``, as ``uqvision sweep
        --scheduler``), or the cluster to start for the run (``--cluster slurm ...``: workers
        in jobs of a queue, :class:`~uqmetrics.runs.sweep.ClusterSpec`): the work units (one
        clean image, written under every corruption and severity) run on that cluster's
        workers instead of local processes, with the same
        progress, resume and output (byte-identical: each image is a function of its seed).
        The workers must read ``src`` and write ``out`` by the same paths (a shared file
        system). Not with ``workers`` > 1.

    Returns
    -------
    Path
        ``out``.

    Raises
    ------
    ValueError
        An unknown corruption, a severity outside 1..5, ``crop > resize``, a bad size,
        quality or worker count, ``workers`` > 1 with a ``scheduler``; two images of one
        class with the same file stem; frost with ``crop`` above 314 px.
    FileExistsError
        ``out`` holds other files or a run with other options (without ``overwrite``).
    uqmetrics.InputError
        ``out`` inside ``src`` or holding it; a metadata file not written here (a name
        outside the known sets); motion blur or snow where Wand or ImageMagick's library is
        missing (one line naming what to install, before any work).
    OSError
        A write failed: the error names the file being written (a full disk said as such).
    """
    from .folders import ImageFolderDataset, sample_digests

    corruptions, severities = _check_options(corruptions, severities, resize, crop, quality,
                                             workers)
    if scheduler is not None and not isinstance(scheduler, ClusterSpec) and (
            not isinstance(scheduler, str) or not scheduler.strip()):
        raise InputError(f"scheduler: give a Dask scheduler address (tcp://host:8786), got "
                         f"{scheduler!r}")
    if scheduler is not None and workers > 1:
        where = scheduler.describe() if isinstance(scheduler, ClusterSpec) \
            else f"scheduler {scheduler!r}"  # never a ClusterSpec's repr
        raise InputError(f"workers {workers} and {where}: the images run on the cluster's "
                         "workers; give one of the two")
    out = Path(out)
    # an out inside src would be scanned as a class of src by the next run; a src inside out
    # could be deleted by --overwrite
    check_apart(out, {"--src": src})
    from importlib.metadata import version
    reference_corruptions()  # refuse a missing or broken package before any work
    made = implementations(corruptions)  # and a missing ImageMagick (motion blur, snow)
    meta = {"format": _FORMAT, "corruptions": list(corruptions), "severities": list(severities),
            "resize": int(resize), "crop": int(crop), "jpeg_quality": int(quality),
            "jpeg_optimize": True, "seed": int(seed),
            "seed_rule": "numpy.random.seed(uqvision.data.derive_seed(seed, CORRUPTIONS.index("
                         "corruption), severity, zlib.crc32(relative_path.encode())) % 2**32)",
            "corruption_order": list(CORRUPTIONS),
            "package": f"imagecorruptions {version('imagecorruptions')}",
            "implementations": made, "source": str(Path(src).resolve())}
    meta_path = out / METADATA_FILE
    old: dict = {}
    replaced = False
    if meta_path.exists() or meta_path.is_symlink():
        old = _read_metadata(meta_path)  # every name checked before a path is built from it
        options = {k: v for k, v in old.items() if k not in ("complete", "images")}
        # not recorded before uqvision made motion blur, snow, frost and elastic as the original:
        # every corruption was then imagecorruptions'
        options.setdefault("implementations", {c: options.get("package")
                                               for c in options["corruptions"]})
        differ = sorted(k for k in options.keys() | meta.keys() if options.get(k) != meta.get(k))
        replaced = bool(differ)
        if replaced and not overwrite:
            if old.get("format") != _FORMAT:
                raise FileExistsError(f"out {str(out)!r} holds ImageNet-C of an earlier "
                                      f"uqvision ({old.get('format')!r}, which recorded no "
                                      "source images to resume against); pass overwrite=True "
                                      "(--overwrite) to make it again")
            raise FileExistsError(f"out {str(out)!r} holds ImageNet-C made with other "
                                  "options; pass overwrite=True to replace it (they differ in: "
                                  f"{', '.join(differ)})")
    elif out.exists() and any(out.iterdir()):
        raise FileExistsError(f"out {str(out)!r} exists and is not a uqvision ImageNet-C "
                              f"folder (no {METADATA_FILE})")
    ds = ImageFolderDataset(src)
    dests: dict[tuple[str, str], str] = {}
    for rel, label in ds.samples:
        key = (ds.classes[label], Path(rel).stem)
        if key in dests:
            raise ValueError(f"src: images {dests[key]!r} and {rel!r} of class {key[0]!r} would "
                             f"both be written as {key[1]}.JPEG")
        dests[key] = rel
    # the sources by content: an image changed (or gone) since the last run is recomputed
    digests = sample_digests(ds)
    images = {rel: [f"{ds.classes[label]}/{Path(rel).stem}.JPEG", digests[rel] or ""]
              for rel, label in ds.samples}
    if replaced:  # --overwrite: what the earlier run wrote, nothing else
        remove_files(out, _written(out, old))
        meta_path.unlink()
        old = {}
    stale = [f for rel, (f, sha) in old.get("images", {}).items()
             if images.get(rel) != [f, sha] or not sha]
    if stale:
        remove_files(out, [f"{c}/{v}/{f}" for c in corruptions for v in severities
                           for f in stale])
    out.mkdir(parents=True, exist_ok=True)
    _write_metadata(meta_path, {**meta, "complete": False, "images": images})
    remove_files(out, [f for c in corruptions for v in severities  # left by a killed run
                       for f in _member_files(out, c, v, images=False)]
                 + [p.name for p in out.glob(f"{_TMP}*-{METADATA_FILE}")])
    say = _progress_printer(progress)
    if stale and say is not None:
        say(f"imagenet-c: {len(stale)} source image(s) changed or gone since the last run: "
            "their files are recomputed")
    tasks = []
    for i, (rel, label) in enumerate(ds.samples):
        jobs = []
        for c in corruptions:
            for s in severities:
                dest = out / c / str(s) / ds.classes[label] / f"{Path(rel).stem}.JPEG"
                if not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    jobs.append((c, s, str(dest)))
        if jobs:
            tasks.append((i, jobs))
    options = {"resize": int(resize), "crop": int(crop), "quality": int(quality),
               "seed": int(seed)}
    n, done, t0, last = len(tasks), 0, time.monotonic(), 0.0

    def tick() -> None:
        nonlocal last
        now = time.monotonic()
        if say is None or (now - last < 2.0 and done < n):
            return
        last = now
        rate = done / max(now - t0, 1e-9)
        eta = _eta((n - done) / rate) if rate > 0 else "?"
        say(f"imagenet-c: {done}/{n} images ({len(ds) - n} done before), "
            f"{rate:.2f} images/s, ETA {eta}")

    if n:
        finished = (_done_on_dask(tasks, ds, options, scheduler, say) if scheduler is not None
                    else _done_local(tasks, ds, options, workers))
        for _ in finished:  # one progress loop, whichever runs the units
            done += 1
            tick()
    _write_metadata(meta_path, {**meta, "complete": True, "images": images})
    return out


def parse_corruptions(text: str) -> tuple[str, ...]:
    """Comma-separated corruption names (``"fog,snow"``; ``"all"``: the 19 of
    :data:`CORRUPTIONS`) as a tuple.

    Raises
    ------
    ValueError
        An unknown name (with the known ones) or a name given twice; the message names the
        value, not the parameter (the caller says which it is).
    """
    if text.strip() == "all":
        return CORRUPTIONS
    names = tuple(c.strip() for c in text.split(","))
    for c in names:
        if c not in CORRUPTIONS:
            raise ValueError(f"unknown corruption {c!r} in {text!r}; known: "
                             f"{', '.join(CORRUPTIONS)} (or all)")
    if len(set(names)) != len(names):
        raise ValueError(f"{text!r} names a corruption twice")
    return names


def parse_severities(text: str) -> tuple[int, ...]:
    """Comma-separated severities (``"1,3,5"``) as a tuple of distinct integers 1..5.

    Raises
    ------
    ValueError
        Not a comma-separated list of integers, a severity outside 1..5 or one given twice;
        the message names the value, not the parameter (the caller says which it is).
    """
    try:
        levels = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of 1..5") from None
    for v in levels:
        if not 1 <= v <= 5:
            raise ValueError(f"{v} is not a severity 1..5")
    if len(set(levels)) != len(levels):
        raise ValueError(f"{text!r} names a severity twice")
    return levels


def make_imagenet_c_folder(root: str | os.PathLike, *, src: str | None = None,
                           corruptions: str | None = None, severities: str | None = None,
                           resize: int = 256, crop: int = 224, quality: int = JPEG_QUALITY,
                           workers: int = 1, seed: int = 0, overwrite: bool = False,
                           scheduler: str | ClusterSpec | None = None) -> Path:
    """``uqvision data imagenet-c --src DIR --out DIR``: :func:`make_corrupted_folder` with
    comma-separated ``corruptions`` (``all``: the 19) and ``severities``; ``--scheduler
    ADDRESS`` runs it on a Dask cluster (the one of ``uqvision sweep --scheduler``).

    Parameters
    ----------
    root : path
        Output folder (``--out``).
    src : str
        The clean image folder to corrupt (required).
    corruptions : str, optional
        Comma-separated corruption names, e.g. ``"fog,snow"``, or ``all`` (the 19); default:
        the 15 benchmark corruptions. Motion blur and snow run ImageMagick (Debian's
        libmagickwand-6.q16-6 and pip install 'uqvision[imagemagick]').
    severities : str, optional
        Comma-separated severities in 1..5, e.g. ``"1,3,5"``; default: 1,2,3,4,5 (all five).
    resize : int, default 256
        Short side every clean image is resized to before the centre crop (``resize >=
        crop``).
    crop : int, default 224
        Side of the centre crop taken after resizing (``crop <= resize``, ``crop >= 32``:
        :data:`MIN_CROP`; with frost, ``crop <= 314``:
        :data:`~uqvision.data.corruptions_original.FROST_MAX`).
    quality, workers, seed, overwrite, scheduler
        As :func:`make_corrupted_folder`.

    Returns
    -------
    Path
        ``root``.
    """
    if src is None:
        raise ValueError("src (--src): give the clean image folder to corrupt")
    try:
        names = None if corruptions is None else parse_corruptions(corruptions)
    except ValueError as exc:
        raise ValueError(f"corruptions: {exc}") from None
    try:
        levels = (1, 2, 3, 4, 5) if severities is None else parse_severities(severities)
    except ValueError as exc:
        raise ValueError(f"severities: {exc}") from None
    return make_corrupted_folder(src, root, corruptions=names, severities=levels,
                                 resize=resize, crop=crop, quality=quality, seed=seed,
                                 workers=workers, overwrite=overwrite, scheduler=scheduler)
