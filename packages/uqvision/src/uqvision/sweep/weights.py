"""Every model's weights, looked up before the first cell is submitted, with no network
(:func:`check_weights`, :func:`weights_status`: a local file, random weights, the hub /
torch.hub caches) but one short request (:func:`probe_hub`) when some must be downloaded; and
the local file a weights folder holds for a model (:func:`find_weights`).
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants as hf_constants

from ..models import (
    MODEL_SOURCES,
    ModelSpec,
    existing_checkpoint,
    hub_cache_dir,
    locate_pretrained,
    pretrained_weights,
    torch_hub_checkpoints,
    weights_offline,
)
from ..predict import PredictConfig

__all__ = [
    "PROBE_TIMEOUT",
    "WEIGHT_SUFFIXES",
    "WeightsStatus",
    "check_weights",
    "find_weights",
    "probe_hub",
    "weights_status",
]


#: Seconds the one network probe of a sweep waits for the hub (:func:`probe_hub`).
PROBE_TIMEOUT = 5.0


#: Weight-file suffixes looked up in a weights folder, in order.
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pth.tar", ".bin")


def find_weights(spec: ModelSpec, weights_dir: str | os.PathLike | None) -> ModelSpec:
    """Attach ``<weights_dir>/<name><suffix>`` (``/`` in the name -> ``+``) if present.

    The row keeps the bare model name: the file is that model's weights. A local file (this
    one, or ``NAME=FILE``) takes precedence over the name's pretrained weights in the hub
    caches (offline clusters: docs/conventions.md#v-1b).
    """
    if spec.checkpoint is not None or weights_dir is None:
        return spec
    stem = spec.name.replace("/", "+")
    for suffix in WEIGHT_SUFFIXES:
        p = Path(weights_dir) / f"{stem}{suffix}"
        if p.is_file():
            return ModelSpec(spec.name, str(p), spec.label or spec.name)
    return spec


def _line(text: object) -> str:
    return " ".join(str(text).split())


@dataclass(frozen=True)
class WeightsStatus:
    """Where a model's weights come from, as seen before a sweep runs (:func:`weights_status`).

    Attributes
    ----------
    kind : str
        ``"file"`` (a local checkpoint: ``NAME=FILE`` or ``--weights-dir``), ``"random-init"``,
        ``"cached"`` (the pretrained file is in the hub cache or torch.hub's), ``"download"``
        (not cached: its cell downloads it, the network being allowed) or ``"unavailable"``
        (the model fails before any cell runs).
    where : str
        The file (local or cached); empty otherwise.
    error : str
        Why ``"unavailable"``, one line naming the model.
    cause : str
        A cause several models share (offline, the hub unreachable), for one line about
        them all; empty for a model's own reason.
    """

    kind: str
    where: str = ""
    error: str = ""
    cause: str = ""

    def describe(self) -> str:
        """A few words for a listing (``uqvision sweep --dry-run``)."""
        return {"file": f"local file {self.where}" if self.where else "given by its source",
                "random-init": "random init",
                "cached": f"cached {self.where}",
                "download": "not cached: downloaded by its cell",
                }.get(self.kind, f"MISSING: {self.cause or self.error}")


def _caches_text() -> str:
    return f"hub cache {hub_cache_dir()!r}, torch.hub cache {str(torch_hub_checkpoints())!r}"


def weights_status(spec: ModelSpec, config: PredictConfig) -> WeightsStatus:
    """Where the weights of ``spec`` would come from, from the caches alone (no network).

    A checkpoint (checked when its cell loads it), random weights with
    ``config.allow_random_init``, else the name's pretrained file
    (:func:`uqvision.models.locate_pretrained`): cached, or not cached — to be downloaded
    when the network is allowed, unavailable when ``HF_HUB_OFFLINE`` is set (with the error
    loading it would raise). A name without pretrained weights is unavailable."""
    if spec.checkpoint is not None:
        if Path(spec.checkpoint).is_dir():  # a folder is no weight file (a dry run says so)
            try:
                existing_checkpoint(spec)
            except FileNotFoundError as exc:
                return WeightsStatus("unavailable", error=_line(exc))
        return WeightsStatus("file", spec.checkpoint)
    if config.allow_random_init:
        return WeightsStatus("random-init")
    if spec.source not in MODEL_SOURCES:
        return WeightsStatus("unavailable", error=f"unknown model source {spec.source!r}")
    if not hasattr(MODEL_SOURCES[spec.source], "pretrained"):
        return WeightsStatus("file")  # its source says what it needs when it loads
    try:
        found = locate_pretrained(spec)
    except ValueError as exc:  # WeightsUnavailableError (an InputError): no pretrained weights
        return WeightsStatus("unavailable", error=_line(exc))
    if found is not None:
        return WeightsStatus("cached", found.path)
    if not weights_offline():
        return WeightsStatus("download")
    try:  # offline and not cached: the error loading the model would raise
        pretrained_weights(spec, download=False)
        error = f"model {spec.name!r}: its pretrained weights are not cached"
    except ValueError as exc:
        error = _line(exc)
    return WeightsStatus("unavailable", error=error,
                         cause=f"pretrained weights not cached ({_caches_text()}) and "
                               "HF_HUB_OFFLINE is set")


def probe_hub(timeout: float = PROBE_TIMEOUT) -> tuple[bool, str]:
    """One ``HEAD`` request to the Hugging Face hub (``huggingface_hub``'s endpoint,
    ``HF_ENDPOINT``): can weights be downloaded at all?

    Parameters
    ----------
    timeout : float, default :data:`PROBE_TIMEOUT`
        Seconds to wait for an answer.

    Returns
    -------
    reachable : bool
        Any HTTP answer below 500 (a redirect or a 4xx still means the hub answers).
    why : str
        What went wrong, one line; empty when reachable.
    """
    url = hf_constants.ENDPOINT
    answer: list[tuple[bool, str]] = []

    def head() -> None:
        request = urllib.request.Request(url, method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                answer.append((True, ""))
        except urllib.error.HTTPError as err:
            answer.append((err.code < 500, f"HEAD {url}: HTTP {err.code}"))
        except (OSError, ValueError) as err:  # URLError, a timeout, a refused connection
            why = getattr(err, "reason", None) or err
            answer.append((False, f"HEAD {url}: {_line(why) or type(err).__name__}"))

    # in a thread: the name lookup before the connection has no timeout of its own
    thread = threading.Thread(target=head, name="uqvision-probe-hub", daemon=True)
    thread.start()
    thread.join(timeout)
    return answer[0] if answer else (False, f"HEAD {url}: no answer in {timeout:g} s")


def check_weights(specs: Iterable[ModelSpec], config: PredictConfig, *,
                  probe: bool = True) -> dict[str, WeightsStatus]:
    """The weights of every model, looked up before anything runs (:func:`weights_status`).

    When some are not cached and the network is allowed, one request (:func:`probe_hub`)
    decides whether they can be downloaded: when the hub cannot be reached, they are all
    ``"unavailable"`` with that reason, instead of each cell spending huggingface_hub's
    retries and timeouts (about 50 s a model) to find out.

    Parameters
    ----------
    specs : iterable of ModelSpec
        With their local files already attached (:func:`find_weights`).
    config : PredictConfig
    probe : bool, default True
        False: no network at all; the missing weights stay ``"download"``.

    Returns
    -------
    dict
        Model row -> :class:`WeightsStatus`, in the order given.
    """
    status = {spec.row: weights_status(spec, config) for spec in specs}
    missing = [row for row, w in status.items() if w.kind == "download"]
    if missing and probe:
        reachable, why = probe_hub()
        if not reachable:
            cause = (f"pretrained weights not cached ({_caches_text()}) and the hub is "
                     f"unreachable ({why})")
            for row in missing:
                status[row] = WeightsStatus(
                    "unavailable", cause=cause,
                    error=f"model {row!r}: its {cause}; fetch them where the network is "
                          "allowed (or point HF_HUB_CACHE / TORCH_HOME at a cache that holds "
                          "them), or give a local file as NAME=FILE or with --weights-dir")
    return status
