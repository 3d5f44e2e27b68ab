"""The whole chain on scikit-learn's digits, in a few minutes on two CPU cores.

``OUT/data/digits/{train,test}`` (the image folders) → ``OUT/models/<arch>_m<k>.safetensors``
(deep-ensemble members, one seed each, with dropout in the head, uqvision's AdamW + OneCycle
recipe) → ``OUT/caches/*.nc`` (plain,
TTA with member ``k`` on its own augmentation ``k`` and member 0 on all, MC dropout of member
0) → ``OUT/scores/selective.nc`` and ``OUT/scores/ensembles.nc`` → ``OUT/figures/*.png``.

``OUT/demo.json`` records the options the folder was made with and
``OUT/.uqmetrics-written.json`` the files the demo wrote there. A rerun with the same options
skips what is already complete (a cut-short run resumes); a rerun with other options is
refused before any work unless ``overwrite``, which deletes the files the demo recorded (and
nothing else) and makes them again (docs/conventions.md#overwrite-rules). The chain is imported
when it runs: :class:`DemoConfig` (``uqvision demo``'s options) imports no torch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from uqmetrics import read_dataset, write_dataset

__all__ = ["OPTIONS_FILE", "WRITER", "DemoConfig", "DemoResult", "check_config", "run_demo",
           "summary"]

#: The writer of the demo's record of its files (:func:`uqmetrics.runs.io.record_written`):
#: ``overwrite`` deletes those files, and nothing else of ``OUT``.
WRITER = "uqvision demo"
#: The file in ``OUT`` that records the options the folder was made with (what a rerun is
#: compared with).
OPTIONS_FILE = "demo.json"
_FORMAT = {"format": "uqvision.demo", "version": 1}
#: Options that change nothing the demo writes: neither recorded nor compared.
_NOT_RECORDED = ("threads",)
#: The folders of ``OUT`` the demo writes files into, one by one (``OUT/data/digits`` is a
#: dataset folder of the makers, with their own record and rules).
_OUTPUTS = ("models", "caches", "scores", "figures")


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
    #: The members trained by this run (the others were kept).
    trained: list[int] = field(default_factory=list)


def run_demo(out: str | os.PathLike, config: DemoConfig | None = None, *,
             log=None, overwrite: bool = False) -> DemoResult:
    """Run data → train → predict → score (selective, ensembles) → plots under ``out``.

    Parameters
    ----------
    out : path
    config : DemoConfig
        A folder made with the same options (its :data:`OPTIONS_FILE`; ``threads`` does not
        count) is resumed: its checkpoints, caches, score files and figures are kept, and only
        what is missing is made. A folder made with other options, one whose member checkpoint
        was trained otherwise (its sidecar: :func:`uqvision.training.runs.run_matches`), or
        one holding files the demo recorded but not its options, is refused before any work
        unless ``overwrite``.
    log : callable, optional
        Called with one progress line per step (the CLI passes
        :func:`uqmetrics.runs.sweep.progress_line`: stderr, none under ``uqvision
        --quiet``); each member's training shows its own progress bar
        (:func:`uqvision.training.loop.train_model`'s ``progress``).
    overwrite : bool, default False
        Delete the files the demo recorded in ``out`` (``.uqmetrics-written.json``:
        :data:`OPTIONS_FILE`, checkpoints and their sidecars, caches, score files, figures),
        make ``out/data/digits`` again (the makers' rules: only a folder they wrote), and
        train, predict, score and plot everything anew. Nothing else in ``out`` is deleted.

    Raises
    ------
    uqmetrics.InputError
        Options the demo cannot run with (:func:`check_config`), before anything is written.
    FileExistsError
        ``out`` holds a demo of other options (naming the folder, what it holds and what
        this run asks for) and ``overwrite`` is False; or files in ``models/``, ``caches/``,
        ``scores/`` or ``figures/`` the demo did not record (a demo of an earlier uqvision,
        which recorded neither its options nor its files, or someone else's), with or without
        ``overwrite``.
    uqmetrics.InputError
        ``out`` holds another command's record of written files.
    """
    import torch

    config = config or DemoConfig()
    previous = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return _run(Path(out), config, log or (lambda _msg: None), overwrite)
    finally:
        torch.set_num_threads(previous)


#: The fields of :class:`DemoConfig` that count something: integers >= 1.
_COUNTS = ("members", "epochs", "input_size", "mc_passes", "n_orders", "batch_size")


def check_config(config: DemoConfig, names: Mapping[str, str] | None = None) -> None:
    """Refuse, before anything is written, options the demo cannot run with: an architecture
    that is not a timm model the demo can train (unknown, with close names; another source's;
    one with a pretrained tag), a count below 1, a ``drop_rate`` outside [0, 1), an unknown
    ``augment``, a ``seed`` of 2**32 or more, a ``max_per_class`` too small to put every
    digit in both train and test, a ``calibration_size`` the test images cannot give. Cheap: registry look-ups and the digits'
    labels (:func:`uqvision.data.makers.digits_split`), no model built, nothing trained.

    Parameters
    ----------
    config : DemoConfig
    names : mapping str -> str, optional
        What the messages call each field (``uqvision demo``'s options: ``{"arch":
        "--arch", ...}``); a field not in it is called by its name.

    Raises
    ------
    uqmetrics.InputError
        Naming the option (or field) and its value.
    """
    from uqmetrics import InputError

    from . import catalog
    from .data.makers import digits_split
    from .models import ModelSpec, check_model_name
    from .protocols.selective.score import resolve_calibration_size

    def bad(key: str, why: str) -> InputError:
        name = (names or {}).get(key, key)
        return InputError(f"{name} {getattr(config, key)!r}: {why}")

    try:
        check_model_name(config.arch)
    except ValueError as exc:
        raise bad("arch", " ".join(str(exc).split())) from None
    if ModelSpec(config.arch).source != "timm":
        raise bad("arch", "the demo trains a timm architecture (a name without a source prefix)")
    if "." in config.arch:
        raise bad("arch", "the demo trains an architecture from scratch: give its name without "
                          "a pretrained tag")
    for key in _COUNTS:
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(key, "must be an integer >= 1")
    if not 0 <= config.drop_rate < 1:
        raise bad("drop_rate", "must be in [0, 1)")
    if config.augment not in catalog.names("augmentation"):
        raise bad("augment", f"not an augmentation ({', '.join(catalog.names('augmentation'))})")
    if config.max_per_class is not None:
        value = config.max_per_class
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad("max_per_class", "must be an integer >= 1")
    if not 0 <= config.seed < 2**32:  # the digits' split (scikit-learn's random_state)
        raise bad("seed", "the demo's data split takes a seed below 2**32")
    try:
        _, test = digits_split(seed=config.seed, max_per_class=config.max_per_class)
    except ValueError:
        raise bad("max_per_class", "too few images of each digit to put every digit in both "
                                   "train and test (the demo splits them half and half)") from None
    try:
        resolve_calibration_size(config.calibration_size, len(test))
    except ValueError:
        raise bad("calibration_size", f"the demo's {len(test)} test images take a count in "
                                      f"[1, {len(test) - 1}] or a fraction in (0, 1)") from None


def _options(config: DemoConfig) -> dict[str, Any]:
    """The options a folder records and a rerun is compared by (as JSON reads them back)."""
    return json.loads(json.dumps({k: v for k, v in asdict(config).items()
                                  if k not in _NOT_RECORDED}))


def _read_options(out: Path) -> dict[str, Any] | None:
    """The options ``out``'s :data:`OPTIONS_FILE` records; None without one."""
    from uqmetrics import InputError

    path = out / OPTIONS_FILE
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
        ok = (isinstance(rec, dict) and all(rec.get(k) == v for k, v in _FORMAT.items())
              and isinstance(rec.get("options"), dict))
    except (OSError, UnicodeError, ValueError):
        ok = False
    if not ok:
        raise InputError(f"{str(path)!r} is not a record of the demo's options ({_FORMAT}); "
                         "choose another --out")
    return rec["options"]


def _member_configs(out: Path, config: DemoConfig) -> list[tuple[Path, Any]]:
    """``(checkpoint, training config)`` of every member."""
    from .training.loop import ADAMW_RECIPE, ImageTrainConfig

    return [(out / "models" / f"{config.arch}_m{k}.safetensors", ImageTrainConfig(
        arch=config.arch, epochs=config.epochs, input_size=config.input_size,
        augment=config.augment, drop_rate=config.drop_rate, seed=config.seed + k,
        batch_size=config.batch_size, device=config.device, tag=f"digits_m{k}",
        hparams=ADAMW_RECIPE)) for k in range(config.members)]


def _said(options: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{k}={options[k]!r}" if k in options else f"no {k}" for k in keys)


def _trained_otherwise(ckpt: Path, train_config: Any) -> str:
    """How the sidecar of ``ckpt`` differs from ``train_config`` (for an error)."""
    from .models import read_sidecar

    got = read_sidecar(ckpt).get("train_config")
    want = json.loads(json.dumps(asdict(train_config)))
    if not isinstance(got, dict):
        return "without a recorded training config"
    keys = sorted(k for k in {*got, *want} if got.get(k) != want.get(k))
    if not keys:
        return "otherwise (its sidecar records other teachers or initial weights)"
    return f"with {_said(got, keys)}; this run trains {_said(want, keys)}"


def _rel(out: Path, path: str | os.PathLike) -> str:
    """``path`` relative to ``out``, as the record of written files names it."""
    return Path(path).absolute().relative_to(out.absolute()).as_posix()


def _some(names: list[str], k: int = 3) -> str:
    head = ", ".join(repr(n) for n in names[:k])
    return head + (f" and {len(names) - k} more" if len(names) > k else "")


def _check_folder(out: Path, config: DemoConfig, members: list[tuple[Path, Any]],
                  overwrite: bool) -> None:
    """Refuse, before any work, a folder the demo may not write into with these options (see
    :func:`run_demo`)."""
    from uqmetrics.runs.io import WRITTEN_RECORD, written_files

    from .training.loop import checkpoint_files
    from .training.runs import run_matches

    recorded = set(written_files(out, WRITER))  # another command's record: InputError
    found = sorted(p.relative_to(out).as_posix() for d in _OUTPUTS if (out / d).is_dir()
                   for p in (out / d).rglob("*") if not p.is_dir())
    unrecorded = [f for f in found if f not in recorded]
    held, want = _read_options(out), _options(config)
    if held is None and unrecorded:
        raise FileExistsError(
            f"--out {str(out)!r} holds {_some(unrecorded)} but no {OPTIONS_FILE}: files of a "
            "demo run by an earlier uqvision (which recorded neither its options nor its "
            "files) or someone else's; the demo cannot tell what made them, and --overwrite "
            "deletes only files the demo recorded: remove them, or choose another --out")
    if held is None:
        if recorded and not overwrite:
            raise FileExistsError(
                f"--out {str(out)!r} holds files the demo wrote ({_some(sorted(recorded))}) "
                f"but not its options ({OPTIONS_FILE} is missing): pass --overwrite to replace "
                "them, or choose another --out")
        return
    keys = sorted(k for k in {*held, *want} if held.get(k) != want.get(k))
    if keys:
        what = f"the demo of {_said(held, keys)}; this run asks for {_said(want, keys)}"
    else:  # the options agree: so must the members' sidecars
        what = next((f"the member checkpoint {str(ckpt)!r}, trained "
                     f"{_trained_otherwise(ckpt, tc)}" for ckpt, tc in members
                     if ckpt.is_file() and not run_matches(ckpt, tc)), None)
    if what is not None and not overwrite:
        raise FileExistsError(
            f"--out {str(out)!r} holds {what}: pass --overwrite to replace what the demo wrote "
            f"there (the files its {WRITTEN_RECORD} lists), or choose another --out")
    # the files the demo writes by name: one it did not record is neither kept as its own
    # nor replaced
    stray = [p for p in [*(p for ckpt, _ in members for p in checkpoint_files(ckpt)),
                         *(out / "scores" / f"{name}.nc" for name in ("selective", "ensembles"))]
             if (p.exists() or p.is_symlink()) and _rel(out, p) not in recorded]
    if stray:
        raise FileExistsError(
            f"--out {str(out)!r}: {_some([str(p) for p in stray])} is not a file the demo "
            f"recorded ({WRITTEN_RECORD}): the demo neither takes it for its own nor replaces "
            "it, --overwrite included; move it, or choose another --out")


def _current_scores(path: Path, caches: list[Path], config: Any) -> bool:
    """Whether the score file ``path`` was computed from these caches with this config: every
    cache its ``input_checksums`` records is one of them as they are now (a protocol scores
    the caches of its modes only: Selective leaves the TTA ones out), and its ``config`` is
    ``config``. A cache computed again since (a member trained again) has another checksum."""
    from uqmetrics.runs.io import open_netcdf

    if not path.is_file():
        return False
    try:
        with open_netcdf(path) as ds:
            attrs = dict(ds.attrs)
    except (OSError, ValueError, RuntimeError):  # the demo's own file, damaged: scored again
        return False
    sums = set()
    for p in caches:
        with open_netcdf(p) as c:
            sums.add(str(c.attrs.get("checksum")))
    try:
        same_config = json.loads(attrs.get("config", "null")) == json.loads(
            json.dumps(asdict(config), default=list))
        used = set(json.loads(attrs.get("input_checksums", "[]")))
        return same_config and bool(used) and used <= sums
    except (TypeError, ValueError):
        return False


def _run(out: Path, config: DemoConfig, say, overwrite: bool) -> DemoResult:
    from uqmetrics.runs.io import (
        record_written,
        remove_written,
        write_text_file,
        written_files,
    )

    from .data import make_digits_folder  # the whole chain: imported when it runs
    from .models import ModelSpec
    from .plots import plot_caches
    from .predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files
    from .protocols.pitfalls.plots import plot_ensembles
    from .protocols.pitfalls.score import EnsembleConfig, score_ensembles
    from .protocols.selective.score import SelectiveConfig, score_selective
    from .training.loop import checkpoint_files, train_model
    from .training.runs import run_matches

    t0 = time.perf_counter()
    check_config(config)  # before any work
    res = DemoResult(out)
    members = _member_configs(out, config)
    _check_folder(out, config, members, overwrite)  # before any work
    # the makers refuse a folder of someone else's before the demo deletes anything
    root = make_digits_folder(out / "data" / "digits", max_per_class=config.max_per_class,
                              seed=config.seed, overwrite=overwrite)
    if overwrite:
        removed = remove_written(out, WRITER)
        if removed:
            say(f"--overwrite: removed the {len(removed)} files the demo wrote in {out}")
    if not (out / OPTIONS_FILE).is_file():
        out.mkdir(parents=True, exist_ok=True)
        text = json.dumps({**_FORMAT, "options": _options(config)}, indent=1) + "\n"
        record_written(out, WRITER, [write_text_file(out / OPTIONS_FILE, text)])
    recorded = set(written_files(out, WRITER))

    def written(paths) -> list[Path]:
        """``paths``, added to the record of the demo's files (rewritten only for new ones)."""
        paths = [Path(p) for p in paths]
        new = [p for p in paths if _rel(out, p) not in recorded]
        if new:
            record_written(out, WRITER, new)
            recorded.update(_rel(out, p) for p in new)
        return paths

    train_dir, test_dir = root / "train", root / "test"
    say(f"data: {root}")
    specs, trained = [], []
    for k, (ckpt, train_config) in enumerate(members):
        # a member is kept only when its sidecar records this config (checked above: another
        # one is refused, or deleted by --overwrite)
        trained.append(not run_matches(ckpt, train_config))
        if trained[-1]:
            r = train_model(train_dir, ckpt, train_config, overwrite=False)
            written(p for p in checkpoint_files(ckpt) if p.exists())
            res.trained.append(k)
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
        res.caches += written(predict_to_files(spec, test_dir, caches,
                                               PredictConfig(mode="plain", **base),
                                               overwrite=trained[k]))
        # TTA: member k on its own augmentation k; member 0 on every augmentation
        tta = (PredictConfig(mode="tta", passes=config.members, **base) if k == 0
               else PredictConfig(mode="tta", first_pass=k, passes=1, **base))
        res.caches += written(predict_to_files(spec, test_dir, caches, tta,
                                               overwrite=trained[k]))
    res.caches += written(predict_to_files(
        specs[0], test_dir, caches, PredictConfig(mode="mc_dropout", passes=config.mc_passes,
                                                  **base), overwrite=trained[0]))
    say(f"caches: {len(res.caches)} files in {caches}")
    scored = sorted(set(res.caches))  # the demo's own caches, whatever else caches/ holds
    sel_config = SelectiveConfig(calibration_size=config.calibration_size, seed=config.seed,
                                 mc_passes=config.mc_passes)
    ens_config = EnsembleConfig(n_orders=config.n_orders, seed=config.seed)
    res.selective, res.ensembles = out / "scores" / "selective.nc", out / "scores" / "ensembles.nc"
    rescored = False
    if not _current_scores(res.selective, scored, sel_config):  # the demo's own, or none
        written([write_dataset(score_selective(scored, sel_config), res.selective,
                               overwrite=True)])
        rescored = True
    ens = None
    if not _current_scores(res.ensembles, scored, ens_config):
        ens = score_ensembles(scored, ens_config)
        written([write_dataset(ens, res.ensembles, overwrite=True)])
        rescored = True
    say(f"scores: {res.selective}, {res.ensembles}" + ("" if rescored else " (kept)"))
    figures = [out / f for f in written_files(out, WRITER) if f.startswith("figures/")]
    if rescored or not figures or not all(p.is_file() for p in figures):
        ens = read_dataset(res.ensembles) if ens is None else ens
        figures = written(plot_caches(scored, out / "figures")
                          + plot_ensembles(ens, out / "figures"))
    res.figures = figures
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
