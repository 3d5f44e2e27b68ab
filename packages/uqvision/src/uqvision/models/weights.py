"""Pretrained weights by name, from the Hugging Face hub cache and torch.hub's cache.

The file of a name's pretrained weights is, by its source (:class:`~uqvision.models.
PretrainedSource`): for timm the file timm's own hub mechanism asks for (the tag's
``hf_hub_id``: ``model.safetensors``, else ``pytorch_model.bin``) through ``huggingface_hub``
in the Hugging Face hub cache (``HF_HUB_CACHE``, ``HF_HOME``; :func:`hub_cache_dir`), or the
tag's url in torch.hub's ``checkpoints`` folder (``TORCH_HOME``; :func:`torch_hub_checkpoints`);
for torchvision the weights' url in torch.hub's ``checkpoints`` folder, under torchvision's
file name (its sha256 prefix). The environment is read at call time; with ``HF_HUB_OFFLINE``
set nothing is downloaded (:func:`weights_offline`), and a file that is not cached is a
:class:`~uqvision.exceptions.WeightsUnavailableError` naming the model and the cache folder.

Here: the located file (:class:`PretrainedWeights`, :func:`pretrained_weights`), the look in
the caches alone before a run (:func:`locate_pretrained`, :func:`check_pretrained`), and the
SHA-256 of the weights a spec loads (:func:`weights_sha256`). The located file
(:class:`PretrainedWeights`) and the hashing of weight files (:func:`file_sha256`, once per
process while a file is unchanged) are :mod:`uqvision.models.weight_files`'s, re-exported here.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import hf_hub_download, try_to_load_from_cache
from huggingface_hub.utils import EntryNotFoundError
from timm.models._hub import _get_safe_alternatives, hf_split

from ..exceptions import WeightsUnavailableError
from .names import ModelSpec, _spec
from .spec import MODEL_SOURCES, PretrainedSource, check_model_name
from .weight_files import PretrainedWeights, _memo_sha256, file_sha256

__all__ = [
    "PretrainedWeights",
    "check_pretrained",
    "file_sha256",
    "hub_cache_dir",
    "locate_pretrained",
    "pretrained_weights",
    "torch_hub_checkpoints",
    "weights_offline",
    "weights_sha256",
]


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


def _hub_file(spec_name: str, repo: str, filename: str,
              download: bool) -> PretrainedWeights | None:
    """A hub repository's weight file in the Hugging Face hub cache, in timm's order
    (``timm.models._hub.load_state_dict_from_hf``: a safetensors file first), fetched through
    ``huggingface_hub`` with ``download`` (unless offline)."""
    repo_id, revision = hf_split(repo)
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
            raise _unavailable(spec_name, what, cache, f"could not be fetched ({_one_line(err)})",
                               _HUB_ENV) from None
        return _hub_weights(repo, name, path)
    raise _unavailable(spec_name, what, cache, _offline_why() if offline else
                       f"could not be fetched ({_one_line(last)})", _HUB_ENV) from None


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
    url); torchvision names: the weights' url file (:class:`~uqvision.models.sources.
    TorchvisionSource`). The environment is read now: the Hugging Face hub cache
    :func:`hub_cache_dir`, torch.hub's :func:`torch_hub_checkpoints`, :func:`weights_offline`.

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
    spec = _spec(spec)
    check_model_name(spec.name)
    source = MODEL_SOURCES[spec.source]
    find = source.pretrained if isinstance(source, PretrainedSource) else None
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
    """Before anything runs: raise when :func:`~uqvision.models.load_model` could not have the
    pretrained weights of ``spec`` from the caches while offline.

    Cheap (a look in the caches, no hashing, no network). Nothing to check for a checkpoint
    (:func:`~uqvision.models.check_model_spec` checks it), for random weights, or for a source
    without pretrained weights (its loader says what it needs); a file that is not cached while
    the network is allowed is left to the load, which downloads it.

    Raises
    ------
    uqvision.exceptions.WeightsUnavailableError
        As :func:`pretrained_weights`.
    """
    spec = _spec(spec)
    if spec.checkpoint is None and not allow_random_init and spec.source in MODEL_SOURCES \
            and isinstance(MODEL_SOURCES[spec.source], PretrainedSource):
        pretrained_weights(spec, download=False)


def weights_sha256(spec: ModelSpec | str, *, allow_random_init: bool = False) -> str:
    """The SHA-256 of the weights :func:`~uqvision.models.load_model` loads for ``spec`` (its
    ``checkpoint_sha256``), without building the model: the checkpoint's (``""`` when it does
    not exist), ``""`` for random weights, else the pretrained file's (fetched when it is not
    cached, as loading would; :func:`pretrained_weights`). Each file is hashed once per process
    while it is unchanged."""
    spec = _spec(spec)
    if spec.checkpoint is not None:
        return _memo_sha256(spec.checkpoint) if Path(spec.checkpoint).is_file() else ""
    if allow_random_init:
        return ""
    found = pretrained_weights(spec, download=True)
    return found.sha256 if found is not None else ""
