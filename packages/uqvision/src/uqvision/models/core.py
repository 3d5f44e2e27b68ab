"""Models by name: timm (``arch`` or ``arch.tag``) and torchvision (``tv/<name>``).

Weights only ever come from local files (no downloads). For timm the file goes through timm's
own pretrained mechanism, ``create_model(name, pretrained=True,
pretrained_cfg_overlay=dict(file=...))``, so the classifier head is kept and the model's
pretrained config (input size, mean/std, crop) drives the preprocessing. A checkpoint written by
``uqvision train`` has a JSON sidecar (``<checkpoint>.json``) with the preprocessing it was
trained with; it is applied as the same overlay.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch  # its functions looked up at call time (tests patch them)
import timm
import torch
import torchvision
from safetensors import SafetensorError
from timm.data import ImageNetInfo, resolve_model_data_config
from timm.models import get_pretrained_cfg, load_state_dict
from torch import nn
from uqmetrics import InputError
from uqmetrics.io import temporary_beside
from uqmetrics.registry import Registry

from ..data import DataConfig, eval_transform
from ..exceptions import CheckpointError
from . import archs as _archs  # noqa: F401  (registers uqvision's timm architectures)

__all__ = [
    "DROPOUT_TYPES",
    "MODEL_SOURCES",
    "LoadedModel",
    "ModelSpec",
    "check_checkpoint_file",
    "check_model_name",
    "check_model_spec",
    "existing_checkpoint",
    "file_sha256",
    "has_dropout",
    "load_model",
    "read_sidecar",
    "recorded_class_names",
    "sidecar_path",
    "write_checkpoint",
]

DROPOUT_TYPES: tuple[type[nn.Module], ...] = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


@dataclass(frozen=True)
class ModelSpec:
    """Which model to run.

    Parameters
    ----------
    name : str
        A timm name, ``arch`` or ``arch.tag`` (e.g. ``resnet50.a1_in1k``), or ``tv/<name>`` for a
        torchvision model (e.g. ``tv/mobilenet_v3_small``).
    checkpoint : path, optional
        Local weights (``.safetensors``/``.pth``/``.bin``), head included.
    label : str, optional
        The row name in results; default ``name`` or ``name@<checkpoint stem>``.
    """

    name: str
    checkpoint: str | None = None
    label: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Parse ``NAME`` or ``NAME=CHECKPOINT`` (the CLI syntax)."""
        name, _, ckpt = text.partition("=")
        return cls(name.strip(), ckpt.strip() or None)

    @property
    def source(self) -> str:
        return self.name.split("/", 1)[0] if "/" in self.name else "timm"

    @property
    def model_name(self) -> str:
        return self.name.split("/", 1)[1] if "/" in self.name else self.name

    @property
    def row(self) -> str:
        if self.label:
            return self.label
        return self.name if self.checkpoint is None else f"{self.name}@{Path(self.checkpoint).stem}"


@dataclass
class LoadedModel:
    """A model in eval mode with everything needed to run it and record its provenance.

    ``class_names`` (shape (num_classes,)) are the names of the model's outputs when they are
    known, from ``class_names_source``: the checkpoint's sidecar (``"sidecar"``; what
    ``uqvision train`` writes) or, for a checkpoint of an ImageNet-1k model whose sidecar names
    none, the 1,000 WordNet ids in timm's order (``"imagenet-1k"``); ``None`` otherwise.
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

    def provenance(self) -> dict[str, Any]:
        """netCDF-safe attrs describing the model."""
        return {"model": self.spec.row, "model_name": self.spec.name, "source": self.spec.source,
                "architecture": self.architecture, "tag": self.tag,
                "checkpoint": str(self.spec.checkpoint or ""),
                "checkpoint_sha256": self.checkpoint_sha256,
                "data_config": json.dumps(self.data_config.to_dict()),
                "transform": repr(self.transform),
                "num_params": int(sum(p.numel() for p in self.model.parameters())),
                "has_dropout": int(has_dropout(self.model))}


def file_sha256(path: str | os.PathLike, *, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sidecar_path(checkpoint: str | os.PathLike) -> Path:
    """``model.safetensors`` -> ``model.json`` (written by ``uqvision train``)."""
    return Path(checkpoint).with_suffix(".json")


def write_checkpoint(model: nn.Module, path: str | os.PathLike, sidecar: dict[str, Any]) -> Path:
    """Write ``model``'s state dict to ``path`` (``.safetensors``) and ``sidecar`` (JSON) beside
    it, each atomically (the sidecar first: a checkpoint never exists without it)."""
    path = Path(path)
    side = sidecar_path(path)
    with temporary_beside(side) as tmp:
        tmp.write_text(json.dumps(sidecar, indent=1))
        os.replace(tmp, side)
    with temporary_beside(path) as tmp:
        safetensors.torch.save_file(
            {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp))
        os.replace(tmp, path)
    return path


def existing_checkpoint(spec: ModelSpec) -> str:
    """``spec.checkpoint`` as a string, checked by :func:`check_checkpoint_file`;
    ``FileNotFoundError`` when the file does not exist."""
    ckpt = str(spec.checkpoint)
    if not Path(ckpt).is_file():
        raise FileNotFoundError(f"checkpoint {ckpt!r} does not exist")
    check_checkpoint_file(ckpt)
    return ckpt


def _safetensors_problem(path: Path) -> str | None:
    """What is wrong with a ``.safetensors`` file's layout (its header and size), or None."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"not a safetensors file ({size} bytes, shorter than its header)"
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return "not a safetensors file (no header of the length its first 8 bytes give)"
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "not a safetensors file (its header is not a safetensors JSON header)"
    need = 8 + n + max(ends, default=0)
    if size < need:
        return f"truncated ({size} bytes; its header lists tensors up to byte {need})"
    return None


def check_checkpoint_file(path: str | os.PathLike) -> None:
    """Check that a weight file is what its suffix says, without loading its tensors.

    A ``.safetensors`` file must have a safetensors header and be as long as the tensors its
    header lists (a truncated copy is not); any other file must be a PyTorch file (``torch.save``:
    a zip archive, whose directory is at its end, or a legacy pickle).

    Raises
    ------
    uqvision.exceptions.CheckpointError
        The message names the file and what is wrong with it.
    """
    p = Path(path)
    if p.suffix == ".safetensors":
        why = _safetensors_problem(p)
    else:
        with open(p, "rb") as f:
            first = f.read(2)
        why = None if zipfile.is_zipfile(p) or first[:1] == b"\x80" else (
            "empty file" if not first else
            "not a PyTorch weight file (neither a zip archive of torch.save nor a pickle; a "
            "truncated copy?)")
    if why:
        raise CheckpointError(f"checkpoint {str(p)!r}: {why}")


#: Sidecar keys a run trained by ``uqvision train`` (a sidecar with a ``method``) needs, and
#: their JSON types.
_RUN_KEYS = {"architecture": str, "num_classes": int, "pretrained_cfg": dict, "hparams": dict,
             "state_meta": dict}


def read_sidecar(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The sidecar of a checkpoint, or ``{}`` when it has none.

    Raises
    ------
    uqvision.exceptions.CheckpointError
        The sidecar is not a JSON object, or the sidecar of a trained run lacks a field it
        needs (the message names the file).
    """
    p = sidecar_path(checkpoint)
    if not p.is_file():
        return {}
    try:
        side = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"sidecar {str(p)!r} of checkpoint {str(checkpoint)!r} is not "
                              f"valid JSON ({err})") from None
    if not isinstance(side, dict):
        raise CheckpointError(f"sidecar {str(p)!r} of checkpoint {str(checkpoint)!r} holds a "
                              f"JSON {type(side).__name__}, not an object")
    if "method" in side:
        bad = [k for k, kind in _RUN_KEYS.items() if not isinstance(side.get(k), kind)]
        if bad:
            raise CheckpointError(f"sidecar {str(p)!r} of checkpoint {str(checkpoint)!r} names a "
                                  f"training method but lacks valid {bad} (damaged?)")
    return side


def recorded_class_names(checkpoint: str | os.PathLike | None) -> tuple[str, ...] | None:
    """The class names a checkpoint's sidecar records (``"classes"``, in the order of the
    model's outputs), or ``None`` when it has no sidecar or the sidecar names none.

    Cheap (reads the JSON sidecar only): call it before a model is built. A sidecar may be
    written by hand for a checkpoint uqvision did not train: ``{"classes": ["n01440764",
    ...]}``.

    Raises
    ------
    uqmetrics.InputError
        ``"classes"`` is not a list of distinct strings, or its length differs from the
        sidecar's ``"num_classes"``.
    """
    if checkpoint is None:
        return None
    side = read_sidecar(checkpoint)
    names = side.get("classes")
    if names is None:
        return None
    where = f"sidecar {str(sidecar_path(checkpoint))!r}"
    if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
        raise InputError(f"{where}: 'classes' must be a list of class names, got "
                         f"{type(names).__name__}")
    if len(set(names)) != len(names):
        raise InputError(f"{where}: 'classes' names a class more than once")
    if "num_classes" in side and int(side["num_classes"]) != len(names):
        raise InputError(f"{where}: 'classes' names {len(names)} classes but 'num_classes' is "
                         f"{side['num_classes']}")
    return tuple(names)


def _imagenet_names(n: int, in1k: bool) -> tuple[str, ...] | None:
    """The ImageNet-1k WordNet ids in timm's order (sorted, the folder order every ImageNet-1k
    checkpoint uses) for a 1,000-class head of a model whose weights say ImageNet-1k."""
    if n != 1000 or not in1k:
        return None

    return tuple(ImageNetInfo("imagenet-1k").label_names())


def _class_names(ckpt: str, n: int, in1k: bool) -> tuple[tuple[str, ...] | None, str]:
    """``(class names, where they come from)`` of a loaded checkpoint with an ``n``-class head."""
    names = recorded_class_names(ckpt)
    if names is not None:
        if len(names) != n:
            raise InputError(f"sidecar {str(sidecar_path(ckpt))!r} names {len(names)} classes but "
                             f"checkpoint {ckpt!r} has a {n}-class head")
        return names, "sidecar"
    names = _imagenet_names(n, in1k)
    return names, ("imagenet-1k" if names else "")


def _suggest(name: str, candidates: list[str]) -> str:
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
    for ``NAME=CHECKPOINT`` a weight file (:func:`check_checkpoint_file`), a readable sidecar,
    and a name that agrees with the architecture the sidecar records.

    Cheap (registry look-ups, the file's header and the JSON sidecar).

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
    """
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
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
    return spec


def _other_architecture(ckpt: str, name: str, expected: Any, got: Any) -> str | None:
    """A message when the state dict ``got`` is not one of the model ``name`` (whose state dict
    keys are ``expected``), else None."""
    expected, got = set(expected), set(got)
    missing, foreign = sorted(expected - got), sorted(got - expected)
    if not missing and not foreign:
        return None
    return (f"checkpoint {ckpt!r} does not hold {name!r} weights: {len(missing)} of the model's "
            f"{len(expected)} tensors are missing" + (f" (e.g. {missing[0]!r})" if missing else "")
            + f" and {len(foreign)} are not the model's"
            + (f" (e.g. {foreign[0]!r})" if foreign else "")
            + "; was it trained with another architecture? Give that one as NAME")


def _timm_mismatch(ckpt: str, name: str, state: dict, kwargs: dict) -> str | None:
    """:func:`_other_architecture` of a timm model (built on the CPU to read its keys)."""
    try:
        with torch.random.fork_rng(devices=[]):
            probe = timm.create_model(name, **kwargs)
    except Exception:  # noqa: BLE001  (an explanation only; the caller raises anyway)
        return None
    return _other_architecture(ckpt, name, probe.state_dict(), state)


def _read_state(ckpt: str) -> dict[str, torch.Tensor]:
    """timm's ``load_state_dict`` of a weight file; a file that does not load is a
    :class:`~uqvision.exceptions.CheckpointError` naming it."""
    try:
        return load_state_dict(ckpt)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError,
            zipfile.BadZipFile, SafetensorError) as err:
        text = " ".join(str(err).split())[:300] or type(err).__name__
        raise CheckpointError(f"checkpoint {ckpt!r} does not load ({text})") from None


def _load_error(ckpt: str, name: str, err: RuntimeError) -> CheckpointError:
    """torch's multi-line ``Error(s) in loading state_dict`` as one line naming the file."""
    lines = [" ".join(line.split()) for line in str(err).splitlines() if line.strip()]
    return CheckpointError(f"checkpoint {ckpt!r} does not fit model {name!r}: "
                           + "; ".join(lines)[:400])


def has_dropout(model: nn.Module) -> bool:
    """True when ``model`` has a dropout module with p > 0 (MC dropout is possible)."""
    return any(isinstance(m, DROPOUT_TYPES) and m.p > 0 for m in model.modules())


_COMMON_HEADS = ("fc", "head", "head.fc", "classifier", "last_linear")


def _classifier_keys(classifier: Any) -> list[str]:
    names = [classifier] if isinstance(classifier, str) else list(classifier or _COMMON_HEADS)
    return [f"{n}.weight" for n in names]


def _check_head(state_dict: dict, keys: list[str], num_classes: int | None, ckpt: str) -> int:
    """Class count of a checkpoint's head; raise if it differs from ``num_classes``."""
    found = [k for k in keys if k in state_dict]
    if not found:
        raise ValueError(f"checkpoint {ckpt!r} has no classifier weight {keys}; "
                         "uqvision needs checkpoints with their classification head")
    n = int(state_dict[found[0]].shape[0])
    if num_classes is not None and n != num_classes:
        raise ValueError(
            f"checkpoint {ckpt!r} has a {n}-class head ({found[0]} of shape "
            f"{tuple(state_dict[found[0]].shape)}) but the dataset has {num_classes} classes")
    return n


#: Model sources: prefix -> object with ``check_name(name)`` and ``load(spec, num_classes,
#: allow_random_init)``. A name without ``<prefix>/`` is a timm name.
MODEL_SOURCES: Registry[Any] = Registry("model source")


@MODEL_SOURCES.register(name="timm")
class TimmSource:
    """timm models: ``arch`` or ``arch.tag``; weights through ``pretrained_cfg_overlay``."""

    @staticmethod
    def check_name(name: str) -> None:
        arch, _, tag = name.partition(".")
        if not timm.is_model(arch):
            raise ValueError(f"unknown timm model {name!r}"
                             + _suggest(name, timm.list_models() + timm.list_pretrained()))
        if tag and name not in timm.list_pretrained(name):
            raise ValueError(f"unknown pretrained tag {tag!r} for timm model {arch!r}"
                             + _suggest(name, timm.list_pretrained(f"{arch}.*")))

    @staticmethod
    def load(spec: ModelSpec, num_classes: int | None, allow_random_init: bool) -> LoadedModel:
        TimmSource.check_name(spec.model_name)
        arch, _, tag = spec.model_name.partition(".")
        kwargs: dict[str, Any] = {}
        sha = ""
        names, names_from = None, ""
        if spec.checkpoint is not None:
            ckpt = existing_checkpoint(spec)
            side = read_sidecar(ckpt)
            cfg = get_pretrained_cfg(spec.model_name)
            keys = _classifier_keys(cfg.classifier if cfg is not None else None)
            state = _read_state(ckpt)
            try:
                n = _check_head(state, keys, num_classes, ckpt)
            except ValueError:
                why = _timm_mismatch(ckpt, spec.model_name, state, side.get("model_kwargs", {}))
                if why:
                    raise CheckpointError(why) from None
                raise
            overlay = {**side.get("pretrained_cfg", {}), "file": ckpt, "num_classes": n}
            kwargs = {"pretrained": True, "num_classes": n, "pretrained_cfg_overlay": overlay,
                      **side.get("model_kwargs", {})}
            names, names_from = _class_names(ckpt, n, in1k=bool(
                cfg is not None and str(cfg.tag or "").endswith("in1k")
                and int(cfg.num_classes or 0) == 1000))
            tag = side.get("tag", tag)
            sha = file_sha256(ckpt)
        elif allow_random_init:
            kwargs = {"pretrained": False, "num_classes": num_classes or 1000}
            tag = f"{tag}+random_init" if tag else "random_init"  # never passes for weights
        else:
            raise ValueError(f"model {spec.name!r} has no local checkpoint; pretrained downloads are "
                             "disabled (pass a checkpoint file, or allow random init for tests)")
        try:
            model = timm.create_model(spec.model_name, **kwargs).eval()
        except RuntimeError as err:
            if spec.checkpoint is None or "loading state_dict" not in str(err):
                raise
            raise _load_error(str(spec.checkpoint), spec.model_name, err) from None
        dcfg = DataConfig.from_dict(resolve_model_data_config(model))
        return LoadedModel(model, spec, dcfg, eval_transform(dcfg), kwargs["num_classes"], arch,
                           tag, sha, names, names_from)


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


@MODEL_SOURCES.register(name="tv")
class TorchvisionSource:
    """torchvision models ``tv/<name>[.<WEIGHTS>]``; weights from a local state-dict file.

    The preprocessing is that of the weights enum member named (``tv/resnet50.IMAGENET1K_V1``:
    resize 256, crop 224; ``.IMAGENET1K_V2``: resize 232), or of the architecture's ``DEFAULT``
    member when none is named; the member is the model's tag and its transform is recorded in
    every cache (docs/conventions.md#v-1). A checkpoint written by ``uqvision train`` keeps its own
    sidecar preprocessing.
    """

    @staticmethod
    def check_name(name: str) -> None:
        _tv_weights(name)

    @staticmethod
    def load(spec: ModelSpec, num_classes: int | None, allow_random_init: bool) -> LoadedModel:
        name, weights = _tv_weights(spec.model_name)
        if weights is not None:  # the reference preprocessing of these weights (no download)
            t = weights.transforms()
            crop, resize = t.crop_size[0], t.resize_size[0]
            dcfg = DataConfig((3, crop, crop), tuple(t.mean), tuple(t.std), crop / resize,
                              t.interpolation.value)
            transform: Callable = t
            tag = weights.name
        else:
            dcfg = DataConfig((3, 224, 224), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
            transform = eval_transform(dcfg)
            tag = ""
        sha = ""
        names, names_from = None, ""
        if spec.checkpoint is not None:
            ckpt = existing_checkpoint(spec)
            state = _read_state(ckpt)
            probe = torchvision.models.get_model(name, weights=None)
            head = [n for n, m in probe.named_modules() if isinstance(m, nn.Linear)][-1]
            try:
                n = _check_head(state, [f"{head}.weight"], num_classes, ckpt)
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
            sha = file_sha256(ckpt)
            names, names_from = _class_names(ckpt, n, in1k=bool(
                weights is not None and weights.name.startswith("IMAGENET1K")))
            tag = side.get("tag", tag or Path(ckpt).stem)
        elif allow_random_init:
            n = num_classes or 1000
            model = torchvision.models.get_model(name, weights=None, num_classes=n)
            tag = f"{tag}+random_init" if tag else "random_init"
        else:
            raise ValueError(f"model {spec.name!r} has no local checkpoint; pretrained downloads are "
                             "disabled (pass a checkpoint file, or allow random init for tests)")
        return LoadedModel(model.eval(), spec, dcfg, transform, n, name, tag, sha, names,
                           names_from)


def load_model(spec: ModelSpec | str, *, num_classes: int | None = None, device: str = "cpu",
               allow_random_init: bool = False, seed: int = 0) -> LoadedModel:
    """Build a model from its spec, load its local weights, move it to ``device``, eval mode.

    Parameters
    ----------
    spec : ModelSpec or str
        ``NAME`` or ``NAME=CHECKPOINT``.
    num_classes : int, optional
        The class count of the data it will see; a checkpoint head of another size raises
        ``ValueError`` before the model is built.
    device : str, default "cpu"
    allow_random_init : bool, default False
        Without a checkpoint, build randomly initialised weights (seeded) instead of raising.
        For exercising the code path only.
    seed : int, default 0
        Seed of a random initialisation.
    """
    if isinstance(spec, str):
        spec = ModelSpec.parse(spec)
    if spec.source not in MODEL_SOURCES:
        check_model_name(spec.name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        loaded = MODEL_SOURCES[spec.source].load(spec, num_classes, allow_random_init)
    loaded.model.to(device)
    return loaded

