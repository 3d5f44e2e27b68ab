"""The batch loop of every prediction mode: :func:`run_loader` runs a network over the samples
of a folder (the DataLoader, autocast, ``channels_last``, several passes per batch) and the
forward pass of each kind of network (:data:`OWN_UNCERTAINTY`, stochastic passes, embeddings).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from ..exceptions import worker_errors
from ..models import LoadedModel
from ..runtime import loader_workers
from ..training.dropout import PerSampleDropout
from ..training.method import StochasticPass
from .config import AMP_MODES, DECODERS, PredictConfig, resolve_channels_last

__all__ = ["OWN_UNCERTAINTY", "batch_progress", "eval_dataset", "run_loader"]

#: The progress reporter of the prediction running in this context (:func:`batch_progress`),
#: which :func:`run_loader` advances by one per pass of a batch; none outside a prediction.
_BATCH_PROGRESS: contextvars.ContextVar = contextvars.ContextVar("uqvision_batch_progress",
                                                                 default=None)


@contextlib.contextmanager
def batch_progress(bar):
    """Within the block, every pass of a batch that :func:`run_loader` computes advances
    ``bar`` by one (``bar.update(1)``): the progress of :func:`~.core.predict`, whatever mode
    (a protocol's included) calls :func:`run_loader`, without passing it through the mode's
    runner. It reads no random generator and changes no computation."""
    token = _BATCH_PROGRESS.set(bar)
    try:
        yield bar
    finally:
        _BATCH_PROGRESS.reset(token)


def eval_dataset(folder, loaded: LoadedModel, cfg: PredictConfig):
    """``folder`` through ``loaded``'s evaluation transform as ``cfg.decoder`` makes it: the
    model's transform on Pillow's images (``pil``), or the files' bytes decoded and
    transformed on the device by :func:`run_loader`
    (:class:`~uqvision.predict.device_decode.EncodedImages`, a decoder ``on_device``)."""
    if not DECODERS.lookup(cfg.decoder).on_device:
        return folder.with_transform(loaded.transform)
    from .device_decode import DeviceTransform, EncodedImages

    return EncodedImages(folder, DeviceTransform.of(loaded.transform, model=loaded.spec.row))


def sample_input(dataset, index: int, cfg: PredictConfig, device: str) -> torch.Tensor:
    """Sample ``index`` of ``dataset`` as a batch of one on ``device`` (:func:`_to_input`)."""
    x, _, _ = dataset[int(index)]
    if callable(getattr(dataset, "to_device", None)):  # decoded on the device
        return _to_input(dataset.to_device([x], [int(index)], device), cfg, device)
    return _to_input(x[None], cfg, device)


class _OneThread(Dataset):
    """``dataset`` whose batches are made on one torch thread (``__getitems__``), as a
    DataLoader worker makes them: the per-image tensor steps (``ToTensor``, ``Normalize``)
    are elementwise, so the pixels are the same, and on the intra-op threads of the network
    they waited for each other (0.8 ms per 224-px image on one thread, 1.2 ms on two, up to
    9 ms on two cores other jobs loaded). A dataset that makes a batch in whole-batch
    operations (``whole_batches``: the decoded rows of :mod:`~.decoded`) keeps every thread."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices):
        if getattr(self.dataset, "whole_batches", False):  # one op per batch: all threads
            return self.dataset.__getitems__(indices)
        n = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            if callable(getattr(self.dataset, "__getitems__", None)):
                return self.dataset.__getitems__(indices)
            return [self.dataset[i] for i in indices]
        finally:
            torch.set_num_threads(n)


def _batches(dataset, indices: np.ndarray, cfg: PredictConfig):
    # the loader draws its workers' base seed from `generator` (the global RNG otherwise);
    # nothing random happens in the workers: augmentations carry their own generators
    workers = loader_workers(cfg.num_workers, -(-len(indices) // cfg.batch_size), cfg.device)
    if cfg.num_workers is None and getattr(dataset, "whole_batches", False):
        workers = 0  # decoded rows (:mod:`~.decoded`): nothing a worker would overlap
    collate = getattr(dataset, "collate", None)  # encoded images: a list per batch
    if workers == 0:  # batches made in this process, between the network's forwards
        dataset = _OneThread(dataset)
    loader = DataLoader(Subset(dataset, indices.tolist()), batch_size=cfg.batch_size,
                        shuffle=False, num_workers=workers, collate_fn=collate,
                        pin_memory=cfg.device.startswith("cuda"),
                        generator=torch.Generator().manual_seed(cfg.seed))
    with worker_errors():  # an image that fails in a worker: its one line, as with none
        yield from loader


def _autocast(cfg: PredictConfig, device: str):
    dtype = getattr(torch, AMP_MODES[cfg.amp]) if AMP_MODES[cfg.amp] else None
    return torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None)


def _to_input(x: torch.Tensor, cfg: PredictConfig, device: str) -> torch.Tensor:
    """A batch on ``device``, NHWC when ``cfg.channels_last`` (a 4-D image batch)."""
    x = x.to(device, non_blocking=True)
    if cfg.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _resolved_format(model: torch.nn.Module, cfg: PredictConfig) -> PredictConfig:
    """``cfg`` with ``channels_last`` resolved (``None``: by architecture and device,
    :func:`~.config.resolve_channels_last`, as :func:`~.core.predict` resolves it)."""
    if cfg.channels_last is not None:
        return cfg
    return dataclasses.replace(cfg, channels_last=resolve_channels_last(model, cfg))


def _set_memory_format(model: torch.nn.Module, cfg: PredictConfig) -> None:
    """The network's 4-D weights in NHWC with ``cfg.channels_last`` (in place; a no-op for
    weights already so); without it the network is left as it is."""
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)


#: The capability attribute of a network that gives its own uncertainty: when true,
#: ``model.predict(x, ids, seed)`` returns ``(logits, u, embedding)`` of a batch (``ids``: the
#: samples' data-set indices, for per-sample noise), and its caches hold ``uncertainty``.
OWN_UNCERTAINTY = "predicts_uncertainty"


def _forward(model: torch.nn.Module, x: torch.Tensor, embeddings: bool, ids=None,
             seed: int = 0):
    """``(logits, embedding or None, u or None)`` of a batch; ``ids`` are the samples' data-set
    indices (per-sample noise)."""
    if isinstance(model, StochasticPass):  # noise drawn per sample: (seed, pass, sample id)
        if embeddings:
            raise ValueError("embeddings of stochastic passes are not supported")
        return model(x, ids), None, None
    if getattr(model, OWN_UNCERTAINTY, False):  # the network gives (logits, u, embedding)
        ids = range(len(x)) if ids is None else ids
        z, u, emb = model.predict(x, ids, seed)
        return z, (emb if embeddings else None), u
    if not embeddings:
        return model(x), None, None
    if not hasattr(model, "forward_head"):
        raise ValueError("embeddings need a timm model (forward_features/forward_head)")
    emb = model.forward_head(model.forward_features(x), pre_logits=True)
    return model.get_classifier()(emb), emb, None


#: The fewest rows a forward pass computes. A batch of one image (the last batch of a folder
#: whose size leaves a remainder of one) is computed as two copies of the image, the first
#: copy's results kept: the BLAS computes a product of one row as a matrix-vector product,
#: whose order of summation differs from the matrix product's, so the lone image's logits
#: would change with the batch size (on the CPU: 5e-9 for timm's ``test_byobnet``, 6e-8 for
#: ``resnet18``, whose batches of 2 to 32 give the same bits, as ConvNeXt's and ViT's:
#: docs/conventions.md#v-predict-speed). The copy has the same sample index, so a stochastic pass
#: draws it the same noise. uqreg computes a lone network the same way
#: (``uqreg.engine.plan.MIN_BATCH``).
MIN_ROWS = 2


def run_loader(loaded: LoadedModel, dataset, indices: np.ndarray, cfg: PredictConfig,
               device: str, passes: int = 1, dropout: PerSampleDropout | None = None, *,
               features_once: bool = False) -> dict[str, np.ndarray]:
    """Logits (passes, n_local, C), labels, sample indices, embeddings and the network's own
    u (of the first pass) of one loader pass.

    ``cfg.channels_last`` ``None`` is resolved as :func:`~.core.predict` resolves it (by
    architecture and device). With ``dropout``, every pass ``r`` of a batch starts
    ``dropout.start_pass(r, indices)``.
    Every pass of a batch advances the progress of the prediction running
    (:func:`batch_progress`), if any.
    With ``features_once`` (every dropout module in the head: :func:`head_only_dropout`), a
    batch's ``forward_features`` runs once and ``forward_head`` once per pass: the same masks,
    the same logits, the backbone not recomputed.
    """
    logits, labels, idx, embs, us = [], [], [], [], []
    model = loaded.model
    cfg = _resolved_format(model, cfg)
    _set_memory_format(model, cfg)
    on_device = getattr(dataset, "to_device", None)  # a decoder on the device
    bar = _BATCH_PROGRESS.get()
    with torch.inference_mode():
        for x, y, i in _batches(dataset, indices, cfg):
            if on_device is not None:
                x = on_device(x, i.tolist(), device)
            x, ids = _to_input(x, cfg, device), i.tolist()
            n = len(ids)
            if n < MIN_ROWS:  # a lone image is computed as two copies, the first kept
                x, ids = torch.cat([x] * MIN_ROWS), ids * MIN_ROWS
            outs, feats = [], None
            for r in range(passes):
                if dropout is not None:
                    dropout.start_pass(r, ids)
                with _autocast(cfg, device):
                    if features_once:
                        feats = model.forward_features(x) if feats is None else feats
                        z, e, u = model.forward_head(feats), None, None
                    else:
                        z, e, u = _forward(model, x, cfg.embeddings and r == 0, ids, cfg.seed)
                outs.append(z[:n].float().cpu().numpy())
                if e is not None:
                    embs.append(e[:n].float().cpu().numpy())
                if u is not None and r == 0:
                    us.append(u[:n].float().cpu().numpy())
                if bar is not None:
                    bar.update(1)
            logits.append(np.stack(outs))
            labels.append(y.numpy())
            idx.append(i.numpy())
    c = loaded.num_classes
    out = {"logits": np.concatenate(logits, axis=1) if logits else np.empty((passes, 0, c),
                                                                             np.float32),
           "label": np.concatenate(labels) if labels else np.empty(0, np.int64),
           "index": np.concatenate(idx) if idx else np.empty(0, np.int64)}
    if cfg.embeddings:
        out["embedding"] = np.concatenate(embs) if embs else np.empty((0, 0), np.float32)
    if us or getattr(loaded.model, OWN_UNCERTAINTY, False):
        out["uncertainty"] = np.concatenate(us) if us else np.empty(0, np.float32)
    return out
