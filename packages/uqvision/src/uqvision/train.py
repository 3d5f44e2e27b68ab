"""Train a small timm architecture on an image folder and save a checkpoint timm reloads.

This is how development, tests and the demo get "pretrained" models without downloads, and
how deep-ensemble members are made (one run per seed). The checkpoint is a plain state dict
(``.safetensors``) with the classifier head; its JSON sidecar records the preprocessing
(``pretrained_cfg``), the model kwargs, the classes and the full training config, so
``timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=dict(file=ckpt, ...))``
rebuilds the model and :func:`uqvision.models.load_model` its preprocessing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from uqmetrics import provenance_attrs
from uqmetrics.io import temporary_beside

from .data import (
    DataConfig,
    ImageFolderDataset,
    dataset_fingerprint,
    eval_transform,
    flush_denormal,
    tta_transform,
)
from .models import check_model_name, sidecar_path

__all__ = ["TrainConfig", "TrainResult", "train_model"]


@dataclass
class TrainConfig:
    """Options of :func:`train_model` (all recorded in the checkpoint sidecar).

    ``input_size`` is the square side the images are resized to; ``augment`` names a policy of
    :data:`uqvision.data.TTA_POLICIES` (``None``: no augmentation); ``drop_rate`` is timm's
    classifier dropout (a module in e.g. ViT/ConvNeXt heads, so MC dropout can use it);
    ``model_kwargs`` go to ``timm.create_model`` (e.g. ``patch_size`` for small inputs) and are
    recorded in the sidecar so the model is rebuilt identically.
    """

    arch: str = "resnet10t"
    epochs: int = 10
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.05
    input_size: int = 32
    augment: str | None = "crop"
    drop_rate: float = 0.0
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    seed: int = 0
    device: str = "cpu"
    num_workers: int = 0
    tag: str | None = None
    model_kwargs: dict = field(default_factory=dict)


@dataclass
class TrainResult:
    """Paths written, the trained model (eval mode), per-epoch loss, last-epoch accuracy."""

    checkpoint: Path
    sidecar: Path
    model: torch.nn.Module
    losses: list[float] = field(default_factory=list)
    train_accuracy: float = float("nan")
    wall_time_s: float = 0.0


def train_model(data: str | os.PathLike, out: str | os.PathLike,
                config: TrainConfig | None = None) -> TrainResult:
    """Train ``config.arch`` from scratch on the image folder ``data``; save to ``out``.

    Parameters
    ----------
    data : path
        Image folder (one sub-folder per class).
    out : path
        Checkpoint path; ``.safetensors`` is appended when it has another suffix. The sidecar is
        ``out`` with suffix ``.json``.
    config : TrainConfig

    Returns
    -------
    TrainResult
        Paths, the trained model, per-epoch mean training loss, final-epoch training accuracy.
    """
    import timm
    from safetensors.torch import save_file

    config = config or TrainConfig()
    check_model_name(config.arch)
    if "." in config.arch:
        raise ValueError("train from an architecture name without a pretrained tag, "
                         f"got {config.arch!r}")
    t0 = time.perf_counter()
    out = Path(out)
    if out.suffix != ".safetensors":
        out = out.with_suffix(out.suffix + ".safetensors") if out.suffix else out.with_suffix(
            ".safetensors")
    s = int(config.input_size)
    dcfg = DataConfig((3, s, s), tuple(config.mean), tuple(config.std), crop_pct=1.0,
                      interpolation="bilinear")
    transform = tta_transform(config.augment, dcfg) if config.augment else eval_transform(dcfg)
    ds = ImageFolderDataset(data, transform)
    n_classes = len(ds.classes)
    torch.manual_seed(config.seed)
    model_kwargs = {"drop_rate": config.drop_rate, **config.model_kwargs}
    model = timm.create_model(config.arch, num_classes=n_classes, pretrained_cfg_overlay=dcfg.to_dict(),
                              **model_kwargs).to(config.device)
    gen = torch.Generator().manual_seed(config.seed)
    loader = DataLoader(ds, batch_size=config.batch_size, shuffle=True, generator=gen,
                        num_workers=config.num_workers, drop_last=len(ds) > config.batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr,
                                                total_steps=config.epochs * len(loader))
    model.train()
    with flush_denormal():
        losses, acc = _fit(model, loader, opt, sched, config)
    model.eval()
    cfg = asdict(config)
    sidecar = {
        "format": "uqvision.checkpoint/1",
        "architecture": config.arch,
        "tag": config.tag or f"{Path(data).resolve().parent.name}_s{config.seed}",
        "num_classes": n_classes,
        "classes": ds.classes,
        "pretrained_cfg": dcfg.to_dict(),
        "model_kwargs": model_kwargs,
        "train_config": cfg,
        "dataset": str(Path(data).resolve()),
        "dataset_fingerprint": dataset_fingerprint(data),
        "train_losses": losses,
        "train_accuracy": acc,
        "provenance": provenance_attrs(config=cfg, seed=config.seed),
    }
    side = sidecar_path(out)
    with temporary_beside(side) as tmp:
        tmp.write_text(json.dumps(sidecar, indent=1))
        os.replace(tmp, side)
    with temporary_beside(out) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
                  str(tmp))
        os.replace(tmp, out)
    return TrainResult(out, side, model, losses, acc, time.perf_counter() - t0)


def _fit(model, loader, opt, sched, config: TrainConfig) -> tuple[list[float], float]:
    """The epoch loop; returns per-epoch mean loss and the last epoch's training accuracy."""
    loss_fn = torch.nn.CrossEntropyLoss()
    losses, acc = [], float("nan")
    for _ in range(config.epochs):
        total, correct, n = 0.0, 0, 0
        for x, y, _idx in loader:
            x, y = x.to(config.device), y.to(config.device)
            logits = model(x)
            loss = loss_fn(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(y)
            correct += int((logits.argmax(1) == y).sum())
            n += len(y)
        losses.append(total / n)
        acc = correct / n
    return losses, acc
