"""Images decoded once for several models (a sweep's preprocessing groups).

A model's evaluation transform (timm's ``create_transform``: ``Resize``, ``CenterCrop``,
``MaybeToTensor``, ``Normalize``) splits into a *geometry* head, PIL image -> PIL image of a
fixed size, and a *tensor* tail from the first ``ToTensor`` on (:func:`split_transform`).
Models whose heads are equal (same operations, sizes, interpolation, antialiasing, under the
same Pillow and torchvision versions: :attr:`TransformSplit.key`) see the same 8-bit pixels
whatever their mean and std, so a sweep decodes and resizes each image once per such group
(:func:`decode_images`: an (n, H, W, 3) uint8 array in a ``.npy`` file, written atomically,
with a JSON record of what it holds) and every model of the group reads its rows
(:func:`decoded_folder`) and applies its own tail to ``PIL.Image.fromarray(row)``: the same
pixels through the same operations as a model that decodes them itself, so the logits are
bit-identical (tests/test_sweep_decode.py). A tail of ``ToTensor`` and ``Normalize`` alone
(timm's) is applied to whole batches on the prediction's device (:class:`_DecodedBatches`),
and on CUDA the group's 8-bit pixels are copied to the device once per process and held
there for all its models (:func:`_resident`), when they fit. A model whose transform does not split, or
whose head differs from the file's, or a folder whose samples the file lacks, is run from
the image files as before: the file only ever saves work.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL
import torch
import torchvision
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms as T
from uqmetrics.runs.io import temporary_beside

from ..data import ImageFolderDataset
from ..data.folders import _load_sample, load_image

__all__ = ["DecodedImages", "TransformSplit", "decode_images", "decoded_folder",
           "split_transform"]

#: Geometry steps a head may hold (torchvision's ``Resize`` and ``CenterCrop``; their
#: parameters in the key, :func:`_step`).
_GEOMETRY = (T.Resize, T.CenterCrop)


def _step(t) -> str:
    """A geometry step as text: its class and every parameter that changes its output, sizes
    as tuples (``[160, 160]`` and ``(160, 160)`` crop alike)."""
    def size(v):
        return tuple(v) if isinstance(v, list | tuple) else v
    if isinstance(t, T.Resize):
        params = (size(t.size), str(t.interpolation), t.max_size, t.antialias)
    else:
        params = (size(t.size),)
    return f"{type(t).__module__}.{type(t).__qualname__}{params!r}"
#: Names of the steps that turn a PIL image into a tensor (torchvision's, timm's).
_TO_TENSOR = ("ToTensor", "MaybeToTensor")
#: Version of the file format (:class:`DecodedImages`).
_FORMAT = 1


@dataclass(frozen=True)
class TransformSplit:
    """A transform as geometry head + tensor tail (:func:`split_transform`).

    Attributes
    ----------
    key : str
        SHA-256 of the head's steps (class and ``repr`` of each) and of the Pillow and
        torchvision versions: equal keys give equal 8-bit pixels.
    head : torchvision.transforms.Compose
        PIL image -> PIL image (the resize and the crop).
    tail : torchvision.transforms.Compose
        PIL image -> tensor (3, H, W) float32 (``ToTensor``, ``Normalize``, ...).
    """

    key: str
    head: T.Compose
    tail: T.Compose


def split_transform(transform) -> TransformSplit | None:
    """``transform`` as geometry head + tensor tail, or ``None`` when it does not split so.

    It splits when it is a ``torchvision.transforms.Compose`` whose steps before the first
    ``ToTensor`` / timm ``MaybeToTensor`` are all ``Resize`` or ``CenterCrop`` (at least one)
    and the last of them a ``CenterCrop`` (a fixed output size). A seeded augmentation
    (:class:`uqvision.data.SeededAugmentation`) never does.
    """
    steps = getattr(transform, "transforms", None)
    if type(transform) is not T.Compose or not steps:
        return None
    cut = next((j for j, t in enumerate(steps) if type(t).__name__ in _TO_TENSOR), None)
    if not cut or not isinstance(steps[cut - 1], T.CenterCrop) or any(
            type(t) not in _GEOMETRY for t in steps[:cut]):
        return None
    text = "\n".join(_step(t) for t in steps[:cut])
    text += f"\nPillow {PIL.__version__} torchvision {torchvision.__version__}"
    return TransformSplit(hashlib.sha256(text.encode()).hexdigest(), T.Compose(steps[:cut]),
                          T.Compose(steps[cut:]))


@dataclass(frozen=True)
class DecodedImages:
    """A folder's images decoded and resized once (:func:`decode_images`).

    ``path`` is the ``.npy`` file, (n, H, W, 3) uint8 (rows in the order of ``sample_ids``);
    ``path.with_suffix(".json")`` records ``key`` (:attr:`TransformSplit.key`), ``head`` (its
    steps, readable), ``fingerprint`` (:func:`uqvision.data.folder_fingerprint` of the folder
    decoded), ``sample_ids`` and ``shape``. The record is written last, so a file without
    one is unfinished.
    """

    path: Path
    key: str
    fingerprint: str
    sample_ids: tuple[str, ...]
    shape: tuple[int, ...]

    @classmethod
    def read(cls, path: str | os.PathLike) -> DecodedImages | None:
        """The record of ``path`` (its ``.npy``), ``None`` when it is missing, unfinished or
        not of this format."""
        path = Path(path)
        try:
            rec = json.loads(path.with_suffix(".json").read_text())
            if rec.get("format") != _FORMAT or not path.is_file():
                return None
            return cls(path, rec["key"], rec["fingerprint"], tuple(rec["sample_ids"]),
                       tuple(rec["shape"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def rows(self) -> np.ndarray:
        """The pixels, (n, H, W, 3) uint8, memory-mapped read-only."""
        return np.load(self.path, mmap_mode="r")


def _decode_one(folder: ImageFolderDataset, head: T.Compose, index: int) -> np.ndarray:
    rel = folder.samples[index][0]
    content = folder.read_checked(rel)  # a sweep's plan digests: checked as read
    img = (load_image(folder.root / rel, content=content) if folder._folder_label is None
           else _load_sample(folder.source, rel, content=content))
    return np.asarray(head(img), dtype=np.uint8)


def decode_images(folder: ImageFolderDataset, split: TransformSplit, path: str | os.PathLike,
                  fingerprint: str, *, threads: int | None = None) -> DecodedImages:
    """Decode every image of ``folder`` once through ``split.head`` into ``path`` (``.npy``).

    Kept when ``path`` already holds this folder (same ``fingerprint``, samples and key):
    a rerun does not decode again. Otherwise written atomically (a temporary file renamed,
    then the JSON record), on ``threads`` threads (default: the usable cores; Pillow decodes
    and resizes without the GIL), in sample order.

    Parameters
    ----------
    folder : ImageFolderDataset
        The folder as the models see it (unreadable images already left out); one
        :meth:`~uqvision.data.ImageFolderDataset.expecting` the plan's digests has every image
        checked as it is read (the models reading the file trust its ``fingerprint``).
    split : TransformSplit
    path : path
        The ``.npy`` file; its ``.json`` record beside it.
    fingerprint : str
        :func:`uqvision.data.folder_fingerprint` of ``folder``.
    threads : int, optional

    Returns
    -------
    DecodedImages

    Raises
    ------
    ValueError
        The head gives images of different sizes (then no file is written).
    uqvision.exceptions.BadImageError
        An image that does not read.
    uqvision.data.folders.ChangedImageError
        An image whose bytes are not the expected ones (then no file is written).
    """
    from ..runtime import usable_cores

    path = Path(path)
    ids = tuple(folder.sample_ids)
    have = DecodedImages.read(path)
    if have is not None and (have.key, have.fingerprint, have.sample_ids) == (
            split.key, fingerprint, ids):
        return have
    n = len(ids)
    if n == 0:
        raise ValueError(f"image folder {str(folder.root)!r} has no image left to decode")
    first = _decode_one(folder, split.head, 0)
    shape = (n, *first.shape)
    if first.ndim != 3 or first.shape[2] != 3:
        raise ValueError(f"the transform head {split.head!r} gives images of shape "
                         f"{first.shape}, not (H, W, 3)")
    workers = max(1, min(threads or usable_cores(), n))
    with temporary_beside(path) as tmp:
        _fill(tmp, folder, split.head, first, n, workers)
        os.replace(tmp, path)
    rec = {"format": _FORMAT, "key": split.key, "head": repr(split.head),
           "fingerprint": fingerprint, "dataset": str(folder.root.resolve()),
           "sample_ids": list(ids), "shape": list(shape)}
    with temporary_beside(path.with_suffix(".json")) as tmp:
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, path.with_suffix(".json"))
    return DecodedImages(path, split.key, fingerprint, ids, shape)


def _fill(tmp: Path, folder: ImageFolderDataset, head: T.Compose, first: np.ndarray, n: int,
          workers: int) -> None:
    """Write the ``.npy`` of ``n`` images to ``tmp``: ``first`` (image 0), then the others on
    ``workers`` threads."""
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(n, *first.shape))
    out[0] = first

    def put(i: int) -> None:
        a = _decode_one(folder, head, i)
        if a.shape != first.shape:
            raise ValueError(f"the transform head {head!r} gives images of different sizes: "
                             f"{a.shape} vs {first.shape}")
        out[i] = a

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(put, range(1, n)))
    out.flush()


def _batched_tail(tail: T.Compose) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(mean, std)`` as (1, 3, 1, 1) float32 when ``tail`` is ``ToTensor`` (or timm's
    ``MaybeToTensor``) then ``Normalize`` and nothing else (torchvision's ``normalize``: the
    mean and std as float32 tensors, a zero std refused), else ``None``."""
    steps = tail.transforms
    if (len(steps) != 2 or type(steps[0]).__name__ not in _TO_TENSOR
            or type(steps[1]) is not T.Normalize or torch.get_default_dtype() != torch.float32):
        return None
    mean = torch.as_tensor(steps[1].mean, dtype=torch.float32)
    std = torch.as_tensor(steps[1].std, dtype=torch.float32)
    if mean.shape != (3,) or std.shape != (3,) or bool((std == 0).any()):
        return None
    return mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)


class _DecodedRows(Dataset):
    """``(tail(rows[row of i]), label, i)`` of a folder's samples: its images decoded once
    (:class:`DecodedImages`), each model's own tensor tail applied to the 8-bit pixels."""

    def __init__(self, folder: ImageFolderDataset, decoded: DecodedImages, rows: np.ndarray,
                 tail: T.Compose):
        self.folder, self.decoded, self.row, self.tail = folder, decoded, rows, tail
        self._pixels = None

    def __len__(self) -> int:
        return len(self.folder)

    def __getstate__(self) -> dict:  # DataLoader workers open the memory map themselves
        return {**self.__dict__, "_pixels": None}

    def pixels(self) -> np.ndarray:
        """The file's rows, memory-mapped (opened once per process)."""
        if self._pixels is None:
            self._pixels = self.decoded.rows()
        return self._pixels

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        img = Image.fromarray(np.ascontiguousarray(self.pixels()[self.row[index]]))
        return self.tail(img), self.folder.samples[index][1], index


def _collate_rows(batch: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rows, labels, indices)`` of a batch of :class:`_DecodedBatches`, int64 each."""
    rows, ys, ids = zip(*batch, strict=True)
    return (torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(ys, dtype=torch.int64),
            torch.as_tensor(ids, dtype=torch.int64))


#: The divisor of ``ToTensor`` (0-dim float32).
_255 = torch.tensor(255.0)


class _DecodedBatches(_DecodedRows):
    """:class:`_DecodedRows` whose tail is ``ToTensor`` then ``Normalize`` alone: a sample is
    its row number in the file, and a batch becomes the network's input on the device in
    :meth:`to_device` (the batch loop's hook, :func:`~.loop.run_loader`): the batch's 8-bit
    pixels gathered (from the group's pixels held on the device, :func:`_resident`, or from
    the memory map), then the same elementwise float32 operations in the same order as the
    tail (to float, / 255, - mean, / std) on the whole batch, on the device: the same numbers
    bit for bit, one pass per operation, and 1 byte per pixel crossing to an accelerator."""

    collate = staticmethod(_collate_rows)
    whole_batches = True  # :class:`~.loop._OneThread`: one op per batch, all threads

    def __init__(self, folder: ImageFolderDataset, decoded: DecodedImages, rows: np.ndarray,
                 tail: T.Compose, normalize: tuple[torch.Tensor, torch.Tensor]):
        super().__init__(folder, decoded, rows, tail)
        self.mean, self.std = normalize
        self._consts: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def __getstate__(self) -> dict:  # nothing of a device to a DataLoader worker
        return {**super().__getstate__(), "_consts": {}}

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(255, mean, std)`` on ``device`` (copied once per dataset and device)."""
        got = self._consts.get(device)
        if got is None:
            got = self._consts[device] = tuple(t.to(device) for t in (_255, self.mean,
                                                                        self.std))
        return got

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        return int(self.row[index]), self.folder.samples[index][1], index

    def __getitems__(self, indices) -> list:
        return [self[i] for i in indices]

    def to_device(self, rows, indices, device: str | torch.device) -> torch.Tensor:
        """The batch of file rows ``rows`` (of samples ``indices``; a tensor or a list of
        :meth:`__getitem__`'s row numbers) as the network's input on ``device``, (B, 3, H, W)
        float32 contiguous."""
        device = torch.device(device)
        rows = np.fromiter((int(r) for r in rows), np.int64)
        held = _resident(self.decoded, device) if _keep_resident(device) else None
        if held is not None:
            u8 = held[torch.from_numpy(rows).to(held.device)]
        else:  # the memory map; to an accelerator one block (this batch) of 8-bit pixels
            u8 = torch.from_numpy(np.stack([self.pixels()[r] for r in rows])).to(device)
        # NCHW float32 in one pass (the transpose and the conversion), then in place: the
        # same operations and values, without a uint8 copy and two fresh float batches
        x = u8.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
        # CUDA divides by a CPU scalar through its reciprocal (one bit off at times): the
        # divisor is a tensor on the device there, for the division itself, as on the CPU
        c255, mean, std = self.constants(device)
        x = x.div_(255) if device.type == "cpu" else x.div_(c255)
        return x.sub_(mean).div_(std)


#: Share of a device's free memory the pixels of one decoded file may take to be held there
#: (:func:`_resident`); a larger file is copied to the device a batch at a time.
RESIDENT_FRACTION = 0.5
#: Decoded files held on devices in this process: ``(path, device) -> (stamp, uint8 tensor)``,
#: least recently used first.
_RESIDENT: OrderedDict[tuple[str, str], tuple[tuple, torch.Tensor]] = OrderedDict()
_RESIDENT_LOCK = threading.Lock()
#: Rows copied to the device per step when a file is loaded (about 64 MiB of pixels).
_UPLOAD_BYTES = 64 << 20


def _keep_resident(device: torch.device) -> bool:
    """Whether the pixels of a decoded file are held on ``device`` across the models of its
    group: on CUDA (on the CPU the memory map is the pixels already)."""
    return device.type == "cuda"


def _free_bytes(device: torch.device) -> int:
    """Bytes ``device`` can still give: CUDA's free memory plus what torch's caching allocator
    holds unused; the available physical memory for the CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _resident(decoded: DecodedImages, device: torch.device) -> torch.Tensor | None:
    """The pixels of ``decoded`` held on ``device``, (n, H, W, 3) uint8, loaded once per
    process for all the models (cells) of its group; ``None`` when they do not fit in
    :data:`RESIDENT_FRACTION` of the device's free memory, even with the other files held
    there let go (least recently used first). A file removed (its sweep done) or rewritten
    (another size or modification time) is let go at the next call."""
    key = (str(Path(decoded.path).resolve()), str(device))
    try:
        st = os.stat(key[0])
    except OSError:
        return None
    stamp = (st.st_size, st.st_mtime_ns, decoded.shape)
    with _RESIDENT_LOCK:
        for k in [k for k in _RESIDENT if k != key and not os.path.exists(k[0])]:
            del _RESIDENT[k]
        got = _RESIDENT.pop(key, None)
        if got is not None and got[0] == stamp:
            _RESIDENT[key] = got  # most recently used
            return got[1]
        del got
        need = int(np.prod(decoded.shape))
        while need > RESIDENT_FRACTION * _free_bytes(device):
            older = next((k for k in _RESIDENT if k[1] == key[1]), None)
            if older is None:
                return None
            del _RESIDENT[older]
        pixels = decoded.rows()
        out = torch.empty(pixels.shape, dtype=torch.uint8, device=device)
        step = max(1, _UPLOAD_BYTES // max(1, int(np.prod(pixels.shape[1:]))))
        for a in range(0, len(pixels), step):
            out[a:a + step].copy_(torch.from_numpy(np.array(pixels[a:a + step])))
        _RESIDENT[key] = (stamp, out)
        return out


def release_decoded() -> None:
    """Let go of every decoded file held on a device by this process (:func:`_resident`)."""
    with _RESIDENT_LOCK:
        _RESIDENT.clear()


class _DecodedFolder(ImageFolderDataset):
    """An :class:`ImageFolderDataset` whose ``with_transform`` reads the decoded pixels when
    the transform's head is the file's (:func:`decoded_folder`)."""

    decoded: DecodedImages
    decoded_rows: np.ndarray

    def with_transform(self, transform, augment_seed=None):
        split = split_transform(transform) if augment_seed is None else None
        plain = ImageFolderDataset.with_transform(self, transform, augment_seed)
        if split is None or split.key != self.decoded.key:
            plain.__class__ = ImageFolderDataset
            return plain
        normalize = _batched_tail(split.tail)
        if normalize is None:
            return _DecodedRows(plain, self.decoded, self.decoded_rows, split.tail)
        return _DecodedBatches(plain, self.decoded, self.decoded_rows, split.tail, normalize)


def decoded_folder(folder: ImageFolderDataset, decoded: DecodedImages | str | os.PathLike,
                   fingerprint: str) -> ImageFolderDataset:
    """``folder`` reading its pixels from ``decoded`` for every transform whose head is the
    file's (``with_transform``; labels, order and sample ids are ``folder``'s); ``folder``
    itself when the file is unfinished, of another folder (``fingerprint``) or lacks one of
    its samples."""
    if not isinstance(decoded, DecodedImages):
        decoded = DecodedImages.read(decoded)
    if decoded is None or decoded.fingerprint != fingerprint:
        return folder
    where = {rel: i for i, rel in enumerate(decoded.sample_ids)}
    rows = [where.get(rel, -1) for rel in folder.sample_ids]
    if -1 in rows:
        return folder
    out = copy.copy(folder)
    out.__class__ = _DecodedFolder
    out.decoded, out.decoded_rows = decoded, np.asarray(rows, np.int64)
    return out


def decoded_key(folder: ImageFolderDataset, transform) -> str:
    """The key of the decoded file ``folder`` reads for ``transform`` (:func:`decoded_folder`),
    ``""`` when its images are decoded from the files."""
    if not isinstance(folder, _DecodedFolder):
        return ""
    split = split_transform(transform)
    return split.key if split is not None and split.key == folder.decoded.key else ""
