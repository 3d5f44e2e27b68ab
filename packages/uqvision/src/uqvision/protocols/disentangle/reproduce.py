"""``uqvision reproduce disentangle``: untangle's benchmark (Mucsányi, Kirchhof & Oh 2024,
"Benchmarking Uncertainty Disentanglement: Specialized Uncertainties for Specialized Tasks";
docs/conventions.md#v-8) on the generated ``hierarchy`` stand-in, where the truth is exact.

Ground truth:

- **aleatoric**: the stand-in made with label ambiguity (``make_hierarchy(...,
  ambiguity=F)``): a fraction ``F`` of the images blend two classes of one superclass and are
  labelled by a draw from their weights, so every test image has an exact label distribution,
  whose entropy is the true aleatoric uncertainty;
- **epistemic**: held-out families (the classes of the second half of the superclasses are
  never trained on: the OOD set, eval set ``ood-far``), corruption severity (ImageNet-C made
  locally of the ID test images, :func:`uqvision.data.corruptions.make_corrupted_folder`) and
  training-set size (every method trained on the nested, class-stratified 10 %, 50 % and 100 %
  subsets of the ID training images, :func:`uqvision.hierarchy.stratified_subset`).

The methods are :data:`METHODS`, one entry each (a deep ensemble, whose members are also scored
alone, plain and temperature-scaled; MC dropout; SWAG and KFAC-Laplace from the first member;
HET-XL's heteroscedastic softmax and a loss-prediction head on the first member's backbone;
test-time augmentation of the first member);
every network predicts the ID test images (role ``test``), the ID validation images (role
``calibration``, the temperatures), the ID training images (role ``fit``, the DDU density), the
OOD classes and every corrupted member, with its penultimate features.

Steps, each skipped when its output is already complete (a rerun resumes)::

    OUT/data/                 make_hierarchy(ambiguity=F)
    OUT/views/<set>/<class>   symlink views: test, val, ood, fit, train_<pct>
    OUT/data-c/<c>/<s>/       make_corrupted_folder of the ID test view
    OUT/models/<run>.*        uqvision.training.loop.train_model
    OUT/caches/*.nc           uqvision.predict
    OUT/disentangle.nc        uqvision.protocols.disentangle.score.score_disentangle
    OUT/figures/*.png         uqvision.protocols.disentangle.figures.draw_figures
    OUT/findings.md           uqvision.protocols.disentangle.findings

``--set`` options: ``epochs``, ``members``, ``dropout_passes``, ``ambiguity``, ``weight_law``
(the law of the blends' weights, ``uniform`` or ``beta(a, b)``: ``uqvision data hierarchy
--weight-law``), ``fractions``
(comma-separated, e.g. ``0.1,0.5,1``), ``corruptions``, ``severities``, ``samples`` (SWAG's and
Laplace's), ``tta_passes``, ``methods`` (a comma list of :data:`METHODS` names).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from uqmetrics import InputError, write_dataset

from ...data import ImageFolderDataset
from ...hierarchy import ensure_hierarchy, read_hierarchy, stratified_subset
from ...models.names import ModelSpec
from ...predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files
from ..base import ENSEMBLE_SCALES, Reproduction, finish_reproduction
from . import DESCRIPTION

__all__ = ["METHODS", "REPRODUCTION", "SCALES", "DisentangleMethod", "run", "split_classes"]


@dataclass(frozen=True)
class DisentangleMethod:
    """One method the driver trains and predicts (an entry of :data:`METHODS`).

    Attributes
    ----------
    name : str
        The entry's name (``--set methods=``) and its runs' prefix.
    method : str
        The training method (:data:`uqvision.methods.TRAINING_METHODS`).
    predict : dict
        Its :class:`~uqvision.predict.PredictConfig` options (``mode``, ``passes``,
        ``samples``, ``tta_policy``); the values of ``passes`` and ``samples`` name a scale
        setting (``"dropout_passes"``).
    hparams : dict
        Per scale, its training hyper-parameters.
    from_first_member : bool
        Starts from the first deep-ensemble member of its fraction (SWAG, Laplace, and the
        heads HET-XL and loss prediction put on its backbone).
    full_only : bool
        Trained on the whole training set only (not the 10 % and 50 % subsets).
    predict_only : bool
        Not trained: the first deep-ensemble member of its fraction predicts with this entry's
        options, under the row name ``<arch>@<name>_f<pct>`` (test-time augmentation).
    """

    name: str
    method: str | None
    predict: dict = field(default_factory=dict)
    hparams: dict = field(default_factory=dict)
    from_first_member: bool = False
    full_only: bool = False
    predict_only: bool = False


#: The methods, in order (the deep ensemble first: the others may start from its member 0).
METHODS = (
    DisentangleMethod("deep_ensemble", "deep_ensemble", {"mode": "plain"}),
    DisentangleMethod("mc_dropout", "mc_dropout", {"mode": "mc_dropout",
                                                   "passes": "dropout_passes"},
                      {"smoke": {"p": 0.3}, "cpu": {"p": 0.3}}),
    DisentangleMethod("swag", "swag", {"mode": "plain", "samples": "samples"},
                      {"smoke": {"pretrain_epochs": 0, "swag_epochs": 2, "collect_epochs": 0.5,
                                 "rank": 4},
                       "cpu": {"pretrain_epochs": 0, "swag_epochs": 5, "collect_epochs": 0.5,
                               "rank": 10}}, from_first_member=True, full_only=True),
    DisentangleMethod("kfac_laplace", "kfac_laplace", {"mode": "plain", "samples": "samples"},
                      {"smoke": {"epochs": 0, "scales": "0.3"},
                       "cpu": {"epochs": 0, "scales": "0.03,0.3,1.0", "tune_samples": 3}},
                      from_first_member=True, full_only=True),
    # HET-XL's heteroscedastic softmax (Collier et al. 2021) and a loss-prediction head
    # (uqvision.methods.representation), each a new head on the first member's backbone,
    # fine-tuned whole with SGD (the URL protocol's Lamb at 2e-3 for 4 epochs left them at 0.31
    # top-1 against the members' 0.70); their own uncertainty (the log determinant of HET-XL's
    # embedding covariance, the predicted loss) is the estimator ``learned``.
    DisentangleMethod("hetxl", "hetxl", {"mode": "plain"},
                      {"smoke": {"epochs": 1, "optimizer": "sgd", "lr": 0.05,
                                 "u": "covariance_logdet"},
                       "cpu": {"epochs": 10, "optimizer": "sgd", "lr": 0.05,
                               "u": "covariance_logdet"}}, from_first_member=True),
    DisentangleMethod("losspred", "losspred", {"mode": "plain"},
                      {"smoke": {"epochs": 1, "optimizer": "sgd", "lr": 0.05},
                       "cpu": {"epochs": 10, "optimizer": "sgd", "lr": 0.05}},
                      from_first_member=True),
    # test-time augmentation: the first member's passes on random augmentations, pad-4 crops
    # without flips (a flip changes some stand-in classes: docs/conventions.md#v-2)
    DisentangleMethod("tta", None, {"mode": "tta", "passes": "tta_passes", "tta_policy": "crop"},
                      predict_only=True),
)

#: Scales: the networks of :data:`~uqvision.protocols.base.ENSEMBLE_SCALES` and the study.
#: At every scale the networks of the 10 % and 50 % subsets predict the test, fit and OOD images
#: only (the training-set-size task reads the test images). ``smoke`` (CI): the hierarchy smoke
#: set (3 ID superclasses x 3 classes, 3 OOD superclasses), 2 members, 3 epochs, one corruption
#: at severities 1 and 5, SWAG of 2 samples, no Laplace, HET-XL and loss prediction of one epoch,
#: TTA of 2 passes (under a minute on 2 cores); ``cpu``:
#: the cpu hierarchy (4 x 6 ID classes), 3 members, 15 epochs, 2 corruptions at severities 1, 3,
#: 5, SWAG and KFAC-Laplace of 5 samples, HET-XL and loss prediction fine-tuned 10 epochs on the
#: first member, TTA of 5 passes.
SCALES = {
    "smoke": {**ENSEMBLE_SCALES["smoke"], "ambiguity": 0.5, "fractions": (0.1, 0.5, 1.0),
              "corruptions": ("gaussian_noise",), "severities": (1, 5), "samples": 2,
              "tta_passes": 2, "workers": 1,
              "methods": ("deep_ensemble", "mc_dropout", "swag", "hetxl", "losspred", "tta")},
    "cpu": {**ENSEMBLE_SCALES["cpu"], "members": 3, "ambiguity": 0.5,
            "fractions": (0.1, 0.5, 1.0), "corruptions": ("gaussian_noise", "contrast"),
            "severities": (1, 3, 5), "samples": 5, "tta_passes": 5, "workers": 2,
            "methods": ("deep_ensemble", "mc_dropout", "swag", "kfac_laplace", "hetxl", "losspred",
                        "tta")},
}
_KEYS = ("epochs", "members", "dropout_passes", "ambiguity", "weight_law", "fractions",
         "corruptions", "severities", "methods", "samples", "tta_passes")


def _settings(scale: str, arch: str | None, data: str | None, options: dict[str, str]) -> dict:
    if scale not in SCALES:
        raise InputError(f"reproduce disentangle: unknown scale {scale!r}; known: {list(SCALES)}")
    if data is not None:
        raise InputError("reproduce disentangle: --data is not supported (the truth is the "
                         "stand-in's); score real caches with uqvision score disentangle "
                         "--truth real.json")
    s = {"weight_law": "uniform", **SCALES[scale]}
    s["scale"] = scale
    unknown = sorted(set(options) - set(_KEYS))
    if unknown:
        raise InputError(f"--set: unknown option(s) {unknown} of reproduce disentangle; known: "
                         f"{list(_KEYS)}")
    try:
        for k, v in options.items():
            if k == "weight_law":
                s[k] = str(v)
            elif k in ("corruptions", "methods"):
                s[k] = tuple(x.strip() for x in str(v).split(",") if x.strip())
            elif k == "severities":
                s[k] = tuple(int(x) for x in str(v).split(","))
            elif k == "fractions":
                s[k] = tuple(float(x) for x in str(v).split(","))
            elif k in ("epochs", "ambiguity"):
                s[k] = float(v)
            else:
                s[k] = int(v)
    except ValueError as exc:
        raise InputError(f"--set: {exc}") from None
    known = [m.name for m in METHODS]
    if set(s["methods"]) - set(known) or "deep_ensemble" not in s["methods"]:
        raise InputError(f"--set methods must be names of {known} including deep_ensemble, got "
                         f"{list(s['methods'])}")
    if any(not 0.0 < f <= 1.0 for f in s["fractions"]) or 1.0 not in s["fractions"]:
        raise InputError(f"--set fractions must be in (0, 1] and include 1, got "
                         f"{list(s['fractions'])}")
    if arch is not None:
        s["arch"] = arch
    return s


def split_classes(root: str | os.PathLike) -> dict[str, list[str]]:
    """``{"id": [...], "ood": [...]}``: the classes of the first half of the superclasses
    (trained on) and of the others (held-out families), sorted."""
    info = read_hierarchy(root)
    ids = set(info.superclasses[:max(1, len(info.superclasses) // 2)])
    return {"id": sorted(c for c in info.classes if info.superclass_of[c] in ids),
            "ood": sorted(c for c in info.classes if info.superclass_of[c] not in ids)}


def _link(target: Path, link: Path) -> None:
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        raise InputError(f"{str(link)!r} is not a link this command wrote: move it, or choose "
                         "another --out")
    os.symlink(target, link, target_is_directory=target.is_dir())


def _views(root: Path, views: Path, split: dict[str, list[str]], fractions, seed: int
           ) -> dict[str, Path]:
    """Symlink views: ``test``/``val``/``fit`` (ID classes of test, val, train), ``ood`` (OOD
    classes of test), ``train_<pct>`` (the nested stratified subsets of the ID training
    images)."""
    out = {}
    for name, key, part in (("test", "id", "test"), ("val", "id", "val"), ("fit", "id", "train"),
                            ("ood", "ood", "test")):
        folder = views / name
        folder.mkdir(parents=True, exist_ok=True)
        for c in split[key]:
            _link((root / part / c).resolve(), folder / c)
        out[name] = folder
    full = ImageFolderDataset(out["fit"])
    ids = full.sample_ids
    targets = [int(t) for t in full.targets]
    for f in fractions:
        folder = views / f"train_{round(100 * f)}"
        for i in stratified_subset(targets, f, seed=seed):
            c, name = ids[i].split("/", 1)
            (folder / c).mkdir(parents=True, exist_ok=True)
            _link((root / "train" / c / name).resolve(), folder / c / name)
        out[f"train_{round(100 * f)}"] = folder
    return out


def _runs(s: dict, seed: int, device: str, models: Path, views: dict, classes: tuple
          ) -> tuple[list[tuple[str, object, dict, str]], dict, dict]:
    """``(runs, ensembles, train_sizes)``: every network (name, config, predict options, its
    training view) in training order, the ensemble rows to score (row -> its runs), and each
    row's or run's (method, fraction); runs are named as trained, before
    :func:`_resolve` names their models. A predict-only entry's run is its member's run again,
    its predict options naming its row (``label``)."""
    from ...training.loop import ImageTrainConfig  # torch: imported on use

    common = {"arch": s["arch"], "batch_size": s["batch_size"], "input_size": s["input_size"],
              "augment": "crop", "model_kwargs": dict(s["model_kwargs"]), "device": device,
              "classes": classes}
    runs, ensembles, sizes = [], {}, {}
    for f in s["fractions"]:
        first = len(runs)
        pct = round(100 * f)
        train_tag = f"f{pct}"
        members = []
        for m in METHODS:
            if m.name not in s["methods"] or (m.full_only and f != 1.0):
                continue
            hp = dict(m.hparams.get(s["scale"], {}))
            how = {k: (s[v] if k in ("passes", "samples") else v)
                   for k, v in m.predict.items()}
            if m.name == "deep_ensemble":
                for j in range(s["members"]):
                    ms = seed * 1000 + j
                    name = f"deep_ensemble_{train_tag}_s{ms}"
                    runs.append((name, ImageTrainConfig(method="deep_ensemble", seed=ms,
                                                        epochs=s["epochs"],
                                                        tag=f"disentangle_{name}", **common),
                                 dict(how)))
                    members.append(name)
                if len(members) > 1:
                    ens = f"deep_ensemble_{train_tag}[{len(members)}]"
                    ensembles[ens] = tuple(members)
                    sizes[ens] = ["deep_ensemble", f]
                sizes[members[0]] = ["plain", f]
                continue
            if m.predict_only:  # the first member's run again: its network, these options
                label = f"{m.name}_{train_tag}"
                member = next(r for r in runs if r[0] == members[0])
                runs.append((member[0], member[1], {**how, "label": label}))
                sizes[label] = [m.name, f]
                continue
            ms = seed * 1000 + 100 * (1 + [x.name for x in METHODS].index(m.name))
            name = f"{m.name}_{train_tag}_s{ms}"
            kw = {}
            if m.from_first_member:
                kw["init_checkpoint"] = str(models / f"{members[0]}.safetensors")
            else:
                kw["epochs"] = s["epochs"]
            if m.method == "kfac_laplace":
                kw["val_data"] = str(views["val"])
            runs.append((name, ImageTrainConfig(method=m.method, hparams=hp, seed=ms,
                                                tag=f"disentangle_{name}", **kw, **common),
                         how))
            if how.get("samples"):  # one model per posterior sample: a row of them
                ensembles[f"{m.name}_{train_tag}"] = (name,)
                sizes[f"{m.name}_{train_tag}"] = [m.name, f]
            else:
                sizes[name] = [m.name, f]
        runs[first:] = [(*r, f"train_{pct}") for r in runs[first:]]
    return runs, ensembles, sizes


def _resolve(caches: Path, ensembles: dict, sizes: dict) -> tuple[dict, dict]:
    """The ensemble rows and training sizes with each run named by its models (the caches'
    ``model`` attr: ``<arch>@<run>``, ``<arch>@<run>:<sample>`` for a posterior's samples);
    a row of one model becomes that model."""
    from ...cache import index_caches

    models = sorted({i.model for i in index_caches([caches])})

    def of(run: str) -> list[str]:
        return [m for m in models if m.split("@", 1)[-1] == run
                or m.split("@", 1)[-1].startswith(run + ":")]

    rows, alias = {}, {}
    for row, runs in ensembles.items():
        found = [m for r in runs for m in of(r)]
        if len(found) > 1:
            name = row if row.endswith("]") else f"{row}[{len(found)}]"
            rows[name], alias[row] = tuple(found), name
        elif found:
            alias[row] = found[0]
    out = {}
    for key, value in sizes.items():
        if key in alias:
            out[alias[key]] = value
        elif of(key):
            out[of(key)[0]] = value
    return rows, out


def run(out, *, scale: str = "smoke", data: str | None = None, arch: str | None = None,
        seed: int = 0, overwrite: bool = False, options: dict | None = None,
        log: Callable[[str], None] = print, device: str = "cpu") -> Path:
    """Run the disentanglement protocol at ``scale`` into ``out``; returns
    ``out/disentangle.nc``."""
    from ...data.corruptions import make_corrupted_folder
    from ...evalsets import iter_member_folders
    from ..base import train_and_predict

    t0 = time.perf_counter()
    s = _settings(scale, arch, data, dict(options or {}))
    out = Path(out)
    root = out / "data"
    ensure_hierarchy(root, scale=s["hierarchy"], seed=seed, overwrite=overwrite,
                     ambiguity=s["ambiguity"], weight_law=s["weight_law"])
    split = split_classes(root)
    views = _views(root, out / "views", split, s["fractions"], seed)
    log(f"classes: {len(split['id'])} ID, {len(split['ood'])} OOD; ambiguity "
        f"{s['ambiguity']}; fractions {list(s['fractions'])}")
    corrupted = make_corrupted_folder(
        views["test"], out / "data-c", corruptions=s["corruptions"], severities=s["severities"],
        resize=s["input_size"], crop=s["input_size"], seed=seed, workers=s["workers"],
        progress=log if scale != "smoke" else False, overwrite=overwrite)
    members = [(m, f) for m, f in iter_member_folders(corrupted, "imagenet-c")
               if m.corruption in s["corruptions"] and m.severity in s["severities"]]

    models, caches = out / "models", out / "caches"
    models.mkdir(parents=True, exist_ok=True)
    base = {"batch_size": 256, "device": device, "seed": seed, "embeddings": True,
            **REFERENCE_EXECUTION}
    runs, ensembles, sizes = _runs(s, seed, device, models, views, tuple(split["id"]))

    retrained: set[str] = set()

    def predict(spec: str, how: dict, trained: bool, full: bool = True) -> int:
        # a predict-only entry (TTA) reruns a member's network under its own row name; that
        # network's caches are recomputed when the member was retrained in this call
        how = dict(how)
        label = how.pop("label", None)
        if label is None:
            if trained:
                retrained.add(spec)
        else:
            trained = trained or spec in retrained
            arch, _, ckpt = spec.partition("=")
            spec = ModelSpec(arch, ckpt, label=f"{arch}@{label}")
        n = 0
        for dataset, role in (("test", "test"), ("val", "calibration"), ("fit", "fit")):
            if dataset == "val" and not full:
                continue
            n += len(predict_to_files(spec, views[dataset], caches,
                                      PredictConfig(role=role, **how, **base),
                                      dataset_name=dataset, overwrite=trained))
        n += len(predict_to_files(spec, views["ood"], caches,
                                  PredictConfig(eval_set="ood-far", **how, **base),
                                  dataset_name="ood", overwrite=trained))
        for member, folder in (members if full else ()):
            n += len(predict_to_files(
                spec, folder, caches,
                PredictConfig(eval_set="imagenet-c", eval_member=member.name, **how, **base),
                overwrite=trained))
        return n

    for view in dict.fromkeys(r[3] for r in runs):  # each fraction's runs on its subset
        full = view == "train_100"  # the subsets' networks: test, fit and OOD only
        mine = [r for r in runs if r[3] == view]
        train_and_predict([r[:3] for r in mine if "label" not in r[2]], models, views[view],
                          lambda spec, how, trained, full=full: predict(spec, how, trained, full),
                          overwrite=overwrite, log=log)
        for name, config, how, _ in (r for r in mine if "label" in r[2]):  # predict-only
            t1 = time.perf_counter()
            n = predict(f"{config.arch}={models / name}.safetensors", how, False, full)
            log(f"  {how['label']}: {name} predicts, {n} caches "
                f"({time.perf_counter() - t1:.0f} s)")

    from .score import DisentangleConfig, score_disentangle

    ensembles, sizes = _resolve(caches, ensembles, sizes)
    scores = score_disentangle(caches, DisentangleConfig(
        truth=str(root), test="test", calibration="val", fit="fit", ensembles=ensembles,
        temperature=True, train_sizes=sizes, seed=seed))
    path = write_dataset(scores, out / "disentangle.nc", overwrite=True)
    from .figures import draw_figures  # matplotlib: imported on use
    from .findings import disentangle_findings, format_findings

    return finish_reproduction(out, path, t0, draw_figures(scores, out / "figures"),
                               format_findings(disentangle_findings(scores)), log)


#: The driver of ``uqvision reproduce disentangle``.
REPRODUCTION = Reproduction("disentangle", DESCRIPTION, run, scales=tuple(SCALES))
