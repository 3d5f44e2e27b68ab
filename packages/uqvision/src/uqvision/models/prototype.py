"""Prototype classifiers: cosine similarity to class embeddings × a logit scale (CLIP's head).

A zero-shot classifier such as CLIP scores an image by the cosine similarity of its embedding
to one embedding per class (CLIP: the encoded class prompts), times a logit scale, then a
softmax. :class:`PrototypeClassifier` is that head on any timm encoder, so such models join a
zoo like any other: the model source ``proto/<timm arch>`` (``uqvision predict --model
proto/resnet10t=ckpt.safetensors``) loads a checkpoint written by
:func:`save_prototype_classifier`.

Class embeddings can come from anything that describes the classes; on the ``hierarchy``
stand-in they are the encoder's embeddings of each class's clean prototype image
(:func:`uqvision.hierarchy.class_prototypes`), never of a training image of the class.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
import torch.nn.functional as F
from timm.models import load_state_dict
from torch import nn
from uqmetrics import provenance_attrs

from ..data import DataConfig, eval_transform
from .checkpoints import existing_checkpoint, read_sidecar, write_checkpoint
from .sources.timm import timm_data_config
from .spec import MODEL_SOURCES, LoadedModel, ModelSpec
from .weights import file_sha256

__all__ = [
    "DEFAULT_LOGIT_SCALE",
    "LOGIT_SCALE_BOUNDS",
    "CosineHead",
    "PrototypeClassifier",
    "PrototypeSource",
    "class_embeddings",
    "fit_logit_scale",
    "save_prototype_classifier",
]

#: CLIP's trained logit scale (its learnable temperature is clipped at 100).
DEFAULT_LOGIT_SCALE = 100.0
_FORMAT = "uqvision.prototype/1"


class CosineHead(nn.Module):
    """``logits = logit_scale · cos(embedding, class_embedding_c)`` for every class c.

    Parameters
    ----------
    class_embeddings : Tensor, shape (n_classes, dim)
        One embedding per class; stored L2-normalised.
    logit_scale : float > 0
    """

    def __init__(self, class_embeddings: torch.Tensor, logit_scale: float = DEFAULT_LOGIT_SCALE):
        super().__init__()
        e = torch.as_tensor(class_embeddings, dtype=torch.float32)
        if e.ndim != 2 or e.shape[0] < 2:
            raise ValueError(f"class_embeddings must have shape (n_classes >= 2, dim), got "
                             f"{tuple(e.shape)}")
        if not float(logit_scale) > 0:
            raise ValueError(f"logit_scale must be > 0, got {logit_scale!r}")
        self.register_buffer("class_embeddings", F.normalize(e, dim=1))
        self.register_buffer("logit_scale", torch.tensor(float(logit_scale)))

    @property
    def num_classes(self) -> int:
        return int(self.class_embeddings.shape[0])

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        """``embedding`` (n, dim) -> logits (n, n_classes)."""
        return self.logit_scale * F.normalize(embedding, dim=1) @ self.class_embeddings.T


class PrototypeClassifier(nn.Module):
    """A timm encoder (``num_classes=0``: pooled pre-logit features) and a :class:`CosineHead`.

    It speaks timm's feature interface (``forward_features``, ``forward_head(x,
    pre_logits=True)``, ``get_classifier``), so the prediction path can cache its embeddings.
    """

    def __init__(self, encoder: nn.Module, head: CosineHead):
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder.forward_features(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        emb = self.encoder.forward_head(x, pre_logits=True)
        return emb if pre_logits else self.head(emb)

    def get_classifier(self) -> nn.Module:
        return self.head

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled encoder embeddings, shape (n, dim)."""
        return self.forward_head(self.forward_features(x), pre_logits=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


@torch.no_grad()
def class_embeddings(encoder: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                     n_classes: int, *, batch_size: int = 256) -> torch.Tensor:
    """Mean L2-normalised embedding of each class's images, shape (n_classes, dim).

    Parameters
    ----------
    encoder : nn.Module
        Maps preprocessed images (n, 3, H, W) to embeddings (n, dim) (e.g. a timm model built
        with ``num_classes=0``), run in eval mode.
    images : Tensor, shape (n, 3, H, W)
        Preprocessed images describing the classes (one or more per class).
    labels : Tensor of int, shape (n,)
    n_classes : int
        Every class in ``[0, n_classes)`` needs at least one image.
    """
    labels = torch.as_tensor(labels, dtype=torch.long)
    counts = torch.bincount(labels, minlength=n_classes)
    if labels.numel() != images.shape[0] or counts.numel() != n_classes or (counts == 0).any():
        raise ValueError(f"every class in [0, {n_classes}) needs an image; counts per class "
                         f"{counts.tolist()}")
    was_training = encoder.training
    encoder.eval()
    emb = torch.cat([F.normalize(encoder(images[i:i + batch_size]), dim=1)
                     for i in range(0, images.shape[0], batch_size)])
    encoder.train(was_training)
    sums = torch.zeros(n_classes, emb.shape[1]).index_add_(0, labels, emb)
    return sums / counts[:, None]


#: Search interval of :func:`fit_logit_scale` (cosine logits need scales far above 1).
LOGIT_SCALE_BOUNDS = (0.1, 1e4)


@torch.no_grad()
def fit_logit_scale(model: PrototypeClassifier, images: torch.Tensor,
                    labels: torch.Tensor, *, batch_size: int = 256) -> tuple[float, bool]:
    """Fit the logit scale minimising the NLL on (training) images; set it on ``model.head``.

    CLIP learns its scale during training; this fits it afterwards: ``1 / T`` of
    :func:`uqmetrics.fit_temperature_result` on the unit-scale cosine logits, searched in
    :data:`LOGIT_SCALE_BOUNDS`.

    Returns
    -------
    scale : float
    converged : bool
        False when the optimum lies at a bound of the search interval.
    """
    model.eval()
    cos = torch.cat([model.head(model.embed(images[i:i + batch_size])) / model.head.logit_scale
                     for i in range(0, images.shape[0], batch_size)])
    lo, hi = LOGIT_SCALE_BOUNDS
    from uqmetrics import fit_temperature_result  # scipy: imported on first use

    fit = fit_temperature_result(cos.double().numpy(), np.asarray(labels), bounds=(1 / hi, 1 / lo))
    scale = 1.0 / fit.temperature
    model.head.logit_scale.fill_(scale)
    return scale, fit.converged


def save_prototype_classifier(model: PrototypeClassifier, path: str | os.PathLike, *, arch: str,
                              pretrained_cfg: dict, classes: list[str], tag: str,
                              model_kwargs: dict | None = None,
                              info: dict | None = None) -> Path:
    """Write the state dict (``.safetensors``) and a sidecar the ``proto`` source loads.

    ``pretrained_cfg`` is the preprocessing (:meth:`uqvision.data.DataConfig.to_dict`);
    ``model_kwargs`` rebuild the encoder (``timm.create_model(arch, num_classes=0,
    **model_kwargs)``); ``info`` (JSON-able) records how the class embeddings and scale were made.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"path must end in .safetensors, got {str(path)!r}")
    if len(classes) != model.head.num_classes:
        raise ValueError(f"{len(classes)} classes for a head of {model.head.num_classes}")
    side = {"format": _FORMAT, "architecture": arch, "tag": tag, "num_classes": len(classes),
            "classes": list(classes), "pretrained_cfg": pretrained_cfg,
            "model_kwargs": dict(model_kwargs or {}),
            "logit_scale": float(model.head.logit_scale), "info": info or {},
            "provenance": provenance_attrs(config={"arch": arch, "tag": tag})}
    return write_checkpoint(model, path, side)


def _prototype_sidecar(ckpt: str) -> dict[str, Any]:
    """The sidecar of a prototype-classifier checkpoint; ``ValueError`` naming the file when
    it has none (no ``format`` of :func:`save_prototype_classifier`)."""
    side = read_sidecar(ckpt)
    if side.get("format") != _FORMAT:
        raise ValueError(f"{ckpt!r} has no prototype-classifier sidecar (format "
                         f"{_FORMAT!r}); write it with save_prototype_classifier")
    return side


@MODEL_SOURCES.register(name="proto")
class PrototypeSource:
    """Prototype classifiers ``proto/<timm arch>``: a timm encoder + cosine head checkpoint."""

    @staticmethod
    def check_name(name: str) -> None:
        if "." in name or not timm.is_model(name):
            raise ValueError(f"proto/<name> needs a timm architecture without a tag, got "
                             f"{name!r}")

    @staticmethod
    def load(spec: ModelSpec, num_classes: int | None, allow_random_init: bool) -> LoadedModel:
        arch = spec.model_name
        PrototypeSource.check_name(arch)
        side: dict[str, Any] = {}
        sha = ""
        if spec.checkpoint is not None:
            ckpt = existing_checkpoint(spec)
            side = _prototype_sidecar(ckpt)
            state = load_state_dict(ckpt, weights_only=True)  # tensors only: never code
            n = int(state["head.class_embeddings"].shape[0])
            if num_classes is not None and n != num_classes:
                raise ValueError(f"checkpoint {ckpt!r} has {n} class embeddings but the dataset "
                                 f"has {num_classes} classes")
            sha = file_sha256(ckpt)
        elif allow_random_init:
            n = num_classes or 1000
        else:
            raise ValueError(f"model {spec.name!r} has no local checkpoint (pass one written by "
                             "save_prototype_classifier, or allow random init for tests)")
        encoder = timm.create_model(arch, num_classes=0, **side.get("model_kwargs", {}))
        dim = encoder.num_features
        model = PrototypeClassifier(encoder, CosineHead(torch.randn(n, dim)))
        if spec.checkpoint is not None:
            model.load_state_dict(state)
            dcfg = DataConfig.from_dict(side["pretrained_cfg"])
            tag = side.get("tag", Path(str(spec.checkpoint)).stem)
        else:
            dcfg = DataConfig.from_dict(timm.data.resolve_model_data_config(encoder))
            tag = "random_init"
        return LoadedModel(model.eval(), spec, dcfg, eval_transform(dcfg), n, arch, tag, sha)

    @staticmethod
    def data_config(spec: ModelSpec) -> DataConfig:
        """The preprocessing :meth:`load` gives ``spec``: the checkpoint sidecar's
        ``pretrained_cfg``; without a checkpoint (random weights), the encoder's timm default
        (:func:`~uqvision.models.sources.timm_data_config`). Nothing is built or read but the
        sidecar."""
        PrototypeSource.check_name(spec.model_name)
        if spec.checkpoint is None:
            return timm_data_config(spec.model_name)
        return DataConfig.from_dict(_prototype_sidecar(str(spec.checkpoint))["pretrained_cfg"])
