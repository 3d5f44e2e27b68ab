"""The ``timm`` model source: timm names, ``arch`` or ``arch.tag`` (no prefix).

``arch`` alone is the architecture's default tag. The weights go through timm's own pretrained
mechanism, ``create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=...))``: a
local checkpoint (its sidecar's ``pretrained_cfg`` and ``model_kwargs`` laid over), or the
tag's pretrained file from the Hugging Face hub cache or torch.hub's (located first, so that
the file loaded is the file hashed; :mod:`uqvision.models.weights`). The classifier head is
kept, and the model's pretrained config drives the preprocessing, known before the model is
built (:meth:`TimmSource.data_config`, :func:`timm_data_config`).
"""

from __future__ import annotations

import functools
import pickle
from typing import Any

import timm
import torch
from timm.data import resolve_data_config, resolve_model_data_config
from timm.models import get_pretrained_cfg
from timm.models._builder import (  # timm's own choice of source and config
    _resolve_pretrained_source,
    resolve_pretrained_cfg,
)
from timm.models._hub import download_cached_file

from ...data import DataConfig, eval_transform
from ...exceptions import CheckpointError, WeightsUnavailableError
from .. import archs as _archs  # noqa: F401  (registers uqvision's timm architectures)
from ..checkpoints import (
    _check_head,
    _class_names,
    _classifier_keys,
    _imagenet_names,
    _load_error,
    _other_architecture,
    _tensor_shapes,
    check_checkpoint_file,
    check_model_kwargs,
    check_sidecar_pretrained_cfg,
    existing_checkpoint,
    read_sidecar,
    sidecar_path,
    tensors_only,
)
from ..spec import MODEL_SOURCES, LoadedModel, ModelSpec, _suggest
from ..weights import PretrainedWeights, _hub_file, _memo_sha256, _url_weights

__all__ = ["TimmSource", "timm_data_config"]


def timm_data_config(name: str, overlay: dict[str, Any] | None = None) -> DataConfig:
    """The evaluation preprocessing of timm model ``name`` built with ``pretrained_cfg_overlay
    =overlay``, without building it.

    timm's own resolution: the pretrained config of ``arch.tag`` (of the architecture's default
    tag for a plain ``arch``; timm's default config for an architecture without one) with
    ``overlay`` laid over (``timm.models._builder.resolve_pretrained_cfg``, as
    ``create_model`` does), then ``timm.data.resolve_data_config`` of it (as
    ``resolve_model_data_config`` of the built model).

    Parameters
    ----------
    name : str
        ``arch`` or ``arch.tag``.
    overlay : dict, optional
        Pretrained-config fields laid over the tag's (a sidecar's ``pretrained_cfg``).

    Returns
    -------
    uqvision.data.DataConfig

    Examples
    --------
    >>> timm_data_config("test_resnet.r160_in1k").input_size
    (3, 160, 160)
    >>> timm_data_config("test_resnet", {"input_size": [3, 32, 32]}).input_size
    (3, 32, 32)
    """
    arch, _, tag = name.partition(".")
    cfg = resolve_pretrained_cfg(arch, tag or None, overlay)
    return DataConfig.from_dict(resolve_data_config(pretrained_cfg=cfg.to_dict()))


def _timm_mismatch(ckpt: str, name: str, state: dict, kwargs: dict) -> str | None:
    """:func:`~uqvision.models.checkpoints._other_architecture` of a timm model (built on the
    CPU to read its keys)."""
    try:
        with torch.random.fork_rng(devices=[]):
            probe = timm.create_model(name, **kwargs)
    except Exception:  # noqa: BLE001  (an explanation only; the caller raises anyway)
        return None
    return _other_architecture(ckpt, name, probe.state_dict(), state)


def _timm_pretrained(spec: ModelSpec, download: bool) -> PretrainedWeights | None:
    """The cached file of a timm name's pretrained weights, located as timm locates it."""
    cfg = get_pretrained_cfg(spec.model_name)
    load_from, loc = _resolve_pretrained_source(cfg.to_dict()) if cfg is not None else ("", "")
    if load_from == "hf-hub":
        repo, filename = loc if isinstance(loc, (list, tuple)) else (loc, "pytorch_model.bin")
        return _hub_file(spec.name, repo, filename, download)
    if load_from == "url":
        return _url_weights(spec.name, "url", str(loc), download,
                            lambda: download_cached_file(str(loc), check_hash=True))
    raise WeightsUnavailableError(
        f"model {spec.name!r} has no pretrained weights in timm (its pretrained config names no "
        f"hub repository or url); give a local file as NAME=FILE or with --weights-dir")


@functools.lru_cache(maxsize=1)
def _pretrained_names() -> frozenset[str]:
    """timm's pretrained ``arch.tag`` names, listed once per process: ``list_pretrained(name)``
    matches a pattern against every registered name, 20 s for a zoo of a thousand models
    checked a few times each. A name missing from this set (a model registered since) is
    looked up again in timm itself, so the set only saves time."""
    return frozenset(timm.list_pretrained())


@MODEL_SOURCES.register(name="timm")
class TimmSource:
    """timm models: ``arch`` or ``arch.tag`` (``arch``: its default tag); weights through
    ``pretrained_cfg_overlay``: a local file, or the tag's pretrained file from the hub cache
    (:meth:`pretrained`)."""

    @staticmethod
    def check_name(name: str) -> None:
        arch, _, tag = name.partition(".")
        if not timm.is_model(arch):
            raise ValueError(f"unknown timm model {name!r}"
                             + _suggest(name, timm.list_models() + timm.list_pretrained()))
        if tag and name not in _pretrained_names() and name not in timm.list_pretrained(name):
            raise ValueError(f"unknown pretrained tag {tag!r} for timm model {arch!r}"
                             + _suggest(name, timm.list_pretrained(f"{arch}.*")))

    @staticmethod
    def load(spec: ModelSpec, num_classes: int | None, allow_random_init: bool) -> LoadedModel:
        TimmSource.check_name(spec.model_name)
        arch, _, tag = spec.model_name.partition(".")
        kwargs: dict[str, Any] = {}
        sha = ""
        names, names_from = None, ""
        weights: PretrainedWeights | None = None
        n = 0
        if spec.checkpoint is not None:
            ckpt = existing_checkpoint(spec)
            side = read_sidecar(ckpt)
            cfg = get_pretrained_cfg(spec.model_name)
            keys = _classifier_keys(cfg.classifier if cfg is not None else None)
            state = _tensor_shapes(ckpt)  # the weights are read once, by timm's load
            try:
                n = _check_head(state, keys, num_classes, ckpt)
            except ValueError:
                why = _timm_mismatch(ckpt, spec.model_name, state, side.get("model_kwargs", {}))
                if why:
                    raise CheckpointError(why) from None
                raise
            model_kwargs = side.get("model_kwargs", {})  # data: never weights of its own
            check_model_kwargs(model_kwargs, f"sidecar {str(sidecar_path(ckpt))!r}: model_kwargs",
                               arch=spec.model_name)
            overlay = {**check_sidecar_pretrained_cfg(
                side.get("pretrained_cfg"), f"sidecar {str(sidecar_path(ckpt))!r}: "
                "pretrained_cfg"), "file": ckpt, "num_classes": n}
            kwargs = {"pretrained": True, "num_classes": n, "pretrained_cfg_overlay": overlay,
                      **model_kwargs}
            names, names_from = _class_names(ckpt, n, in1k=bool(
                cfg is not None and str(cfg.tag or "").endswith("in1k")
                and int(cfg.num_classes or 0) == 1000))
            tag = side.get("tag", tag)
            sha = _memo_sha256(ckpt)
        elif allow_random_init:
            kwargs = {"pretrained": False, "num_classes": num_classes or 1000}
            tag = f"{tag}+random_init" if tag else "random_init"  # never passes for weights
        else:  # the name's pretrained weights, from the hub cache (downloaded when allowed)
            cfg = get_pretrained_cfg(spec.model_name)
            n = int(cfg.num_classes or 0) if cfg is not None else 0
            if num_classes is not None and n and n != num_classes:
                raise ValueError(f"the pretrained weights of model {spec.name!r} have a "
                                 f"{n}-class head but the dataset has {num_classes} classes")
            weights = TimmSource.pretrained(spec, True)
            check_checkpoint_file(weights.path)
            sha = weights.sha256  # before the load: the file hashed is the file loaded
            kwargs = {"pretrained": True, "pretrained_cfg_overlay": {"file": weights.path}}
            tag = str(cfg.tag or tag)
        try:
            with tensors_only():  # a pickled weight file never runs code, whatever timm's default
                model = timm.create_model(spec.model_name, **kwargs).eval()
        except (RuntimeError, pickle.UnpicklingError) as err:
            if kwargs.get("pretrained") is not True:
                raise
            where = str(spec.checkpoint or weights.path)
            if "loading state_dict" in str(err):
                raise _load_error(where, spec.model_name, err) from None
            if isinstance(err, pickle.UnpicklingError) or "weights_only" in str(err):
                # a pickled file that is not tensors only (timm >= 1.0.26 says so itself)
                raise CheckpointError(f"checkpoint {where!r} does not load ("
                                      f"{' '.join(str(err).split())[:300]})") from None
            raise
        n = int(kwargs.get("num_classes", getattr(model, "num_classes", n)))
        if weights is not None:
            names = _imagenet_names(n, in1k=tag.endswith("in1k"))
            names_from = "imagenet-1k" if names else ""
        dcfg = DataConfig.from_dict(resolve_model_data_config(model))
        return LoadedModel(model, spec, dcfg, eval_transform(dcfg), n, arch, tag, sha, names,
                           names_from, weights)

    @staticmethod
    def data_config(spec: ModelSpec) -> DataConfig:
        """The preprocessing :meth:`load` gives ``spec``, from the tag's pretrained config and
        a checkpoint's sidecar ``pretrained_cfg`` (:func:`timm_data_config`); the model is not
        built and no weight file is read."""
        TimmSource.check_name(spec.model_name)
        if spec.checkpoint is None:
            return timm_data_config(spec.model_name)
        return timm_data_config(spec.model_name, check_sidecar_pretrained_cfg(
            read_sidecar(spec.checkpoint).get("pretrained_cfg"),
            f"sidecar {str(sidecar_path(spec.checkpoint))!r}: pretrained_cfg"))

    @staticmethod
    def pretrained(spec: ModelSpec, download: bool) -> PretrainedWeights | None:
        """The cached file of the name's pretrained weights, the one timm's own hub mechanism
        (``create_model(name, pretrained=True)``) asks for: the tag's ``hf_hub_id`` in the
        Hugging Face hub cache (``model.safetensors``, else ``pytorch_model.bin``), or its url in
        torch.hub's ``checkpoints`` folder (:func:`~uqvision.models.pretrained_weights`)."""
        TimmSource.check_name(spec.model_name)
        return _timm_pretrained(spec, download)
