"""Models by name: timm (``arch`` or ``arch.tag``) and torchvision (``tv/<name>``).

Where the weights come from, first that applies (docs/conventions.md#v-1b):

1. a local file, ``NAME=FILE`` (or the file a sweep's ``--weights-dir`` holds for the name,
   :func:`uqvision.sweep.find_weights`);
2. with ``allow_random_init`` (code-path checks only), seeded random weights;
3. the name's pretrained weights from the usual caches, downloaded there when absent and the
   network is allowed (:func:`pretrained_weights`): for timm the file timm's own hub mechanism
   asks for (the tag's ``hf_hub_id``: ``model.safetensors``, else ``pytorch_model.bin``) through
   ``huggingface_hub`` in the Hugging Face hub cache (``HF_HUB_CACHE``, ``HF_HOME``), or the
   tag's url in torch.hub's ``checkpoints`` folder (``TORCH_HOME``); for torchvision the
   weights' url in torch.hub's ``checkpoints`` folder, under torchvision's file name (its sha256
   prefix). The environment is read at call time; with ``HF_HUB_OFFLINE`` set nothing is
   downloaded, and a file that is not cached is a
   :class:`~uqvision.exceptions.WeightsUnavailableError` naming the model and the cache folder.

Either way, a file goes through timm's own pretrained mechanism, ``create_model(name,
pretrained=True, pretrained_cfg_overlay=dict(file=...))`` (the hub file located first, so that
the file loaded is the file hashed), so the classifier head is kept and the model's pretrained
config (input size, mean/std, crop) drives the preprocessing; torchvision weights load through
``torchvision.models.get_model(name, weights=...)``. A checkpoint written by ``uqvision train``
has a JSON sidecar (``<checkpoint>.json``) with the preprocessing it was trained with; it is
applied as the same overlay. The sha256 of the file loaded, local or cached, is the model's
``checkpoint_sha256`` (in every cache, compared when a prediction resumes), and where a cached
file came from is recorded beside it (``weights_*`` attrs, :meth:`LoadedModel.provenance`).
"""

from __future__ import annotations

import contextvars
import difflib
import hashlib
import json
import os
import pickle
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import safetensors.torch  # its functions looked up at call time (tests patch them)
import timm
import torch
import torchvision
from huggingface_hub import constants as hf_constants
from huggingface_hub import hf_hub_download, try_to_load_from_cache
from huggingface_hub.utils import EntryNotFoundError
from safetensors import SafetensorError
from timm.data import ImageNetInfo, resolve_model_data_config
from timm.models import get_pretrained_cfg, load_state_dict
from timm.models._builder import _resolve_pretrained_source  # timm's own choice of source
from timm.models._hub import _get_safe_alternatives, download_cached_file, hf_split
from torch import nn
from uqmetrics import InputError
from uqmetrics.io import temporary_beside
from uqmetrics.registry import Registry

from ..data import DataConfig, eval_transform
from ..exceptions import CheckpointError, WeightsUnavailableError
from . import archs as _archs  # noqa: F401  (registers uqvision's timm architectures)

__all__ = [
    "DROPOUT_TYPES",
    "MODEL_SOURCES",
    "LoadedModel",
    "ModelSpec",
    "PretrainedWeights",
    "check_checkpoint_file",
    "check_model_name",
    "check_model_spec",
    "check_pretrained",
    "existing_checkpoint",
    "file_sha256",
    "has_dropout",
    "hub_cache_dir",
    "load_model",
    "locate_pretrained",
    "pretrained_weights",
    "read_sidecar",
    "recorded_class_names",
    "sidecar_path",
    "torch_hub_checkpoints",
    "weights_offline",
    "weights_sha256",
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


@dataclass(frozen=True)
class PretrainedWeights:
    """A model's pretrained weights as a file in a cache (:func:`pretrained_weights`).

    Parameters
    ----------
    source : str
        ``"hf-hub"`` (timm, the Hugging Face hub cache), ``"url"`` (timm, torch.hub's
        ``checkpoints`` folder) or ``"torchvision"`` (torch.hub's ``checkpoints`` folder).
    location : str
        The hub repository (``timm/resnet50.a1_in1k``, with ``@revision`` when the tag names
        one) or the url.
    filename : str
        The file's name in the repository, or in the ``checkpoints`` folder.
    revision : str
        The hub commit the cached file belongs to (its snapshot folder); ``""`` for a url.
    path : str
        The local file.
    """

    source: str
    location: str
    filename: str
    revision: str
    path: str

    @property
    def sha256(self) -> str:
        """The file's SHA-256 (hashed once per process while the file is unchanged)."""
        return _memo_sha256(self.path)

    def attrs(self) -> dict[str, str]:
        """``weights_source``, ``weights_location``, ``weights_revision``, ``weights_file``."""
        return {"weights_source": self.source, "weights_location": self.location,
                "weights_revision": self.revision, "weights_file": self.path}


@dataclass
class LoadedModel:
    """A model in eval mode with everything needed to run it and record its provenance.

    ``class_names`` (shape (num_classes,)) are the names of the model's outputs when they are
    known, from ``class_names_source``: the checkpoint's sidecar (``"sidecar"``; what
    ``uqvision train`` writes) or, for a checkpoint (or the pretrained weights) of an
    ImageNet-1k model whose sidecar names none, the 1,000 WordNet ids in timm's order
    (``"imagenet-1k"``); ``None`` otherwise. ``checkpoint_sha256`` is the SHA-256 of the weight
    file loaded (the local checkpoint, or the cached pretrained file ``weights`` names); ``""``
    for random weights.
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
        :class:`PretrainedWeights` source, with its location, revision and file)."""
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


def file_sha256(path: str | os.PathLike, *, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


#: ``(real path, device, inode, size, mtime_ns, ctime_ns) -> sha256`` of weight files hashed in
#: this process (:func:`_memo_sha256`).
_SHA_MEMO: dict[tuple, str] = {}

#: A file changed less than this many seconds before it was hashed is hashed again next time:
#: a rewrite within the file system's timestamp granularity could keep its stat.
_RACY_S = 2.0


def _memo_sha256(path: str | os.PathLike) -> str:
    """:func:`file_sha256` of a weight file, hashed once per process while its stat (inode,
    size, modification and change times) is unchanged, so that the checks before a run and the
    load itself read a large file once. A file modified within :data:`_RACY_S` seconds of
    being hashed is not remembered (git's "racily clean" rule)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key in _SHA_MEMO:
        return _SHA_MEMO[key]
    sha = file_sha256(real)
    if time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > _RACY_S:
        _SHA_MEMO[key] = sha
    return sha


def _true(value: str | None) -> bool:
    """huggingface_hub's reading of a boolean environment variable."""
    return (value or "").upper() in {"1", "ON", "YES", "TRUE"}


def hub_cache_dir() -> str:
    """The Hugging Face hub cache folder as the environment gives it now.

    ``huggingface_hub.constants.HF_HUB_CACHE`` by huggingface_hub's own rule (``HF_HUB_CACHE``,
    else the legacy ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, ``HF_HOME`` defaulting
    to ``$XDG_CACHE_HOME/huggingface``, that to ``~/.cache/huggingface``), read at call time
    (huggingface_hub reads it once, at import) and passed to it as ``cache_dir``.
    """
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    home = os.path.expandvars(os.path.expanduser(home))
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home,
                                                                                        "hub")
    return os.path.expandvars(os.path.expanduser(cache))


def weights_offline() -> bool:
    """True when no weights may be downloaded: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``)
    set now, or when huggingface_hub was imported (its own switch). It holds back every source
    of pretrained weights: the hub, timm's urls and torchvision's."""
    env = os.environ
    return _true(env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE")) or bool(
        hf_constants.HF_HUB_OFFLINE)


def torch_hub_checkpoints() -> Path:
    """torch.hub's weight cache, ``torch.hub.get_dir()/checkpoints`` (``$TORCH_HOME/hub/
    checkpoints``; ``TORCH_HOME`` read at call time), where timm's url weights and torchvision's
    weights are kept."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def _unavailable(spec_name: str, what: str, cache: str | os.PathLike, why: str,
                 env: str = "TORCH_HOME") -> WeightsUnavailableError:
    """One line naming the model, the file, why, the cache folder and the ways out."""
    return WeightsUnavailableError(
        f"model {spec_name!r}: its pretrained weights ({what}) {why}; cache directory "
        f"{str(cache)!r}; fetch them where the network is allowed (or point {env} at a cache "
        "that holds them), or give a local file as NAME=FILE or with --weights-dir")


_HUB_ENV = "HF_HUB_CACHE or HF_HOME"


def _offline_why() -> str:
    return "are not in the cache and HF_HUB_OFFLINE is set"


def _one_line(err: BaseException) -> str:
    return (" ".join(str(err).split())[:300] or type(err).__name__)


def _timm_pretrained(spec: ModelSpec, download: bool) -> PretrainedWeights | None:
    """The cached file of a timm name's pretrained weights, located as timm locates it."""
    cfg = get_pretrained_cfg(spec.model_name)
    load_from, loc = _resolve_pretrained_source(cfg.to_dict()) if cfg is not None else ("", "")
    if load_from == "hf-hub":
        repo, filename = loc if isinstance(loc, (list, tuple)) else (loc, "pytorch_model.bin")
        repo_id, revision = hf_split(repo)
        # timm's order (timm.models._hub.load_state_dict_from_hf): a safetensors file first
        names = ([filename] if filename.endswith(".safetensors")
                 else [*_get_safe_alternatives(filename), filename])
        cache, offline = hub_cache_dir(), weights_offline()
        what = f"{' or '.join(names)} of hub repository {repo!r}"
        if not download and (not offline or _LOCATE_ONLY.get()):  # what the cache holds
            for name in names:
                found = try_to_load_from_cache(repo_id, name, cache_dir=cache, revision=revision)
                if isinstance(found, str):
                    return _hub_weights(repo, name, found)
            return None
        last: BaseException | None = None
        for name in names:
            try:
                path = hf_hub_download(repo_id, name, revision=revision, cache_dir=cache,
                                       local_files_only=offline)
            except EntryNotFoundError as err:  # not there (or not cached): timm's next file
                last = err
                continue
            except (OSError, ValueError) as err:  # no repository, no network, ...
                raise _unavailable(spec.name, what, cache, f"could not be fetched ({_one_line(err)})",
                                   _HUB_ENV) from None
            return _hub_weights(repo, name, path)
        raise _unavailable(spec.name, what, cache, _offline_why() if offline else
                           f"could not be fetched ({_one_line(last)})", _HUB_ENV) from None
    if load_from == "url":
        return _url_weights(spec.name, "url", str(loc), download,
                            lambda: download_cached_file(str(loc), check_hash=True))
    raise WeightsUnavailableError(
        f"model {spec.name!r} has no pretrained weights in timm (its pretrained config names no "
        f"hub repository or url); give a local file as NAME=FILE or with --weights-dir")


def _hub_weights(repo: str, filename: str, path: str) -> PretrainedWeights:
    parts = Path(path).parts
    revision = parts[parts.index("snapshots") + 1] if "snapshots" in parts[:-1] else ""
    return PretrainedWeights("hf-hub", repo, filename, revision, str(path))


def _url_weights(spec_name: str, source: str, url: str, download: bool,
                 fetch: Callable[[], Any]) -> PretrainedWeights | None:
    """A url's file in torch.hub's ``checkpoints`` folder (``fetch`` downloads it there)."""
    folder = torch_hub_checkpoints()
    filename = os.path.basename(urlparse(url).path)
    path = folder / filename
    if not path.is_file():
        if weights_offline() and not _LOCATE_ONLY.get():
            raise _unavailable(spec_name, f"{filename} from {url}", folder, _offline_why())
        if not download:
            return None
        try:
            fetch()
        except (OSError, RuntimeError) as err:  # URLError, hash mismatch, ...
            raise _unavailable(spec_name, f"{filename} from {url}", folder,
                               f"could not be downloaded ({_one_line(err)})") from None
    return PretrainedWeights(source, url, filename, "", str(path))


def pretrained_weights(spec: ModelSpec | str, *, download: bool = True
                       ) -> PretrainedWeights | None:
    """Locate (and with ``download``, fetch) the pretrained weights of a model name.

    timm names: the file timm's own hub mechanism asks for (the tag's ``hf_hub_id``, or its
    url); torchvision names: the weights' url file (:class:`TorchvisionSource`). The
    environment is read now: the Hugging Face hub cache :func:`hub_cache_dir`, torch.hub's
    :func:`torch_hub_checkpoints`, :func:`weights_offline`.

    Parameters
    ----------
    spec : ModelSpec or str
        A name without a checkpoint (``NAME=FILE`` is not looked up).
    download : bool, default True
        Fetch a file that is not cached (unless offline). ``False``: only look in the caches,
        and return ``None`` for a file that is not there (when offline it is an error).

    Returns
    -------
    PretrainedWeights or None

    Raises
    ------
    uqvision.exceptions.WeightsUnavailableError
        Offline and not cached, a download that failed, or a name with no pretrained source;
        the message names the model and the cache directory.
    ValueError
        An unknown name, or a model source with no pretrained weights (``proto``).
    """
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    check_model_name(spec.name)
    find = getattr(MODEL_SOURCES[spec.source], "pretrained", None)
    if find is None:
        raise ValueError(f"model source {spec.source!r} of {spec.name!r} has no pretrained "
                         "weights: give a checkpoint as NAME=FILE")
    return find(spec, download)


#: Set by :func:`locate_pretrained`: a look in the caches that returns ``None`` for a file
#: that is not cached, offline or not (:func:`pretrained_weights` with ``download=False``
#: raises for it when offline).
_LOCATE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("_LOCATE_ONLY",
                                                                    default=False)


def locate_pretrained(spec: ModelSpec | str) -> PretrainedWeights | None:
    """Where the pretrained weights of a name are cached, from the caches alone.

    No network and no download, whatever ``HF_HUB_OFFLINE`` says: the file timm's or
    torchvision's mechanism would load (:func:`pretrained_weights`), found in the Hugging Face
    hub cache (``huggingface_hub.try_to_load_from_cache``) or torch.hub's ``checkpoints``
    folder, or ``None`` when it is not there. A sweep calls it for every model before anything
    runs (:func:`uqvision.sweep.check_weights`).

    Parameters
    ----------
    spec : ModelSpec or str
        A name without a checkpoint.

    Returns
    -------
    PretrainedWeights or None

    Raises
    ------
    uqvision.exceptions.WeightsUnavailableError
        A name with no pretrained weights at all (its pretrained config names no hub
        repository or url; a torchvision architecture without weights).
    ValueError
        An unknown name, or a model source with no pretrained weights.
    """
    token = _LOCATE_ONLY.set(True)
    try:
        return pretrained_weights(spec, download=False)
    finally:
        _LOCATE_ONLY.reset(token)


def check_pretrained(spec: ModelSpec | str, *, allow_random_init: bool = False) -> None:
    """Before anything runs: raise when :func:`load_model` could not have the pretrained
    weights of ``spec`` from the caches while offline.

    Cheap (a look in the caches, no hashing, no network). Nothing to check for a checkpoint
    (:func:`check_model_spec` checks it), for random weights, or for a source without
    pretrained weights (its loader says what it needs); a file that is not cached while the
    network is allowed is left to the load, which downloads it.

    Raises
    ------
    uqvision.exceptions.WeightsUnavailableError
        As :func:`pretrained_weights`.
    """
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    if spec.checkpoint is None and not allow_random_init and spec.source in MODEL_SOURCES \
            and hasattr(MODEL_SOURCES[spec.source], "pretrained"):
        pretrained_weights(spec, download=False)


def weights_sha256(spec: ModelSpec | str, *, allow_random_init: bool = False) -> str:
    """The SHA-256 of the weights :func:`load_model` loads for ``spec`` (its
    ``checkpoint_sha256``), without building the model: the checkpoint's (``""`` when it does
    not exist), ``""`` for random weights, else the pretrained file's (fetched when it is not
    cached, as loading would; :func:`pretrained_weights`). Each file is hashed once per process
    while it is unchanged."""
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    if spec.checkpoint is not None:
        return _memo_sha256(spec.checkpoint) if Path(spec.checkpoint).is_file() else ""
    if allow_random_init:
        return ""
    found = pretrained_weights(spec, download=True)
    return found.sha256 if found is not None else ""


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


def _tensor_shapes(ckpt: str) -> dict[str, torch.Tensor]:
    """A weight file's tensors for the head and architecture checks: shape-only ``meta``
    tensors from a safetensors file's header (its data are read once, by the load itself);
    other formats read whole (:func:`_read_state`)."""
    if not str(ckpt).endswith(".safetensors"):  # timm's own test of the format
        return _read_state(ckpt)
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
    """timm models: ``arch`` or ``arch.tag`` (``arch``: its default tag); weights through
    ``pretrained_cfg_overlay``: a local file, or the tag's pretrained file from the hub cache
    (:meth:`pretrained`)."""

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
            overlay = {**side.get("pretrained_cfg", {}), "file": ckpt, "num_classes": n}
            kwargs = {"pretrained": True, "num_classes": n, "pretrained_cfg_overlay": overlay,
                      **side.get("model_kwargs", {})}
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
            model = timm.create_model(spec.model_name, **kwargs).eval()
        except RuntimeError as err:
            if kwargs.get("pretrained") is not True or "loading state_dict" not in str(err):
                raise
            raise _load_error(str(spec.checkpoint or weights.path), spec.model_name,
                              err) from None
        n = int(kwargs.get("num_classes", getattr(model, "num_classes", n)))
        if weights is not None:
            names = _imagenet_names(n, in1k=tag.endswith("in1k"))
            names_from = "imagenet-1k" if names else ""
        dcfg = DataConfig.from_dict(resolve_model_data_config(model))
        return LoadedModel(model, spec, dcfg, eval_transform(dcfg), n, arch, tag, sha, names,
                           names_from, weights)

    @staticmethod
    def pretrained(spec: ModelSpec, download: bool) -> PretrainedWeights | None:
        """The cached file of the name's pretrained weights, the one timm's own hub mechanism
        (``create_model(name, pretrained=True)``) asks for: the tag's ``hf_hub_id`` in the
        Hugging Face hub cache (``model.safetensors``, else ``pytorch_model.bin``), or its url in
        torch.hub's ``checkpoints`` folder (:func:`pretrained_weights`)."""
        TimmSource.check_name(spec.model_name)
        return _timm_pretrained(spec, download)


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
    """torchvision models ``tv/<name>[.<WEIGHTS>]``; weights from a local state-dict file, or
    the weights named (or ``DEFAULT``) from torch.hub's cache (:meth:`pretrained`).

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
                model = torchvision.models.get_model(name, weights=weights, progress=False)
            except (OSError, RuntimeError) as err:  # URLError, a hash mismatch, a bad file
                raise _unavailable(spec.name, f"{weights.url.rsplit('/', 1)[-1]} from "
                                   f"{weights.url}", torch_hub_checkpoints(),
                                   f"could not be downloaded or loaded ({_one_line(err)})"
                                   ) from None
            if found is None:  # downloaded just now, by torchvision
                found = TorchvisionSource.pretrained(spec, False)
                sha = found.sha256
            names = _imagenet_names(n, in1k=weights.name.startswith("IMAGENET1K"))
            names_from = "imagenet-1k" if names else ""
            return LoadedModel(model.eval(), spec, dcfg, transform, n, name, tag, sha, names,
                               names_from, found)
        return LoadedModel(model.eval(), spec, dcfg, transform, n, name, tag, sha, names,
                           names_from)

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
                            lambda: weights.get_state_dict(progress=False, check_hash=True))


def load_model(spec: ModelSpec | str, *, num_classes: int | None = None, device: str = "cpu",
               allow_random_init: bool = False, seed: int = 0) -> LoadedModel:
    """Build a model from its spec, load its weights, move it to ``device``, eval mode.

    The weights: the checkpoint of ``NAME=CHECKPOINT``; else, with ``allow_random_init``,
    random ones; else the name's pretrained weights from the Hugging Face hub cache (timm) or
    torch.hub's cache (torchvision), downloaded there by huggingface_hub / torchvision when
    absent unless ``HF_HUB_OFFLINE`` is set (:func:`pretrained_weights`; the module docstring).
    The SHA-256 of the file loaded is ``checkpoint_sha256``.

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
    if isinstance(spec, str):
        spec = ModelSpec.parse(spec)
    if spec.source not in MODEL_SOURCES:
        check_model_name(spec.name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        loaded = MODEL_SOURCES[spec.source].load(spec, num_classes, allow_random_init)
    loaded.model.to(device)
    return loaded

