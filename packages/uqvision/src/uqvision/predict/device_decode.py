"""Images decoded, resized and normalised on the prediction's device (``PredictConfig.decoder
= "torchvision"``, docs/conventions.md#v-decoders).

The loader's workers only read each image file's bytes (checked against a sweep's digests as
for Pillow, :meth:`uqvision.data.ImageFolderDataset.read_checked`): :class:`EncodedImages`.
The batch loop then decodes a batch's JPEGs in one call of ``torchvision.io.decode_jpeg(list,
device=...)`` (nvJPEG's batched decoder on CUDA, libjpeg-turbo on the CPU: the same code) and
applies the model's evaluation transform as torch operations on that device
(:class:`DeviceTransform`): timm's ``Resize`` (shorter side, the same interpolation, always
antialiased as Pillow is) on float32 pixels rounded back to 8-bit values, ``CenterCrop``,
then ``/ 255``, ``- mean``, ``/ std`` in float32 as ``ToTensor`` and ``Normalize`` do.

A file that is not a JPEG (PNG, the generated stand-in data of ``uqvision data``; BMP, ...)
is decoded by the worker with Pillow, exactly as the ``pil`` decoder decodes it
(:func:`uqvision.data.load_image`: 8-bit RGB, 16-bit grey scaled), and resized on the device
like a JPEG: a lossless format has one decoding, and only its resize differs from Pillow's.

Every image is decoded, resized and cropped on its own, and the normalisation is
elementwise: a sample's input does not depend on the batch it is in, the batch size, the
worker count or the shard (bit for bit, on one device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import functional as TF
from uqmetrics import InputError

from ..data import ImageFolderDataset, load_image
from ..exceptions import BadImageError
from .decoded import _batched_tail, split_transform

__all__ = ["JPEG_MAGIC", "DeviceTransform", "EncodedImages", "decode_batch"]

#: The first bytes of a JPEG file (SOI marker and the next marker's 0xFF): what is decoded by
#: ``decode_jpeg``; any other file is decoded by Pillow in the worker.
JPEG_MAGIC = b"\xff\xd8\xff"


@dataclass(frozen=True)
class DeviceTransform:
    """A timm evaluation transform (``Resize``, ``CenterCrop``, ``ToTensor``, ``Normalize``)
    as torch operations on 8-bit image tensors on any device.

    Attributes
    ----------
    steps : tuple
        The geometry head (torchvision ``Resize`` and ``CenterCrop`` steps, in order; the
        last a ``CenterCrop``: :func:`uqvision.predict.decoded.split_transform`).
    mean, std : torch.Tensor
        (1, 3, 1, 1) float32, on the CPU (copied to the batch's device for each batch: 24
        bytes, and nothing device-bound in a dataset the loader's workers receive).
    """

    steps: tuple
    mean: torch.Tensor
    std: torch.Tensor

    @classmethod
    def of(cls, transform, *, model: str = "?") -> DeviceTransform:
        """The device form of ``transform``.

        Raises
        ------
        uqmetrics.InputError
            ``transform`` is not resize / centre crop / to tensor / normalise (naming
            ``model`` and the transform): the device decoder cannot follow it.
        """
        split = split_transform(transform)
        tail = _batched_tail(split.tail) if split is not None else None
        if tail is None:
            raise InputError(
                f"--decoder torchvision: model {model!r}'s evaluation transform is not a "
                f"resize, a centre crop, to-tensor and normalise ({transform!r}), which is what "
                "the device decoder follows; predict it with --decoder pil")
        return cls(tuple(split.head.transforms), *tail)

    def image(self, pixels: torch.Tensor) -> torch.Tensor:
        """One decoded image, (3, h, w) uint8 on any device -> (3, H, W) float32 of 8-bit
        values (0 ... 255, rounded, as Pillow's resized pixels are), on that device."""
        x = pixels.to(torch.float32)[None]
        for t in self.steps:
            x = _resize(x, t) if isinstance(t, T.Resize) else TF.center_crop(x, t.size)
        return x[0]

    def batch(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Decoded images (each (3, h, w) uint8, one device) -> the network's input, (B, 3,
        H, W) float32: each image resized and cropped on its own (:meth:`image`), then
        ``/ 255``, ``- mean``, ``/ std`` elementwise, the order of ``ToTensor`` and
        ``Normalize``."""
        x = torch.stack([self.image(p) for p in images])
        return x.div_(255).sub_(self.mean.to(x.device)).div_(self.std.to(x.device))


#: Pillow's resampling filters that ``torch.nn.functional.interpolate`` computes with
#: ``antialias=True`` (the same filters, the same support; bicubic with a = -0.5, as Pillow).
_PIL_FILTERS = {T.InterpolationMode.BILINEAR: "bilinear", T.InterpolationMode.BICUBIC: "bicubic"}


def _round8(x: torch.Tensor) -> torch.Tensor:
    """Float pixels to 8-bit values as Pillow stores them: half up, clipped to 0 ... 255."""
    return x.add_(0.5).floor_().clamp_(0, 255)


def _resize(x: torch.Tensor, t: T.Resize) -> torch.Tensor:
    """torchvision's ``Resize`` ``t`` of (1, 3, h, w) float32 8-bit values as Pillow computes
    it on an 8-bit image: the output size of ``t`` (shorter side, ``max_size``), the
    horizontal pass first and its result rounded to 8 bits, then the vertical pass, rounded
    (Pillow's ``ImagingResample`` keeps an 8-bit image between its two passes). Another
    interpolation (nearest, box, ...) is torchvision's tensor resize, rounded."""
    h, w = x.shape[-2:]
    out_h, out_w = TF._compute_resized_output_size((h, w), list(_size(t.size)), t.max_size)
    mode = _PIL_FILTERS.get(t.interpolation)
    if mode is None:
        return _round8(TF.resize(x, [out_h, out_w], interpolation=t.interpolation,
                                 antialias=True))
    if out_w != w:
        x = _round8(torch.nn.functional.interpolate(x, size=(h, out_w), mode=mode,
                                                    align_corners=False, antialias=True))
    if out_h != h:
        x = _round8(torch.nn.functional.interpolate(x, size=(out_h, out_w), mode=mode,
                                                    align_corners=False, antialias=True))
    return x


def _size(size) -> tuple:
    return tuple(size) if isinstance(size, list | tuple) else (size,)


def decode_batch(items: Sequence[np.ndarray | torch.Tensor], device: str | torch.device,
                 names: Sequence[str]) -> list[torch.Tensor]:
    """A batch's images as (3, h, w) uint8 tensors on ``device``: the JPEG bytes (1-D uint8)
    decoded in one ``decode_jpeg`` call there, RGB; pixels already decoded ((3, h, w) uint8)
    moved.

    Raises
    ------
    uqvision.exceptions.BadImageError
        A JPEG ``decode_jpeg`` cannot decode on ``device`` (named from ``names``).
    """
    items = [torch.from_numpy(t) if isinstance(t, np.ndarray) else t for t in items]
    out = list(items)
    jpegs = [k for k, t in enumerate(items) if t.dim() == 1]
    if jpegs:
        try:
            decoded = decode_jpeg([items[k] for k in jpegs], mode=ImageReadMode.RGB,
                                  device=device)
        except RuntimeError:
            for k in jpegs:  # which one: decoded one at a time
                try:
                    decode_jpeg(items[k], mode=ImageReadMode.RGB, device=device)
                except RuntimeError as err:
                    text = " ".join(str(err).split())[:200]
                    raise BadImageError(
                        f"image {names[k]!r}: torchvision.io.decode_jpeg cannot decode it on "
                        f"{device} ({text}); predict it with --decoder pil", names[k]) from None
            raise
        for k, img in zip(jpegs, decoded, strict=True):
            out[k] = img
    return [t.to(device, non_blocking=True) for t in out]


def _collate(batch: list) -> tuple[list[np.ndarray], torch.Tensor, torch.Tensor]:
    """``(list of encoded images, labels, indices)``: images of different sizes stay a list
    (of numpy arrays: a worker sends them pickled, where a tensor each would hold a file
    descriptor of shared memory, and a few thousand of them exhaust the process's)."""
    xs, ys, ids = zip(*batch, strict=True)
    return list(xs), torch.as_tensor(ys, dtype=torch.int64), torch.as_tensor(ids,
                                                                             dtype=torch.int64)


class EncodedImages(Dataset):
    """``(encoded image, label, index)`` of a folder's samples, for a decoder on the device.

    The encoded image is a numpy uint8 array: the file's bytes (1-D) for a JPEG
    (:data:`JPEG_MAGIC`), else its pixels decoded by Pillow (:func:`uqvision.data.load_image`),
    (3, h, w). Batches are made by :attr:`collate`, and become the network's input on the
    device by :meth:`to_device`.
    """

    collate = staticmethod(_collate)

    def __init__(self, folder: ImageFolderDataset, transform: DeviceTransform):
        self.folder, self.transform = folder, transform

    def __len__(self) -> int:
        return len(self.folder)

    def name(self, index: int) -> str:
        """Where sample ``index`` is read from (messages)."""
        return self.folder.source.where(self.folder.samples[index][0])

    def __getitem__(self, index: int) -> tuple[np.ndarray, int, int]:
        rel, label = self.folder.samples[index]
        data = self.folder.read_checked(rel)  # a sweep's plan digests: checked as read
        if data is None:
            try:
                data = self.folder.source.read(rel)
            except OSError as err:
                raise BadImageError(f"image {self.name(index)!r}: cannot be read ({err})",
                                    self.name(index)) from None
        if data[:3] == JPEG_MAGIC:
            return np.frombuffer(bytearray(data), dtype=np.uint8), label, index
        img = load_image(self.name(index), content=data)
        # a copy: Pillow's array is read-only, and np.ascontiguousarray returns it as it is
        # when the transpose is contiguous already (a 1-pixel image), which torch.from_numpy
        # then warns about
        pixels = np.asarray(img, dtype=np.uint8).transpose(2, 0, 1).copy(order="C")
        return pixels, label, index

    def to_device(self, items: Sequence[np.ndarray], indices: Sequence[int],
                  device: str | torch.device) -> torch.Tensor:
        """A batch of :meth:`__getitem__`'s images (of samples ``indices``) as the network's
        input on ``device``, (B, 3, H, W) float32."""
        names = [self.name(int(i)) for i in indices]
        return self.transform.batch(decode_batch(items, device, names))
