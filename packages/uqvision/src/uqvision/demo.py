"""The whole chain on scikit-learn's digits, in a few minutes on two CPU cores.

``OUT/data/digits/{train,test}`` (the image folders) → ``OUT/models/<arch>_m<k>.safetensors``
(deep-ensemble members, one seed each, with dropout in the head, uqvision's AdamW + OneCycle
recipe) → ``OUT/caches/*.nc`` (plain,
TTA with member ``k`` on its own augmentation ``k`` and member 0 on all, MC dropout of member
0) → ``OUT/scores/selective.nc`` and ``OUT/scores/ensembles.nc`` → ``OUT/figures/*.png``.
Every step skips what is already complete, so a rerun resumes. The chain is imported when it
runs: :class:`DemoConfig` (``uqvision demo``'s options) imports no torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from uqmetrics import read_dataset, write_dataset

__all__ = ["DemoConfig", "DemoResult", "run_demo", "summary"]


@dataclass
class DemoConfig:
    """Size of the demo. The defaults take a few minutes on 2 CPU cores; tests shrink them."""

    arch: str = "test_byobnet"  # BatchNorm + an nn.Dropout head: MC dropout applies
    members: int = 4
    epochs: int = 6
    input_size: int = 16
    drop_rate: float = 0.2
    augment: str = "crop"  # digits must not be flipped
    mc_passes: int = 10
    max_per_class: int | None = None
    calibration_size: float = 0.3
    n_orders: int = 5
    seed: int = 0
    batch_size: int = 64
    device: str = "cpu"
    threads: int | None = 1  # torch intra-op threads; tiny models gain nothing from more


@dataclass
class DemoResult:
    out: Path
    checkpoints: list[Path] = field(default_factory=list)
    caches: list[Path] = field(default_factory=list)
    selective: Path | None = None
    ensembles: Path | None = None
    figures: list[Path] = field(default_factory=list)
    wall_time_s: float = 0.0


def run_demo(out: str | os.PathLike, config: DemoConfig | None = None, *,
             log=None) -> DemoResult:
    """Run data → train → predict → score (selective, ensembles) → plots under ``out``.

    Parameters
    ----------
    out : path
    config : DemoConfig
        Checkpoints and caches already complete under ``out`` are reused; a member whose
        checkpoint records another training config (other ``epochs``, ``batch_size``, ``seed``,
        ``device``, ...: :func:`uqvision.training.runs.run_matches`) is trained again and its
        caches recomputed; the score files and figures are rewritten.
    log : callable, optional
        Called with one progress line per step (the CLI passes ``print``).
    """
    import torch

    config = config or DemoConfig()
    previous = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return _run(Path(out), config, log or (lambda _msg: None))
    finally:
        torch.set_num_threads(previous)


def _run(out: Path, config: DemoConfig, say) -> DemoResult:
    from .data import make_digits_folder  # the whole chain: imported when it runs
    from .models import ModelSpec
    from .plots import plot_caches
    from .predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files
    from .protocols.pitfalls.plots import plot_ensembles
    from .protocols.pitfalls.score import EnsembleConfig, score_ensembles
    from .protocols.selective.score import SelectiveConfig, score_selective
    from .training.loop import ADAMW_RECIPE, ImageTrainConfig, train_model
    from .training.runs import run_matches

    t0 = time.perf_counter()
    res = DemoResult(out)
    root = make_digits_folder(out / "data" / "digits", max_per_class=config.max_per_class,
                              seed=config.seed)
    train_dir, test_dir = root / "train", root / "test"
    say(f"data: {root}")
    specs, trained = [], []
    for k in range(config.members):
        ckpt = out / "models" / f"{config.arch}_m{k}.safetensors"
        train_config = ImageTrainConfig(
            arch=config.arch, epochs=config.epochs, input_size=config.input_size,
            augment=config.augment, drop_rate=config.drop_rate, seed=config.seed + k,
            batch_size=config.batch_size, device=config.device, tag=f"digits_m{k}",
            hparams=ADAMW_RECIPE)
        # a member is kept only when its sidecar records this config (a rerun with other
        # epochs, batch size, seed or device retrains it, and recomputes its caches below)
        trained.append(not run_matches(ckpt, train_config))
        if trained[-1]:
            r = train_model(train_dir, ckpt, train_config)
            say(f"trained member {k}: final training loss {r.losses[-1]:.3f} "
                f"({r.wall_time_s:.0f} s)")
        res.checkpoints.append(ckpt)
        specs.append(ModelSpec(config.arch, str(ckpt), label=f"{config.arch}_m{k}"))
    caches = out / "caches"
    # REFERENCE_EXECUTION pins contiguous tensors, no AMP and no loader workers: the demo's
    # numbers do not move with PredictConfig's defaults
    base = {"seed": config.seed, "batch_size": max(config.batch_size, 128),
            "device": config.device, "tta_policy": config.augment, **REFERENCE_EXECUTION}
    for k, spec in enumerate(specs):  # a member trained now replaces its earlier caches
        res.caches += predict_to_files(spec, test_dir, caches, PredictConfig(mode="plain", **base),
                                       overwrite=trained[k])
        # TTA: member k on its own augmentation k; member 0 on every augmentation
        tta = (PredictConfig(mode="tta", passes=config.members, **base) if k == 0
               else PredictConfig(mode="tta", first_pass=k, passes=1, **base))
        res.caches += predict_to_files(spec, test_dir, caches, tta, overwrite=trained[k])
    res.caches += predict_to_files(specs[0], test_dir, caches,
                                   PredictConfig(mode="mc_dropout", passes=config.mc_passes, **base),
                                   overwrite=trained[0])
    say(f"caches: {len(res.caches)} files in {caches}")
    sel = score_selective([caches], SelectiveConfig(calibration_size=config.calibration_size,
                                                    seed=config.seed, mc_passes=config.mc_passes))
    res.selective = write_dataset(sel, out / "scores" / "selective.nc", overwrite=True)
    ens = score_ensembles([caches], EnsembleConfig(n_orders=config.n_orders, seed=config.seed))
    res.ensembles = write_dataset(ens, out / "scores" / "ensembles.nc", overwrite=True)
    say(f"scores: {res.selective}, {res.ensembles}")
    res.figures = plot_caches([caches], out / "figures") + plot_ensembles(ens, out / "figures")
    say(f"figures: {len(res.figures)} in {out / 'figures'}")
    res.wall_time_s = time.perf_counter() - t0
    return res


def summary(result: DemoResult) -> str:
    """A few lines of the demo's headline numbers, read back from its score files."""
    sel, ens = read_dataset(result.selective), read_dataset(result.ensembles)
    lines = ["selective (AUROC on the held-out images, none -> temperature):"]
    for m in sel["model"].values:
        row = sel.sel(model=m)
        t = float(row["temperature"].sel(calibration="temperature"))
        before = (float(row["none_heldout"].sel(metric="auroc")) if "none_heldout" in sel
                  else float(row["auroc"].sel(calibration="none")))  # a file from before none_heldout
        after = float(row["auroc"].sel(calibration="temperature"))
        lines.append(f"  {m:<28} accuracy {float(row['accuracy'].sel(calibration='none')):.3f}  "
                     f"AUROC {before:.3f} -> {after:.3f}  T {t:.2f}")
    lines.append("ensembles (negative CLL, test_cv; DEE vs the deep ensemble):")
    for m in ens["method"].values:
        cll = ens["cll"].sel({"method": m}).mean("order").dropna("size").values
        dee = ens["dee"].sel({"method": m}).dropna("size").values
        lines.append(f"  {m:<28} {-cll[0]:.3f} (1) -> {-cll[-1]:.3f} ({cll.size})  "
                     f"DEE {dee[-1]:.2f}")
    return "\n".join(lines)
