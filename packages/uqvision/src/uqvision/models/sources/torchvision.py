"""The ``tv`` model source: torchvision models ``tv/<name>[.<WEIGHTS>]``, with timm's feature
interface.

The weights come from a local state-dict file, or are the weights enum member named (or the
architecture's ``DEFAULT``) from torch.hub's cache (:meth:`TorchvisionSource.pretrained`). The
preprocessing is that member's transforms, known before the model is built
(:meth:`TorchvisionSource.data_config`).

Every classifier loaded here speaks timm's feature interface (:class:`TorchvisionFeatures`):
``forward_features(x)`` (the input of the network's classifier), ``forward_head(x,
pre_logits=False)``, ``get_classifier()`` and ``num_features`` (the width of the pre-logit
embedding), so that the prediction path caches embeddings of ``tv/`` models as of timm ones.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn

from ...data import DataConfig, eval_transform
from ...exceptions import CheckpointError, WeightsUnavailableError
from ..checkpoints import (
    _check_head,
    _class_names,
    _imagenet_names,
    _load_error,
    _other_architecture,
    existing_checkpoint,
    read_sidecar,
    read_state_dict,
    tensors_only,
)
from ..spec import MODEL_SOURCES, LoadedModel, ModelSpec, _suggest
from ..weights import (
    PretrainedWeights,
    _memo_sha256,
    _one_line,
    _unavailable,
    _url_weights,
    torch_hub_checkpoints,
)

__all__ = ["TorchvisionFeatures", "TorchvisionSource", "with_feature_interface"]


def _tv_weights(name: str):
    """``arch`` or ``arch.WEIGHTS`` -> (arch, the torchvision weights enum member or None).

    Without ``.WEIGHTS`` the architecture's ``DEFAULT`` member; ``None`` when the
    architecture has no weights enum.
    """
    arch, _, weights = name.partition(".")
    names = torchvision.models.list_models()
    if arch not in names:
        raise ValueError(f"unknown torchvision model {arch!r}" + _suggest(arch, names))
    try:
        enum = torchvision.models.get_model_weights(arch)
    except (ValueError, KeyError):
        enum = None
    if not weights:
        return arch, (enum.DEFAULT if enum is not None else None)
    valid = [w for w in (enum.__members__ if enum is not None else ()) if w != "DEFAULT"]
    if weights not in valid:
        raise ValueError(f"unknown weights {weights!r} of torchvision model {arch!r}; valid: "
                         f"{', '.join(valid) or 'none'}")
    return arch, enum[weights]


def _weights_preprocessing(weights) -> tuple[DataConfig, Callable, str]:
    """``(data config, transform, tag)`` of a weights enum member (its reference transforms;
    nothing downloaded), or of none: ImageNet's mean/std at 224, timm's default crop."""
    if weights is None:
        dcfg = DataConfig((3, 224, 224), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
        return dcfg, eval_transform(dcfg), ""
    t = weights.transforms()
    crop, resize = t.crop_size[0], t.resize_size[0]
    dcfg = DataConfig((3, crop, crop), tuple(t.mean), tuple(t.std), crop / resize,
                      t.interpolation.value)
    return dcfg, t, weights.name


def _last_linear(model: nn.Module) -> str:
    """The name of ``model``'s last ``nn.Linear`` (its classifier), in registration order."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]


class _FeaturesReached(BaseException):
    """Raised by :meth:`TorchvisionFeatures.forward_features` at the classifier's input, to stop
    the network's own ``forward`` there (a ``BaseException``: no ``except Exception`` of a
    network swallows it)."""

    def __init__(self, features: torch.Tensor):
        super().__init__()
        self.features = features


class TorchvisionFeatures:
    """timm's feature interface on a torchvision classifier (mixed into its class by
    :func:`with_feature_interface`; the state dict, ``forward`` and outputs are unchanged).

    The split is at the input of the network's head, ``_uq_head``: the top-level module whose
    last layer is the final ``nn.Linear`` (ResNet's ``fc``; MobileNet's, EfficientNet's,
    ConvNeXt's ``classifier``; ViT's ``heads``; Swin's ``head``). ``forward_features`` runs the
    network's own ``forward`` up to that input; ``forward_head`` runs the head. The pre-logit
    embedding is the input of the final ``nn.Linear`` (after the head's dropout, as timm's
    ``ClassifierHead``: ``get_classifier()(forward_head(f, pre_logits=True))`` is
    ``forward_head(f)`` under the same dropout masks), of width :attr:`num_features`.
    """

    _uq_head: str

    def _uq_head_module(self) -> nn.Module:
        return getattr(self, self._uq_head)

    @property
    def num_features(self) -> int:
        """The width of the pre-logit embedding, ``get_classifier().in_features``."""
        return int(self.get_classifier().in_features)

    def get_classifier(self) -> nn.Linear:
        """The final ``nn.Linear``: ``get_classifier()(forward_head(f, pre_logits=True))`` is
        ``forward_head(f)``, the logits."""
        head = self._uq_head_module()
        return head if isinstance(head, nn.Linear) else head[-1]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The input of the head (e.g. ResNet: pooled features (n, 512); MaxViT: the feature map
        (n, C, h, w)) of images ``x`` (n, 3, H, W), computed by the network's own
        ``forward``, stopped there."""
        def stop(_module, args):
            raise _FeaturesReached(args[0])

        handle = self._uq_head_module().register_forward_pre_hook(stop)
        try:
            self.forward(x)
        except _FeaturesReached as reached:
            return reached.features
        finally:
            handle.remove()
        raise RuntimeError(f"{type(self).__name__}.forward never called its head "
                           f"{self._uq_head!r}")

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Logits (n, num_classes) of :meth:`forward_features`' output ``x``, or with
        ``pre_logits`` the embedding (n, :attr:`num_features`)."""
        head = self._uq_head_module()
        if not pre_logits:
            return head(x)
        if isinstance(head, nn.Linear):
            return x
        for layer in list(head)[:-1]:
            x = layer(x)
        return x


#: torchvision class -> its subclass with :class:`TorchvisionFeatures` mixed in.
_FEATURED: dict[type, type] = {}


def _head_name(model: nn.Module) -> str | None:
    """The top-level module that is, or ends with, the final ``nn.Linear`` (:func:`_last_linear`);
    ``None`` when there is none (SqueezeNet: a convolutional head) or it sits deeper."""
    if not any(isinstance(m, nn.Linear) for m in model.modules()):
        return None
    final = _last_linear(model)
    top = final.partition(".")[0]
    head, linear = model.get_submodule(top), model.get_submodule(final)
    if head is linear or isinstance(head, nn.Sequential) and len(head) and head[-1] is linear:
        return top
    return None


def with_feature_interface(model: nn.Module) -> nn.Module:
    """Give a torchvision classifier timm's feature interface, in place (its class becomes a
    subclass with :class:`TorchvisionFeatures` mixed in, of the same name); a network without
    a linear head is returned unchanged. The subclass is made at run time: such a model
    deep-copies, but is saved by its ``state_dict`` (as every checkpoint here), not pickled.

    Parameters
    ----------
    model : nn.Module
        A torchvision classifier (images (n, 3, H, W) -> logits (n, num_classes)).

    Returns
    -------
    nn.Module
        ``model``, with ``forward_features``, ``forward_head``, ``get_classifier`` and
        ``num_features``.

    Examples
    --------
    >>> net = with_feature_interface(torchvision.models.resnet18(num_classes=3).eval())
    >>> x = torch.randn(2, 3, 64, 64)
    >>> tuple(net.forward_head(net.forward_features(x), pre_logits=True).shape)
    (2, 512)
    >>> torch.equal(net.forward_head(net.forward_features(x)), net(x))
    True
    """
    head = _head_name(model)
    if head is None or isinstance(model, TorchvisionFeatures):
        return model
    cls = type(model)
    if cls not in _FEATURED:
        _FEATURED[cls] = type(cls.__name__, (TorchvisionFeatures, cls),
                              {"__doc__": cls.__doc__, "__module__": __name__})
    model.__class__ = _FEATURED[cls]
    model._uq_head = head
    return model


@MODEL_SOURCES.register(name="tv")
class TorchvisionSource:
    """torchvision models ``tv/<name>[.<WEIGHTS>]``; weights from a local state-dict file, or
    the weights named (or ``DEFAULT``) from torch.hub's cache (:meth:`pretrained`).

    The preprocessing is that of the weights enum member named (``tv/resnet50.IMAGENET1K_V1``:
    resize 256, crop 224; ``.IMAGENET1K_V2``: resize 232), or of the architecture's ``DEFAULT``
    member when none is named; the member is the model's tag and its transform is recorded in
    every cache (docs/conventions.md#v-1). A checkpoint written by ``uqvision train`` keeps its own
    sidecar preprocessing. The models speak timm's feature interface
    (:func:`with_feature_interface`).
    """

    @staticmethod
    def check_name(name: str) -> None:
        _tv_weights(name)

    @staticmethod
    def load(spec: ModelSpec, num_classes: int | None, allow_random_init: bool) -> LoadedModel:
        name, weights = _tv_weights(spec.model_name)
        dcfg, transform, tag = _weights_preprocessing(weights)
        sha = ""
        names, names_from = None, ""
        found: PretrainedWeights | None = None
        if spec.checkpoint is not None:
            ckpt = existing_checkpoint(spec)
            state = read_state_dict(ckpt)
            probe = torchvision.models.get_model(name, weights=None)
            try:
                n = _check_head(state, [f"{_last_linear(probe)}.weight"], num_classes, ckpt)
            except ValueError:
                why = _other_architecture(ckpt, spec.name, probe.state_dict(), state)
                if why:
                    raise CheckpointError(why) from None
                raise
            model = torchvision.models.get_model(name, weights=None, num_classes=n)
            try:
                model.load_state_dict(state)
            except RuntimeError as err:
                raise _load_error(ckpt, spec.name, err) from None
            side = read_sidecar(ckpt)
            if "pretrained_cfg" in side:
                dcfg = DataConfig.from_dict(side["pretrained_cfg"])
                transform = eval_transform(dcfg)
            sha = _memo_sha256(ckpt)
            names, names_from = _class_names(ckpt, n, in1k=bool(
                weights is not None and weights.name.startswith("IMAGENET1K")))
            tag = side.get("tag", tag or Path(ckpt).stem)
        elif allow_random_init:
            n = num_classes or 1000
            model = torchvision.models.get_model(name, weights=None, num_classes=n)
            tag = f"{tag}+random_init" if tag else "random_init"
        else:  # the weights' file in torch.hub's cache (torchvision downloads it when allowed)
            if weights is None:
                raise WeightsUnavailableError(
                    f"model {spec.name!r}: torchvision has no pretrained weights for {name!r}; "
                    "give a local file as NAME=FILE or with --weights-dir")
            n = len(weights.meta["categories"])
            if num_classes is not None and n != num_classes:
                raise ValueError(f"the pretrained weights of model {spec.name!r} have a "
                                 f"{n}-class head but the dataset has {num_classes} classes")
            found = TorchvisionSource.pretrained(spec, False)  # offline, not cached: the error
            sha = found.sha256 if found is not None else ""
            try:
                with tensors_only():  # torch.hub loads with weights_only=False
                    model = torchvision.models.get_model(name, weights=weights, progress=False)
            except (OSError, RuntimeError, pickle.UnpicklingError) as err:  # URLError, a hash
                # mismatch, a bad file, a pickle that is not tensors only
                raise _unavailable(spec.name, f"{weights.url.rsplit('/', 1)[-1]} from "
                                   f"{weights.url}", torch_hub_checkpoints(),
                                   f"could not be downloaded or loaded ({_one_line(err)})"
                                   ) from None
            if found is None:  # downloaded just now, by torchvision
                found = TorchvisionSource.pretrained(spec, False)
                sha = found.sha256
            names = _imagenet_names(n, in1k=weights.name.startswith("IMAGENET1K"))
            names_from = "imagenet-1k" if names else ""
        model = with_feature_interface(model.eval())
        return LoadedModel(model, spec, dcfg, transform, n, name, tag, sha, names, names_from,
                           found)

    @staticmethod
    def data_config(spec: ModelSpec) -> DataConfig:
        """The preprocessing :meth:`load` gives ``spec``: a checkpoint sidecar's
        ``pretrained_cfg``, else the transforms of the weights named (or ``DEFAULT``); the model
        is not built and nothing is downloaded."""
        _, weights = _tv_weights(spec.model_name)
        side: dict[str, Any] = {} if spec.checkpoint is None else read_sidecar(spec.checkpoint)
        if "pretrained_cfg" in side:
            return DataConfig.from_dict(side["pretrained_cfg"])
        return _weights_preprocessing(weights)[0]

    @staticmethod
    def pretrained(spec: ModelSpec, download: bool) -> PretrainedWeights | None:
        """The weights' file in torch.hub's cache, ``torch_hub_checkpoints()/<basename of
        weights.url>`` (torchvision's file name, with its sha256 prefix); fetched with
        torchvision's own ``weights.get_state_dict`` (which checks that prefix on download)."""
        arch, weights = _tv_weights(spec.model_name)
        if weights is None:
            raise WeightsUnavailableError(
                f"model {spec.name!r}: torchvision has no pretrained weights for {arch!r}; give "
                "a local file as NAME=FILE or with --weights-dir")
        return _url_weights(spec.name, "torchvision", weights.url, download,
                            lambda: weights.get_state_dict(progress=False, check_hash=True,
                                                           weights_only=True))
