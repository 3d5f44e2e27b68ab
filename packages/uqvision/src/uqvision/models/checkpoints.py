"""Checkpoint files and their JSON sidecars, shared by every model source.

A checkpoint is a weight file (``.safetensors``, or a ``torch.save`` file: ``.pth``/``.bin``)
with its classification head; ``uqvision train`` writes one with a sidecar, ``<checkpoint>.json``
(:func:`sidecar_path`), holding the preprocessing it was trained with (``pretrained_cfg``), its
classes and, for a trained run, its method and hyperparameters. Here:

- writing them (:func:`write_checkpoint`, atomically, the sidecar first);
- the cheap checks before a load (:func:`existing_checkpoint`, :func:`check_checkpoint_file`:
  the file's header and size, no tensors read) and the reading of a sidecar
  (:func:`read_sidecar`, :func:`recorded_class_names`);
- what the sources use while loading one: its tensors (whole, or shape-only from a safetensors
  header), the class count of its head checked against the data's, the names of its outputs,
  and one-line errors naming the file when it does not fit the model.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors.torch  # its functions looked up at call time (tests patch them)
import timm
import torch
from safetensors import SafetensorError
from timm.data import ImageNetInfo
from timm.models import load_state_dict
from torch import nn
from uqmetrics import InputError
from uqmetrics.runs.io import temporary_beside

from ..exceptions import CheckpointError
from .names import ModelSpec

__all__ = [
    "check_checkpoint_file",
    "check_model_kwargs",
    "check_sidecar_pretrained_cfg",
    "existing_checkpoint",
    "read_sidecar",
    "read_state_dict",
    "recorded_class_names",
    "sidecar_path",
    "tensors_only",
    "write_checkpoint",
]


def sidecar_path(checkpoint: str | os.PathLike) -> Path:
    """``model.safetensors`` -> ``model.json`` (written by ``uqvision train``).

    Examples
    --------
    >>> sidecar_path("runs/model.safetensors").as_posix()
    'runs/model.json'
    """
    return Path(checkpoint).with_suffix(".json")


#: ``timm.create_model`` options that fetch or read weights (the hub, a URL, a file) instead of
#: building the network: never in a run's ``model_kwargs``, which its sidecar gives back on
#: loading (a run's weights come from its own checkpoint, or ``init_checkpoint`` at training).
WEIGHT_LOADING_KWARGS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay",
                         "checkpoint_path", "cache_dir")


@contextlib.contextmanager
def tensors_only() -> Iterator[None]:
    """Every ``torch.load`` within reads tensors only (``weights_only=True``), even where the
    caller passes ``weights_only=False``: timm's file and hub loaders before timm 1.0.26, and
    torch.hub's ``load_state_dict_from_url`` (torchvision's pretrained weights), which does so
    to this day. A pickled weight file is data: loading it never runs code. Through torch's
    ``TORCH_FORCE_WEIGHTS_ONLY_LOAD``, set for the duration and restored after."""
    key = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


#: The pretrained-config fields a sidecar may lay over a model's (``uqvision train`` writes
#: these: :meth:`uqvision.data.DataConfig.to_dict`): the preprocessing, nothing that says
#: where weights come from (``file``, ``url``, ``hf_hub_id``, ``source``, ...).
SIDECAR_PRETRAINED_CFG = ("input_size", "mean", "std", "crop_pct", "interpolation",
                          "crop_mode")


def check_sidecar_pretrained_cfg(cfg: Any, where: str) -> dict[str, Any]:
    """A sidecar's ``pretrained_cfg`` (``{}`` without one), refused unless it is an object of
    preprocessing fields (:data:`SIDECAR_PRETRAINED_CFG`): it is laid over the model's
    pretrained config when the model is built, and a sidecar is data, so it never chooses
    where the weights are read from (a hub repository, a URL, another file) nor anything but
    the preprocessing.

    Raises
    ------
    uqmetrics.InputError
        The message starts with ``where`` (the sidecar read) and names the fields refused.
    """
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):
        raise InputError(f"{where} must be an object of preprocessing fields, got {cfg!r:.80}")
    other = sorted(set(cfg) - set(SIDECAR_PRETRAINED_CFG))
    if other:
        raise InputError(f"{where} names {other}, which are not preprocessing fields (it may "
                         f"give {', '.join(SIDECAR_PRETRAINED_CFG)}): a sidecar never says "
                         "where a model's weights are read from")
    return dict(cfg)


def check_model_kwargs(model_kwargs: Any, where: str = "model_kwargs",
                       arch: str | None = None) -> None:
    """Refuse ``model_kwargs`` for ``timm.create_model`` that are not a mapping of keyword
    arguments, or that name an option loading weights (:data:`WEIGHT_LOADING_KWARGS`): a
    sidecar is data, and its kwargs never make a load fetch or read weights of their own.

    With ``arch`` (a timm name, ``arch`` or ``arch.tag``), also a key the model does not take:
    the model is built once with ``model_kwargs`` on the meta device (no memory, no weights;
    :func:`_check_accepted`), and a ``TypeError`` of that build that says
    "unexpected keyword argument" for one of their keys is refused here, before any training
    or prediction, instead of timm's traceback once the data are read. Nothing else is judged
    (a name timm does not know is left to the name's own check).

    Raises
    ------
    uqmetrics.InputError
        The message starts with ``where`` (the option, or the sidecar read) and names the value
        (and the key and the model, for a key the model does not take).
    """
    if not isinstance(model_kwargs, dict) or not all(isinstance(k, str) for k in model_kwargs):
        raise InputError(f"{where} must be an object of keyword arguments for "
                         f"timm.create_model, got {model_kwargs!r}")
    loading = sorted(set(model_kwargs) & set(WEIGHT_LOADING_KWARGS))
    if loading:
        raise InputError(f"{where} {model_kwargs!r} names {loading}, which load weights in "
                         "timm.create_model: a run starts from a checkpoint with --init "
                         "(init_checkpoint) and is read back from its own checkpoint only")
    if arch is not None and model_kwargs and timm.is_model(arch.partition(".")[0]):
        _check_accepted(arch, model_kwargs, where)


#: ``(arch, keys)`` of the ``model_kwargs`` a meta build took (:func:`_check_accepted`): a
#: process checks each key set of a model once (which keys a constructor takes is code, not
#: data: the installed timm's).
_ACCEPTED: set[tuple[str, tuple[str, ...]]] = set()

#: What Python's ``TypeError`` says of a keyword a callable does not take.
_UNEXPECTED = re.compile(r"unexpected keyword argument '([^']+)'")


def _check_accepted(arch: str, model_kwargs: dict[str, Any], where: str) -> None:
    """Build timm's ``arch`` with ``model_kwargs`` on the meta device (``torch.device("meta")``:
    shapes only, nothing allocated or initialised, no weights) and refuse a key it does not
    take: only a ``TypeError`` saying "unexpected keyword argument" for a key of
    ``model_kwargs`` is translated (one line naming ``where``, the key and the model); any
    other error of the build propagates as it is, the one a build on the CPU would raise (each
    of the 1,371 architectures of timm 1.0.31 builds on the meta device with its defaults; one
    that does not, an operation without a meta kernel, is built on the CPU instead: some 40
    architectures of timm before 1.0.30, the test_* ones before 1.0.21)."""
    key = (arch, tuple(sorted(model_kwargs)))
    if key in _ACCEPTED:
        return
    try:
        try:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):
                timm.create_model(arch, **model_kwargs)
        except (NotImplementedError, RuntimeError):  # what an op without a meta kernel raises
            with torch.random.fork_rng(devices=[]), torch.device("cpu"):
                timm.create_model(arch, **model_kwargs)
    except TypeError as err:
        found = _UNEXPECTED.search(str(err))
        if found is None or found.group(1) not in model_kwargs:
            raise
        raise InputError(f"{where} {model_kwargs!r}: timm model {arch!r} takes no keyword "
                         f"argument {found.group(1)!r} ({' '.join(str(err).split())})") from None
    _ACCEPTED.add(key)


def write_checkpoint(model: nn.Module, path: str | os.PathLike, sidecar: dict[str, Any]) -> Path:
    """Write ``model``'s state dict to ``path`` (``.safetensors``) and ``sidecar`` (JSON) beside
    it, each atomically (the sidecar first: a checkpoint never exists without it). A checkpoint
    already at ``path`` is removed first, so that a kill between the two writes leaves no
    checkpoint, never the earlier weights under this sidecar."""
    path = Path(path)
    side = sidecar_path(path)
    path.unlink(missing_ok=True)
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
    ``FileNotFoundError`` when the file does not exist or is a folder (the message says
    which, and names the weight files a folder holds)."""
    ckpt = str(spec.checkpoint)
    if Path(ckpt).is_dir():
        held = sorted(p.name for p in Path(ckpt).iterdir()
                      if p.suffix in (".safetensors", ".pt", ".pth", ".bin") and p.is_file())
        raise FileNotFoundError(
            f"checkpoint {ckpt!r} is a folder, not a checkpoint file; give the weight file"
            + (f" (it holds {', '.join(held[:3])}{', ...' if len(held) > 3 else ''})"
               if held else ""))
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
    checkpoint uses) for a 1,000-class head of a model whose weights say ImageNet-1k; else
    ``None``."""
    if n != 1000 or not in1k:
        return None

    return tuple(ImageNetInfo("imagenet-1k").label_names())


def _class_names(ckpt: str, n: int, in1k: bool) -> tuple[tuple[str, ...] | None, str]:
    """``(class names, where they come from)`` of a loaded checkpoint with an ``n``-class head:
    its sidecar's (``"sidecar"``), else ImageNet-1k's (``"imagenet-1k"``, :func:`_imagenet_names`),
    else ``(None, "")``."""
    names = recorded_class_names(ckpt)
    if names is not None:
        if len(names) != n:
            raise InputError(f"sidecar {str(sidecar_path(ckpt))!r} names {len(names)} classes but "
                             f"checkpoint {ckpt!r} has a {n}-class head")
        return names, "sidecar"
    names = _imagenet_names(n, in1k)
    return names, ("imagenet-1k" if names else "")


#: Classifier modules looked for when the architecture names none.
_COMMON_HEADS = ("fc", "head", "head.fc", "classifier", "last_linear")


def _classifier_keys(classifier: Any) -> list[str]:
    """State-dict keys of a classifier weight: ``["<name>.weight", ...]`` of a module name or
    names (timm's ``pretrained_cfg.classifier``), else of :data:`_COMMON_HEADS`."""
    names = [classifier] if isinstance(classifier, str) else list(classifier or _COMMON_HEADS)
    return [f"{n}.weight" for n in names]


def _check_head(state_dict: dict, keys: list[str], num_classes: int | None, ckpt: str) -> int:
    """Class count of a checkpoint's head (the first of ``keys`` in ``state_dict``, shape
    (n_classes, dim)); raise ``ValueError`` if it differs from ``num_classes`` or is missing."""
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


def read_state_dict(ckpt: str | os.PathLike) -> dict[str, torch.Tensor]:
    """timm's ``load_state_dict`` of a weight file (safetensors, or a pickled ``.pth``/``.bin``),
    tensors only (``weights_only=True``: a pickled file never runs code, whatever timm's
    default, which was ``False`` before timm 1.0.26); a file that does not load is a
    :class:`~uqvision.exceptions.CheckpointError` naming it.

    Parameters
    ----------
    ckpt : path
        The weight file.

    Returns
    -------
    dict of str to torch.Tensor
        The state dict (an EMA copy where the file has one, as timm reads it).
    """
    ckpt = str(ckpt)
    try:
        return load_state_dict(ckpt, weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError,
            zipfile.BadZipFile, SafetensorError) as err:
        text = " ".join(str(err).split())[:300] or type(err).__name__
        raise CheckpointError(f"checkpoint {ckpt!r} does not load ({text})") from None


def _tensor_shapes(ckpt: str) -> dict[str, torch.Tensor]:
    """A weight file's tensors for the head and architecture checks: shape-only ``meta``
    tensors from a safetensors file's header (its data are read once, by the load itself);
    other formats read whole (:func:`read_state_dict`)."""
    if not str(ckpt).endswith(".safetensors"):  # timm's own test of the format
        return read_state_dict(ckpt)
    try:
        with safetensors.safe_open(ckpt, "pt") as f:
            keys = f.keys()  # a safe_open is not iterable
            return {k: torch.empty(f.get_slice(k).get_shape(), device="meta") for k in keys}
    except (OSError, ValueError, SafetensorError) as err:
        text = " ".join(str(err).split())[:300] or type(err).__name__
        raise CheckpointError(f"checkpoint {ckpt!r} does not load ({text})") from None


def _load_error(ckpt: str, name: str, err: RuntimeError) -> CheckpointError:
    """torch's multi-line ``Error(s) in loading state_dict`` as one line naming the file."""
    lines = [" ".join(line.split()) for line in str(err).splitlines() if line.strip()]
    return CheckpointError(f"checkpoint {ckpt!r} does not fit model {name!r}: "
                           + "; ".join(lines)[:400])
