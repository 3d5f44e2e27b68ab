"""The prediction modes (:data:`PASS_MODES`, ``uqvision predict --mode NAME``): ``plain``,
``tta`` and ``mc_dropout`` (with :func:`head_only_dropout`, the backbone once per batch when
every dropout module is in the head; :data:`MC_DROPOUT_PATHS`). A protocol registers its own
(``crop``: :mod:`uqvision.protocols.url.crop`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from uqmetrics.metrics.registry import Registry

from ..data import derive_seed, tta_transform
from ..models import LoadedModel
from ..training.dropout import PerSampleDropout
from ..training.method import StochasticPass
from .config import PredictConfig
from .loop import (
    OWN_UNCERTAINTY,
    _autocast,
    _resolved_format,
    _set_memory_format,
    eval_dataset,
    run_loader,
    sample_input,
)

__all__ = ["MC_DROPOUT_PATHS", "PASS_MODES", "head_only_dropout"]


#: Prediction modes: name -> runner(loaded, folder, config, local indices, device) ->
#: [(pass_index, arrays)] (``uqvision predict --mode NAME``); ``folder`` is the scanned
#: :class:`~uqvision.data.ImageFolderDataset`, its labels already in the model's class space
#: (set its transform with ``folder.with_transform``).
PASS_MODES: Registry[Callable] = Registry("prediction mode", fill="uqvision:load_registries")


@PASS_MODES.register(name="plain")
def _plain(loaded, folder, cfg, idx, device):
    """The model's own evaluation preprocessing, one pass."""
    ds = eval_dataset(folder, loaded, cfg)
    return [(0, run_loader(loaded, ds, idx, cfg, device))]


@PASS_MODES.register(name="tta")
def _tta(loaded, folder, cfg, idx, device):
    """One random augmentation (--tta-policy) per pass, one file per pass."""
    transform = tta_transform(cfg.tta_policy, loaded.data_config)
    out = []
    for p in range(cfg.first_pass, cfg.first_pass + cfg.passes):
        ds = folder.with_transform(transform, derive_seed(cfg.seed, p))
        out.append((p, run_loader(loaded, ds, idx, cfg, device)))
    return out


#: How an MC-dropout cache was computed (its ``mc_dropout_path`` attribute): the backbone once
#: per batch and the head once per pass (every dropout module in the head), or the whole
#: network once per pass. Both give the same logits bit for bit.
MC_DROPOUT_PATHS = ("features_once", "full_passes")


def head_only_dropout(loaded: LoadedModel, dataset, index: int, cfg: PredictConfig, device: str,
                      dropout: PerSampleDropout) -> bool:
    """Whether MC dropout may compute ``forward_features`` once per batch: checked on sample
    ``index`` of ``dataset`` inside ``dropout``'s context.

    True when the network has timm's ``forward_features``/``forward_head`` split (and no
    embeddings, own uncertainty or per-sample noise are asked for), none of ``dropout``'s
    modules runs inside ``forward_features``, and ``forward_head(forward_features(x))`` equals
    ``model(x)`` bit for bit under the same masks. The check is made on the module tree as it
    runs, so dropout inside the body (e.g. timm's ``proj_drop_rate``) gives False.
    """
    model = loaded.model
    if (cfg.embeddings or getattr(model, OWN_UNCERTAINTY, False)
            or isinstance(model, StochasticPass)
            or not (hasattr(model, "forward_features") and hasattr(model, "forward_head"))):
        return False
    cfg = _resolved_format(model, cfg)
    x = sample_input(dataset, index, cfg, device)
    _set_memory_format(model, cfg)
    calls: list[int] = []
    handles = [m.register_forward_hook(lambda *_: calls.append(1)) for m in dropout.modules]
    try:
        with torch.inference_mode(), _autocast(cfg, device):
            dropout.start_pass(0, [int(index)])
            feats = model.forward_features(x)
            in_body = bool(calls)
            split = model.forward_head(feats)
            dropout.start_pass(0, [int(index)])
            whole = model(x)
    finally:
        for h in handles:
            h.remove()
    return not in_body and bool(calls) and torch.equal(split, whole)


@PASS_MODES.register(name="mc_dropout")
def _mc_dropout(loaded, folder, cfg, idx, device):
    """Dropout masks per sample and pass, all passes in one file (pass, sample, class); the
    backbone runs once per batch when every dropout module is in the head."""
    try:
        dropout = PerSampleDropout(loaded.model, cfg.seed)
    except ValueError:
        raise ValueError(f"model {loaded.spec.row!r} has no dropout module with p > 0; "
                         "MC dropout is not available for it") from None
    with dropout:
        ds = eval_dataset(folder, loaded, cfg)
        once = len(idx) > 0 and head_only_dropout(loaded, ds, idx[0], cfg, device, dropout)
        arrays = run_loader(loaded, ds, idx, cfg, device, cfg.passes, dropout, features_once=once)
    arrays["mc_dropout_path"] = np.array([MC_DROPOUT_PATHS[0 if once else 1]])
    return [(0, arrays)]
