"""Models by name: the typed :data:`MODEL_SOURCES` registry, :func:`load_model`,
:func:`data_config` and the cheap checks made before anything runs (:class:`ModelSpec`, which
model to run, is :mod:`uqvision.models.names`'s, re-exported here).

A model source (:class:`ModelSource`) owns the names of one prefix: ``timm`` (``arch`` or
``arch.tag``, no prefix; :mod:`uqvision.models.sources.timm`), ``tv`` (``tv/<name>``;
:mod:`uqvision.models.sources.torchvision`) and ``proto`` (``proto/<timm arch>``;
:mod:`uqvision.models.prototype`). Each checks its names, loads a :class:`LoadedModel` and
gives the model's evaluation preprocessing (:func:`data_config`) without building it; a source
with pretrained weights (:class:`PretrainedSource`) also locates them
(:func:`uqvision.models.pretrained_weights`).

Where the weights come from, first that applies (docs/conventions.md#v-1b):

1. a local file, ``NAME=FILE`` (or the file a sweep's ``--weights-dir`` holds for the name,
   :func:`uqvision.sweep.find_weights`);
2. with ``allow_random_init`` (code-path checks only), seeded random weights;
3. the name's pretrained weights from the usual caches, downloaded there when absent and the
   network is allowed (:mod:`uqvision.models.weights`).

A timm file goes through timm's own pretrained mechanism, ``create_model(name,
pretrained=True, pretrained_cfg_overlay=dict(file=...))`` (the hub file located first, so that
the file loaded is the file hashed), so the classifier head is kept and the model's pretrained
config (input size, mean/std, crop) drives the preprocessing; torchvision weights load through
``torchvision.models.get_model(name, weights=...)``. A checkpoint written by ``uqvision train``
has a JSON sidecar (``<checkpoint>.json``, :mod:`uqvision.models.checkpoints`) with the
preprocessing it was trained with; it is applied as the same overlay. The sha256 of the file
loaded, local or cached, is the model's ``checkpoint_sha256`` (in every cache, compared when a
prediction resumes), and where a cached file came from is recorded beside it (``weights_*``
attrs, :meth:`LoadedModel.provenance`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from uqmetrics.metrics.registry import Registry

from ..data import DataConfig
from ..exceptions import CheckpointError
from .checkpoints import check_model_kwargs, existing_checkpoint, read_sidecar, sidecar_path
from .names import ModelSpec, _spec
from .weight_files import PretrainedWeights

__all__ = [
    "DROPOUT_TYPES",
    "MODEL_SOURCES",
    "LoadedModel",
    "ModelSource",
    "ModelSpec",
    "PretrainedSource",
    "check_model_name",
    "check_model_spec",
    "data_config",
    "has_dropout",
    "load_model",
]

DROPOUT_TYPES: tuple[type[nn.Module], ...] = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


@dataclass
class LoadedModel:
    """A model in eval mode with everything needed to run it and record its provenance.

    ``class_names`` (shape (num_classes,)) are the names of the model's outputs when they are
    known, from ``class_names_source``: the checkpoint's sidecar (``"sidecar"``; what
    ``uqvision train`` writes) or, for a checkpoint (or the pretrained weights) of an
    ImageNet-1k model whose sidecar names none, the 1,000 WordNet ids in timm's order
    (``"imagenet-1k"``); ``None`` otherwise. ``checkpoint_sha256`` is the SHA-256 of the weight
    file loaded (the local checkpoint, or the cached pretrained file ``weights`` names); ``""``
    for random weights. ``data_config`` equals :func:`data_config` of ``spec``.
    """

    model: nn.Module
    spec: ModelSpec
    data_config: DataConfig
    transform: Callable
    num_classes: int
    architecture: str
    tag: str
    checkpoint_sha256: str = ""
    class_names: tuple[str, ...] | None = None
    class_names_source: str = ""
    weights: PretrainedWeights | None = None

    def provenance(self) -> dict[str, Any]:
        """netCDF-safe attrs describing the model; where its weights came from in
        ``weights_source`` (``"file"``: ``checkpoint``; ``"random_init"``; or a
        :class:`~uqvision.models.PretrainedWeights` source, with its location, revision and
        file)."""
        if self.weights is not None:
            where = self.weights.attrs()
        else:
            where = {"weights_source": "file" if self.spec.checkpoint else "random_init",
                     "weights_location": "", "weights_revision": "",
                     "weights_file": str(self.spec.checkpoint or "")}
        return {"model": self.spec.row, "model_name": self.spec.name, "source": self.spec.source,
                "architecture": self.architecture, "tag": self.tag,
                "checkpoint": str(self.spec.checkpoint or ""),
                "checkpoint_sha256": self.checkpoint_sha256, **where,
                "data_config": json.dumps(self.data_config.to_dict()),
                "transform": repr(self.transform),
                "num_params": int(sum(p.numel() for p in self.model.parameters())),
                "has_dropout": int(has_dropout(self.model))}


@runtime_checkable
class ModelSource(Protocol):
    """What every entry of :data:`MODEL_SOURCES` does (the registered classes implement it with
    static methods).

    ``spec.model_name`` is the name without the source's ``<prefix>/``; every method raises
    ``ValueError`` for a name the source does not know.
    """

    def check_name(self, name: str) -> None:
        """Raise ``ValueError`` (naming ``name``, with close names) unless the source knows
        ``name``. Cheap: registry look-ups only."""

    def load(self, spec: ModelSpec, num_classes: int | None,
             allow_random_init: bool) -> LoadedModel:
        """Build the model of ``spec`` with its weights, in eval mode on the CPU.

        Parameters
        ----------
        spec : ModelSpec
        num_classes : int or None
            The class count of the data; a head of another size raises ``ValueError``.
        allow_random_init : bool
            Without a checkpoint, seeded random weights instead of pretrained ones.

        Returns
        -------
        LoadedModel
            Its ``model`` maps images (n, 3, H, W) to logits (n, num_classes).
        """

    def data_config(self, spec: ModelSpec) -> DataConfig:
        """The evaluation preprocessing :meth:`load` gives ``spec`` (``LoadedModel.data_config``),
        without building the model: from the name and the checkpoint's sidecar alone."""


@runtime_checkable
class PretrainedSource(ModelSource, Protocol):
    """A :class:`ModelSource` whose names have pretrained weights in a cache (``timm``,
    ``tv``)."""

    def pretrained(self, spec: ModelSpec, download: bool) -> PretrainedWeights | None:
        """The cached file of the pretrained weights of ``spec`` (``download``: fetch it when
        it is not cached and the network is allowed; else ``None`` when not cached).

        Raises
        ------
        uqvision.exceptions.WeightsUnavailableError
            No pretrained weights, offline and not cached, or a failed download.
        """


#: Model sources: prefix -> :class:`ModelSource` (:class:`PretrainedSource` for those with
#: pretrained weights). A name without ``<prefix>/`` is a timm name. Plugins: entry-point group
#: ``uqvision.model_sources``, each a class or object with the :class:`ModelSource` methods.
MODEL_SOURCES: Registry[ModelSource] = Registry("model source", group="uqvision.model_sources",
                                                item_type=ModelSource,
                                                fill="uqvision:load_registries")


def _suggest(name: str, candidates: list[str]) -> str:
    """``"; did you mean a, b?"`` with up to five of ``candidates`` close to ``name``, or ``""``.

    Examples
    --------
    >>> _suggest("resnet5", ["resnet50", "vit_base"])
    '; did you mean resnet50?'
    """
    close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else ""


def check_model_name(name: str) -> None:
    """Raise ``ValueError`` (with close names) unless ``name`` is a known timm/torchvision model.

    Cheap (registry look-ups only): call it before any long computation.
    """
    spec = ModelSpec(name)
    if spec.source not in MODEL_SOURCES:
        raise ValueError(f"unknown model source {spec.source!r} in {name!r}; valid model "
                         f"sources: {', '.join(MODEL_SOURCES.names())} (timm names need no "
                         "prefix)")
    MODEL_SOURCES[spec.source].check_name(spec.model_name)


def check_model_spec(spec: ModelSpec | str) -> ModelSpec:
    """Check a model before anything runs: a known name (with close names when it is not), and
    for ``NAME=CHECKPOINT`` a weight file (:func:`~uqvision.models.check_checkpoint_file`), a
    readable sidecar, a name that agrees with the architecture the sidecar records, and, for
    a timm model, sidecar ``model_kwargs`` the architecture takes
    (:func:`~uqvision.models.check_model_kwargs`).

    Cheap (registry look-ups, the file's header, the JSON sidecar and, for a sidecar with
    ``model_kwargs``, one build of the model on the meta device per process).

    Returns
    -------
    ModelSpec

    Raises
    ------
    ValueError
        An unknown name (``did you mean ...``).
    FileNotFoundError
        A checkpoint that does not exist.
    uqvision.exceptions.CheckpointError
        A damaged checkpoint or sidecar, or a name the checkpoint contradicts.
    uqmetrics.InputError
        Sidecar ``model_kwargs`` that load weights or that the model does not take (the
        message names the sidecar, the key and the model).
    """
    spec = _spec(spec)
    check_model_name(spec.name)
    if spec.checkpoint is None:
        return spec
    ckpt = existing_checkpoint(spec)
    side = read_sidecar(ckpt)
    recorded = side.get("architecture")
    arch = spec.model_name.partition(".")[0]
    if "method" in side and spec.source != "timm":
        raise CheckpointError(f"checkpoint {ckpt!r} was trained by uqvision train as timm "
                              f"{recorded!r}, not a {spec.source!r} model; give it as "
                              f"{recorded}={ckpt}")
    if isinstance(recorded, str) and recorded and recorded != arch:
        raise CheckpointError(f"model name {spec.name!r} does not match checkpoint {ckpt!r}, "
                              f"whose sidecar records architecture {recorded!r}; give it as "
                              f"{recorded}={ckpt}")
    if spec.source == "timm" and "model_kwargs" in side:  # what loading it passes to timm
        check_model_kwargs(side["model_kwargs"],
                           f"sidecar {str(sidecar_path(ckpt))!r}: model_kwargs",
                           arch=spec.model_name)
    return spec


def data_config(spec: ModelSpec | str) -> DataConfig:
    """The evaluation preprocessing of a model, known before it is built.

    It equals the ``data_config`` of :func:`load_model` for the same spec (whichever weights
    it loads: pretrained, random or the checkpoint's): for timm, the pretrained config of
    ``arch.tag`` (of the architecture's default tag for a plain ``arch``) resolved as timm's
    ``resolve_data_config``, with a checkpoint's sidecar ``pretrained_cfg`` laid over it; for
    torchvision, the transforms of the weights named (or ``DEFAULT``); for ``proto``, the
    sidecar's. Nothing is downloaded and no weight file is read (only a sidecar), so a sweep
    can group its models by it (:class:`~uqvision.data.DataConfig` is hashable).

    Parameters
    ----------
    spec : ModelSpec or str
        ``NAME`` or ``NAME=CHECKPOINT``.

    Returns
    -------
    uqvision.data.DataConfig
        ``input_size`` (3, H, W), ``mean`` and ``std`` (3,), ``crop_pct``, ``interpolation``,
        ``crop_mode``.

    Raises
    ------
    ValueError
        An unknown name or model source.
    uqvision.exceptions.CheckpointError
        A damaged sidecar.

    Examples
    --------
    >>> data_config("resnet18.a1_in1k").crop_pct
    0.95
    >>> data_config("tv/resnet18").input_size
    (3, 224, 224)
    """
    spec = _spec(spec)
    check_model_name(spec.name)
    return MODEL_SOURCES[spec.source].data_config(spec)


def load_model(spec: ModelSpec | str, *, num_classes: int | None = None, device: str = "cpu",
               allow_random_init: bool = False, seed: int = 0) -> LoadedModel:
    """Build a model from its spec, load its weights, move it to ``device``, eval mode.

    The weights: the checkpoint of ``NAME=CHECKPOINT``; else, with ``allow_random_init``,
    random ones; else the name's pretrained weights from the Hugging Face hub cache (timm) or
    torch.hub's cache (torchvision), downloaded there by huggingface_hub / torchvision when
    absent unless ``HF_HUB_OFFLINE`` is set (:func:`~uqvision.models.pretrained_weights`; the
    module docstring). The SHA-256 of the file loaded is ``checkpoint_sha256``.

    Parameters
    ----------
    spec : ModelSpec or str
        ``NAME`` or ``NAME=CHECKPOINT``.
    num_classes : int, optional
        The class count of the data it will see; a checkpoint head (or pretrained head) of
        another size raises ``ValueError`` before the model is built.
    device : str, default "cpu"
    allow_random_init : bool, default False
        Without a checkpoint, build randomly initialised weights (seeded) instead of loading
        the pretrained ones (nothing is looked up). For exercising the code path only.
    seed : int, default 0
        Seed of a random initialisation.

    Raises
    ------
    uqvision.exceptions.WeightsUnavailableError
        No checkpoint, and the pretrained weights are neither cached nor downloadable (offline,
        a failed download, or a name without pretrained weights); the message names the model
        and the cache directory.
    uqvision.exceptions.CheckpointError, FileNotFoundError, ValueError
        A checkpoint that does not load or fit, one that does not exist, an unknown name.
    """
    spec = _spec(spec)
    if spec.source not in MODEL_SOURCES:
        check_model_name(spec.name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        loaded = MODEL_SOURCES[spec.source].load(spec, num_classes, allow_random_init)
    loaded.model.to(device)
    return loaded


def has_dropout(model: nn.Module) -> bool:
    """True when ``model`` has a dropout module with p > 0 (MC dropout is possible)."""
    return any(isinstance(m, DROPOUT_TYPES) and m.p > 0 for m in model.modules())
