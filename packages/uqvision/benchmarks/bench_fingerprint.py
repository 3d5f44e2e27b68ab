"""What fingerprinting a folder by content costs: the old fingerprint (names, labels and byte
sizes: one ``stat`` per file) against today's (:func:`uqvision.data.folder_fingerprint`: every
byte read and hashed with SHA-256, on threads), side by side in one run; and the cost of the
ID/OOD overlap check's pixel and perceptual hashes (:func:`uqvision.data.image_hashes`), in
images per second, decoded and read back from its kept hashes; what a sweep cell's check of
each image against the plan's digests adds to reading and decoding it; and the distances of
the perceptual hash that set its near-duplicate threshold.

Usage: ``python benchmarks/bench_fingerprint.py [--images 50000] [--kb 110] [--dir DIR]``.
Writes an ImageNet-like class folder (1,000 classes, ``--images`` JPEGs of 500 x 375 px, about
``--kb`` KB each: ImageNet's validation images average 110 KB) under ``--dir`` (default a
temporary folder, removed after), unless it is there already. Each file is one of 64 encoded
images with a comment segment naming it, so every file's bytes differ. ``cold`` times evict
the folder's pages from the page cache first (``posix_fadvise(DONTNEED)``, this folder's files
only), so the files are read from the disk; ``warm`` times read them from memory.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from uqvision.data import ImageFolderDataset, folder_fingerprint, image_hashes
from uqvision.data import folders as _folders
from uqvision.data import overlap as _overlap

#: Distinct encoded images the files are made from.
_BASES = 64


def _old_fingerprint(ds: ImageFolderDataset) -> str:
    """The class-folder fingerprint before it covered content (``size:``): SHA-256 over the
    class list and each sample's id, folder label and size (one ``stat`` per file)."""
    h = hashlib.sha256(json.dumps(ds.classes).encode())
    label = {c: i for i, c in enumerate(ds.classes)}
    for rel, _ in ds.samples:
        h.update(f"{rel}\0{label[rel.split('/', 1)[0]]}\0{ds.source.size(rel)}\n".encode())
    return "size:" + h.hexdigest()


def _bases(kb: float) -> list[bytes]:
    """``_BASES`` JPEGs of 500 x 375 px, a smooth field plus texture, whose quality is chosen
    so that the first is about ``kb`` KB."""
    rng = np.random.default_rng(0)
    arrays = []
    for _ in range(_BASES):
        low = rng.normal(size=(12, 16, 3))
        field = np.asarray(Image.fromarray(((low - low.min()) / np.ptp(low) * 255)
                                           .astype(np.uint8)).resize((500, 375),
                                                                     Image.BICUBIC), float)
        arrays.append(np.clip(field + rng.normal(0, 14, field.shape), 0, 255).astype(np.uint8))

    def encode(a: np.ndarray, q: int) -> bytes:
        b = io.BytesIO()
        Image.fromarray(a).save(b, "JPEG", quality=q)
        return b.getvalue()

    quality = min(range(5, 100), key=lambda q: abs(len(encode(arrays[0], q)) - kb * 1000))
    return [encode(a, quality) for a in arrays]


def make_folder(root: Path, n: int, kb: float) -> None:
    """``n`` JPEGs in 1,000 class folders (as ImageNet's validation set), every file's bytes
    distinct: a base image with a JPEG comment (COM) segment naming the file."""
    bases = _bases(kb)
    for i in range(n):
        folder = root / f"n{i % 1000:08d}"
        if i < 1000:
            folder.mkdir(parents=True, exist_ok=True)
        note = f"bench {i}".encode()
        com = b"\xff\xfe" + (len(note) + 2).to_bytes(2, "big") + note
        base = bases[i % _BASES]
        (folder / f"img_{i:06d}.JPEG").write_bytes(base[:2] + com + base[2:])


def _evict(ds: ImageFolderDataset) -> None:
    """Drop the folder's files from the page cache (their pages only)."""
    for rel in ds.sample_ids:
        fd = os.open(ds.root / rel, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(fn, ds: ImageFolderDataset, *, cold: bool) -> tuple[float, str]:
    _folders._DIGESTS.clear()  # the process's memo of digests: every byte read again
    if cold:
        _evict(ds)
    t = time.perf_counter()
    out = fn(ds)
    return time.perf_counter() - t, out


def check_overhead(part: ImageFolderDataset) -> tuple[float, float]:
    """Seconds to read and decode every image of ``part`` (warm, one thread) as a cell does
    without the plan's digests, and with them (each image's bytes hashed and compared as
    they are read, :meth:`uqvision.data.ImageFolderDataset.expecting`): a sweep cell's cost
    of checking instead of fingerprinting the folder up front."""
    checked = part.expecting(_folders.sample_digests(part))
    best = {id(part): float("inf"), id(checked): float("inf")}
    for ds in (part, checked) * 4:  # alternated, the fastest of four each (warm)
        t = time.perf_counter()
        for i in range(len(ds)):
            ds[i]
        best[id(ds)] = min(best[id(ds)], time.perf_counter() - t)
    return best[id(part)], best[id(checked)]


def phash_distances() -> None:
    """How far ``imagehash.phash`` moves under the copies an OOD set may hold, and how far apart
    different photographs are: scikit-image's sample photographs (a dependency of
    imagecorruptions), each re-encoded, resized, brightened and cropped; the bits that differ
    from its own hash (the worst over the photographs), and between distinct photographs."""
    import itertools

    import imagehash
    import skimage.data

    names = ["astronaut", "camera", "coffee", "chelsea", "rocket", "immunohistochemistry",
             "hubble_deep_field", "retina", "colorwheel", "page", "moon", "grass", "gravel",
             "brick", "text", "clock", "coins", "cell", "logo"]
    photos = {}
    for n in names:
        a = np.asarray(getattr(skimage.data, n)())
        if a.dtype != np.uint8:
            a = (255 * (a - a.min()) / max(np.ptp(a), 1e-9)).astype(np.uint8)
        photos[n] = Image.fromarray(a).convert("RGB")

    def jpeg(im: Image.Image, q: int) -> Image.Image:
        b = io.BytesIO()
        im.save(b, "JPEG", quality=q)
        return Image.open(io.BytesIO(b.getvalue())).convert("RGB")

    def half(im: Image.Image) -> Image.Image:
        return im.resize((im.width // 2, im.height // 2), Image.BILINEAR)

    changes = {
        **{f"JPEG q{q}": (lambda im, q=q: jpeg(im, q)) for q in (30, 50, 75, 95)},
        "half size": half,
        "double size": lambda im: im.resize((im.width * 2, im.height * 2), Image.BICUBIC),
        "half size, JPEG q75": lambda im: jpeg(half(im), 75),
        "brightness +10": lambda im: Image.fromarray(
            np.clip(np.asarray(im, int) + 10, 0, 255).astype(np.uint8)),
        "5% crop each side": lambda im: im.crop((im.width // 20, im.height // 20,
                                                 im.width - im.width // 20,
                                                 im.height - im.height // 20)),
    }
    hashes = {n: imagehash.phash(im) for n, im in photos.items()}
    print(f"phash bits that differ (64), worst over {len(photos)} photographs "
          f"(near duplicates: <= {_overlap.NEAR_DUPLICATE_DISTANCE}):")
    for what, change in changes.items():
        worst = max(hashes[n] - imagehash.phash(change(im)) for n, im in photos.items())
        print(f"  {what:<22} {worst:3d}")
    apart = [hashes[a] - hashes[b] for a, b in itertools.combinations(hashes, 2)]
    print(f"  {'distinct photographs':<22} {min(apart):3d} .. {max(apart)} "
          f"(mean {np.mean(apart):.1f}, {len(apart)} pairs)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=50_000)
    p.add_argument("--kb", type=float, default=110.0, help="size of a file, KB (default 110)")
    p.add_argument("--dir", type=Path, default=None,
                   help="where the folder is (made when absent; default: a temporary folder)")
    p.add_argument("--decode", type=int, default=2_000,
                   help="images decoded for the overlap check's hashes (default 2000)")
    a = p.parse_args()
    phash_distances()
    tmp = None
    if a.dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="bench_fingerprint_"))
        a.dir = tmp
    root = a.dir / f"val_{a.images}_{int(a.kb)}kb"
    try:
        if not root.is_dir():
            t = time.perf_counter()
            make_folder(root, a.images, a.kb)
            print(f"wrote {a.images} files to {root} in {time.perf_counter() - t:.1f} s")
        ds = ImageFolderDataset(root)
        total = sum(ds.source.size(rel) for rel in ds.sample_ids)
        cpu = next((line.split(":", 1)[1].strip() for line in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "?")
        print(f"{len(ds)} images, {total / 1e9:.2f} GB ({total / len(ds) / 1e3:.0f} KB each), "
              f"{os.cpu_count()} CPUs ({cpu}), {min(8, os.cpu_count() or 1)} threads")
        print(f"{'':6} {'old: names, sizes':>18} {'new: content':>14} {'new/old':>8} "
              f"{'new MB/s':>9}")
        for cold in (True, False):
            t_old, old = _timed(_old_fingerprint, ds, cold=cold)
            t_new, new = _timed(folder_fingerprint, ds, cold=cold)
            print(f"{'cold' if cold else 'warm':6} {t_old:17.2f}s {t_new:13.2f}s "
                  f"{t_new / t_old:8.1f} {total / t_new / 1e6:9.0f}")
        assert old.startswith("size:") and new.startswith(_folders.FINGERPRINT_PREFIX)
        part = ds.without(ds.sample_ids[a.decode:])
        plain, checked = check_overhead(part)
        print(f"a sweep cell's check, {len(part)} images read and decoded (warm, 1 thread): "
              f"{plain:.2f} s plain, {checked:.2f} s with each image's SHA-256 checked "
              f"(x{checked / plain:.3f}, +{(checked - plain) / len(part) * 1e3:.2f} ms/image)")
        # the overlap check's hashes: a full decode of each image, then read back from disk
        part = ds.without(ds.sample_ids[a.decode:])
        kept = Path(tempfile.mkdtemp(prefix="bench_hashes_"))
        try:
            t = time.perf_counter()
            image_hashes(part, cache_dir=kept)
            t_decode = time.perf_counter() - t
            _overlap._HASHED.clear()
            _folders._DIGESTS.clear()
            t = time.perf_counter()
            image_hashes(part, cache_dir=kept)
            t_kept = time.perf_counter() - t
        finally:
            shutil.rmtree(kept)
        print(f"overlap hashes (SHA-256 of the pixels + phash), {len(part)} images: "
              f"{len(part) / t_decode:.0f} images/s decoded, {len(part) / t_kept:.0f} images/s "
              "read back from the kept hashes (warm)")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
