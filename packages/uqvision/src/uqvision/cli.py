"""``uqvision`` command line: a thin layer over the library API.

Commands: ``data``, ``train``, ``predict``, ``score``, ``sweep``, ``plot``, ``demo``
(``uqvision <command> -h`` for options). ``predict`` runs under ``torchrun`` as is
(``torchrun --nproc_per_node N -m uqvision predict ...``): samples are sharded exactly and the
logits gathered before rank 0 writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path

__all__ = ["COMMANDS", "SCORE_PROTOCOLS", "build_parser", "main"]


def _print(msg: str) -> None:
    print(msg, flush=True)


def _cmd_data(a: argparse.Namespace) -> int:
    from .data import DATASET_MAKERS

    opts = {"digits": {"test_fraction": a.test_fraction, "max_per_class": a.max_per_class},
            "synthetic": {"n_classes": a.classes, "n_per_class": a.per_class,
                          "image_size": a.image_size}}[a.kind]
    root = DATASET_MAKERS[a.kind](a.out, seed=a.seed, overwrite=a.overwrite, **opts)
    _print(str(root))
    return 0


def _cmd_train(a: argparse.Namespace) -> int:
    from .train import TrainConfig, train_model

    seeds = a.seeds or [0]
    if len(seeds) > 1 and "{seed}" not in a.out:
        raise SystemExit("uqvision train: with several --seeds, --out must contain '{seed}'")
    for seed in seeds:
        cfg = TrainConfig(arch=a.arch, epochs=a.epochs, batch_size=a.batch_size, lr=a.lr,
                          input_size=a.input_size, augment=None if a.augment == "none"
                          else a.augment, drop_rate=a.drop_rate, seed=seed, device=a.device,
                          num_workers=a.workers, model_kwargs=json.loads(a.model_kwargs))
        r = train_model(a.data, a.out.format(seed=seed), cfg)
        _print(f"{r.checkpoint}  train_accuracy={r.train_accuracy:.4f}  "
               f"loss={r.losses[-1]:.4f}  {r.wall_time_s:.1f}s")
    return 0


def _predict_config(a: argparse.Namespace):
    from .predict import PredictConfig

    return PredictConfig(mode=a.mode, passes=a.passes, first_pass=a.first_pass,
                         tta_policy=a.tta_policy, seed=a.seed, batch_size=a.batch_size,
                         num_workers=a.workers, device=a.device, amp=a.amp,
                         embeddings=getattr(a, "embeddings", False),
                         allow_random_init=a.random_init)


def _cmd_predict(a: argparse.Namespace) -> int:
    import os

    from .predict import predict_to_files

    for spec in a.model:
        paths = predict_to_files(spec, a.data, a.out, _predict_config(a),
                                 dataset_name=a.dataset_name, overwrite=a.overwrite)
        if int(os.environ.get("RANK", "0")) == 0:
            for p in paths:
                _print(str(p))
    return 0


def _score_selective(a: argparse.Namespace):
    from .selective import SelectiveConfig, score_selective

    return score_selective(a.caches, SelectiveConfig(calibration_size=a.calibration_size,
                                                     seed=a.seed, dataset=a.dataset))


def _score_ensembles(a: argparse.Namespace):
    from .ensembles import EnsembleConfig, score_ensembles

    return score_ensembles(a.caches, EnsembleConfig(members=a.members, n_orders=a.n_orders,
                                                    seed=a.seed, dataset=a.dataset,
                                                    reference=a.reference))


#: ``uqvision score --protocol NAME``: name -> function(args) -> xarray.Dataset.
SCORE_PROTOCOLS: dict[str, Callable] = {"selective": _score_selective,
                                        "ensembles": _score_ensembles}


def _cmd_score(a: argparse.Namespace) -> int:
    from uqmetrics import write_dataset

    ds = SCORE_PROTOCOLS[a.protocol](a)
    _print(str(write_dataset(ds, a.out, overwrite=a.overwrite)))
    return 0


def _cmd_sweep(a: argparse.Namespace) -> int:
    from uqmetrics import write_dataset

    from .selective import SelectiveConfig, score_selective
    from .sweep import sweep_predictions

    out = Path(a.out)
    report = sweep_predictions(a.models, a.data, out / "caches", _predict_config(a),
                               weights_dir=a.weights_dir, dataset_name=a.dataset_name,
                               scheduler=a.scheduler, n_workers=a.n_workers,
                               threads=a.cell_threads or a.threads, overwrite=a.overwrite,
                               progress=True)
    _print(f"computed {len(report.computed)}, skipped {len(report.skipped)} (already complete), "
           f"failed {len(report.failed)}")
    for key, err in sorted(report.failed.items()):
        _print(f"  FAILED {key}: {err}")
    (out / "sweep_failures.json").write_text(json.dumps(report.failed, indent=1))
    if a.mode == "plain" and report.paths:
        ds = score_selective([out / "caches"], SelectiveConfig(
            calibration_size=a.calibration_size, seed=a.seed, dataset=a.dataset_name))
        _print(str(write_dataset(ds, out / "scores" / "selective.nc", overwrite=True)))
    return 0 if report.paths else 1


def _cmd_plot(a: argparse.Namespace) -> int:
    from .plots import plot_caches, plot_ensembles

    paths = []
    if a.caches:
        paths += plot_caches(a.caches, a.out, dataset=a.dataset)
    if a.ensembles:
        paths += plot_ensembles(a.ensembles, a.out)
    if not paths:
        raise SystemExit("uqvision plot: nothing to plot (give --caches and/or --ensembles)")
    for p in paths:
        _print(str(p))
    return 0


def _cmd_demo(a: argparse.Namespace) -> int:
    from .demo import DemoConfig, run_demo, summary

    overrides = {f.name: getattr(a, f.name) for f in fields(DemoConfig)
                 if getattr(a, f.name, None) is not None}
    r = run_demo(a.out, DemoConfig(**overrides), log=_print)
    _print(summary(r))
    _print(f"demo done in {r.wall_time_s:.0f} s: {r.selective}, {r.ensembles}")
    return 0


def _add_predict_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=["plain", "tta", "mc_dropout"], default="plain")
    p.add_argument("--passes", type=int, default=1,
                   help="TTA augmentations or MC-dropout passes (30 in the Selective paper)")
    p.add_argument("--first-pass", type=int, default=0, help="index of the first TTA pass")
    p.add_argument("--tta-policy", default="imagenet", help="imagenet | cifar | crop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--amp", action="store_true", help="autocast (fp16 on CUDA, bf16 on CPU)")
    p.add_argument("--random-init", action="store_true",
                   help="models without a checkpoint get random weights (code-path checks only)")
    p.add_argument("--dataset-name", default=None, help="default: the data folder's name")
    p.add_argument("--overwrite", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``uqvision``."""
    ap = argparse.ArgumentParser(prog="uqvision", description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's choice)")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("data", help="write a development image folder")
    p.add_argument("kind", choices=["digits", "synthetic"])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-fraction", type=float, default=0.5)
    p.add_argument("--max-per-class", type=int, default=None)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--per-class", type=int, default=8)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--overwrite", action="store_true")

    p = sub.add_parser("train", help="train a small timm architecture; save a checkpoint")
    p.add_argument("--arch", required=True, help="timm architecture, e.g. resnet10t, test_vit")
    p.add_argument("--data", required=True, help="training image folder")
    p.add_argument("--out", required=True, help="checkpoint path ('{seed}' for several seeds)")
    p.add_argument("--seeds", type=int, nargs="+", help="one member per seed (default 0)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--input-size", type=int, default=32)
    p.add_argument("--augment", default="crop", help="imagenet | cifar | crop | none")
    p.add_argument("--drop-rate", type=float, default=0.0)
    p.add_argument("--model-kwargs", default="{}", help="JSON kwargs for timm.create_model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=0)

    p = sub.add_parser("predict", help="cache per-sample logits of models over a folder")
    p.add_argument("--model", required=True, action="append",
                   help="NAME or NAME=CHECKPOINT (timm arch[.tag], or tv/<torchvision name>); "
                        "repeatable")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="cache directory")
    p.add_argument("--embeddings", action="store_true", help="also cache pre-logit features")
    _add_predict_options(p)

    p = sub.add_parser("score", help="score caches with a protocol")
    p.add_argument("--protocol", choices=sorted(SCORE_PROTOCOLS), required=True)
    p.add_argument("--caches", nargs="+", required=True, help="cache files or directories")
    p.add_argument("--out", required=True, help="score file (.nc)")
    p.add_argument("--dataset", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calibration-size", type=float, default=5000,
                   help="selective: calibration samples, a count or a fraction in (0, 1)")
    p.add_argument("--members", nargs="+", default=None,
                   help="ensembles: member model names (default: all with a plain cache)")
    p.add_argument("--n-orders", type=int, default=5)
    p.add_argument("--reference", default="deep_ensemble")
    p.add_argument("--overwrite", action="store_true")

    p = sub.add_parser("sweep", help="cache and score a model zoo on Dask")
    p.add_argument("--models", nargs="+", required=True,
                   help="names, NAME=CHECKPOINT, or wildcards (resnet*, vit_*.augreg*)")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="sweep directory (caches/, scores/)")
    p.add_argument("--weights-dir", default=None, help="folder of <name>.safetensors/.pth files")
    p.add_argument("--scheduler", default=None, help="Dask scheduler address (default: local)")
    p.add_argument("--n-workers", type=int, default=2)
    p.add_argument("--cell-threads", type=int, default=None,
                   help="torch threads inside each Dask cell (default: --threads)")
    p.add_argument("--calibration-size", type=float, default=5000)
    _add_predict_options(p)

    p = sub.add_parser("plot", help="reliability, risk-coverage, metric-vs-size figures")
    p.add_argument("--caches", nargs="+", default=None)
    p.add_argument("--ensembles", default=None, help="ensembles score file")
    p.add_argument("--dataset", default=None)
    p.add_argument("--out", required=True, help="figure directory")

    p = sub.add_parser("demo", help="the whole chain on digits (a few minutes on 2 CPUs); "
                                    "torch threads: --threads before the command (default 1)")
    p.add_argument("--out", required=True)
    p.add_argument("--arch", default=None)
    p.add_argument("--members", type=int, default=None)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--mc-passes", dest="mc_passes", type=int, default=None)
    p.add_argument("--max-per-class", dest="max_per_class", type=int, default=None)
    p.add_argument("--calibration-size", dest="calibration_size", type=float, default=None)
    p.add_argument("--n-orders", dest="n_orders", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=None)
    return ap


#: Command name -> handler(args) -> exit status.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "data": _cmd_data, "train": _cmd_train, "predict": _cmd_predict, "score": _cmd_score,
    "sweep": _cmd_sweep, "plot": _cmd_plot, "demo": _cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``uqvision`` console script."""
    args = build_parser().parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        return COMMANDS[args.command](args)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"uqvision {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
