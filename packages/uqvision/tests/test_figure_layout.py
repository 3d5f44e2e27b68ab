"""Every figure of every protocol is legible: drawn from a hand-made result with few, many and
a model zoo's worth of series (models, detectors, methods...), no legend runs over a title, a
label, another legend or another panel, no title or label over another, nothing past the
figure's edge (:func:`uqmetrics.report.plotting.overlapping_text`), and no two entries of a
legend look alike (:func:`~uqmetrics.report.plotting.alike_legend_entries`), on each figure
the protocol saves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from uqmetrics.report import plotting
from uqmetrics.report.plotting import alike_legend_entries, overlapping_text

#: Series of a hand-made result: a handful, a dozen, and as many as a model zoo or a sweep
#: gives (``zoo``: per protocol, :data:`ZOO`).
SCALES = {"few": 2, "many": 12, "zoo": None}
#: A zoo's worth of series per protocol: shift's models, ood's detectors, conformal's models,
#: pitfalls' methods (each plain and under TTA), disentangle's estimators and models, url's
#: methods, selective's families (of 3 models each); None: no more than ``many`` (uimnet's
#: algorithms: the paper's 8).
ZOO = {"shift": 30, "ood": 30, "conformal": 30, "pitfalls": 23, "disentangle": 20, "url": 30,
       "selective": 30, "uimnet": None}


def _names(prefix: str, n: int) -> list[str]:
    """``n`` names of realistic length (``prefix`` 0 ... ``prefix`` n-1)."""
    return [f"{prefix}_{i}" for i in range(n)]


# ---------------------------------------------------------------------------------------------
# hand-made results, one per protocol


def _shift(n: int) -> xr.Dataset:
    from uqvision.protocols.shift.score import SHIFT_METRICS

    rng = np.random.default_rng(0)
    models = ["vanilla", "deep_ensemble", *_names("resnet50_variant", n - 2)][:n]
    corruptions, severities = ["fog", "gaussian_noise", "pixelate", "contrast"], [1, 2, 3, 4, 5]
    cal = ["none", "temperature"]
    dims = ("model", "corruption", "severity", "calibration")
    data = {}
    for m in SHIFT_METRICS:
        data[m] = (dims, rng.uniform(0.05, 0.95, (n, 4, 5, 2)))
        data[f"clean_{m}"] = (("model", "calibration"), rng.uniform(0.05, 0.95, (n, 2)))
        data[f"set_{m}"] = (("model", "shift_set", "calibration"), rng.uniform(0.05, 0.95, (n, 2, 2)))
    data["temperature"] = ("model", rng.uniform(0.8, 1.6, n))
    data["mean_corruption_error"] = ("model", rng.uniform(0.7, 1.1, n))
    data["relative_mean_corruption_error"] = ("model", rng.uniform(0.7, 1.1, n))
    return xr.Dataset(data, coords={"model": models, "corruption": corruptions,
                                    "severity": severities, "calibration": cal,
                                    "shift_set": ["imagenet-v2", "imagenet-r"]},
                      attrs={"protocol": "shift"})


def _ood(n: int) -> xr.Dataset:
    from uqvision.protocols.ood.score import MEMBER_DETECTORS

    rng = np.random.default_rng(1)
    models = [*_names("resnet18_seed", n), f"ensemble[{n}]"]
    dets = ["msp", "max_logit", "energy", "knn", "mahalanobis", "vim", "react", "odin",
            "gradnorm", "dice", "ash", "she", "relative_mahalanobis", "klm", "openmax",
            "temperature_scaling", "generalized_entropy", "nnguide", "fdbd", "scale",
            *_names("detector", n)][:max(2, n)] + list(MEMBER_DETECTORS)[:2]
    sets = ["ssb_hard", "ninco", "inaturalist", "textures", "openimage_o"]
    auroc = rng.uniform(0.55, 0.99, (len(models), len(dets), len(sets)))
    near, far = auroc[..., :2].mean(-1), auroc[..., 2:].mean(-1)
    pair = ("model", "detector")
    return xr.Dataset(
        {"auroc": (("model", "detector", "ood_set"), auroc),
         "near_auroc": (pair, near), "far_auroc": (pair, far),
         "near_fpr_at_95_tpr": (pair, 1 - near), "far_fpr_at_95_tpr": (pair, 1 - far),
         "forward_passes": ("model", [1] * n + [n]),
         "u_id": (("model", "detector", "id_sample"), rng.random((len(models), len(dets), 40))),
         "u_ood": (("model", "detector", "ood_sample"),
                   1 + rng.random((len(models), len(dets), 50)))},
        coords={"model": models, "detector": dets, "ood_set": sets,
                "ood_split": ("ood_set", ["near", "near", "far", "far", "far"]),
                "ood_sample_set": ("ood_sample", np.repeat(sets, 10))},
        attrs={"protocol": "ood"})


def _conformal(n: int) -> xr.Dataset:
    rng = np.random.default_rng(2)
    models = _names("vit_b16_augreg", n)
    methods, alphas, grid = ["naive", "thr", "aps", "raps"], [0.1, 0.05], [0.2, 0.1, 0.05, 0.01]
    dims = ("model", "method", "alpha", "calibration")
    shape = (n, len(methods), len(alphas), 1)
    return xr.Dataset(
        {"coverage": (dims, rng.uniform(0.85, 0.97, shape)),
         "mean_set_size": (dims, rng.uniform(1, 12, shape)),
         "accuracy": ("model", rng.uniform(0.6, 0.85, n)),
         "shift_coverage": (("model", "method", "alpha", "corruption", "severity", "calibration"),
                            rng.uniform(0.5, 0.97, (*shape[:3], 2, 3, 1))),
         "curve_coverage": (("model", "curve_method", "curve_alpha"),
                            rng.uniform(0.8, 1.0, (n, 3, len(grid)))),
         "curve_mean_set_size": (("model", "curve_method", "curve_alpha"),
                                 rng.uniform(1, 20, (n, 3, len(grid)))),
         "class_coverage": (("model", "class"), rng.uniform(0.6, 1.0, (n, 50)))},
        coords={"model": models, "method": methods, "alpha": alphas, "calibration": ["none"],
                "corruption": ["fog", "snow"], "severity": [1, 3, 5],
                "curve_method": ["naive", "aps", "raps"], "curve_alpha": grid},
        attrs={"protocol": "conformal", "trials": 4})


def _pitfalls(n: int) -> xr.Dataset:
    bases = ["deep_ensemble", "mc_dropout", "fge", "sse", "swag", "csgld", "vi",
             "kfac_laplace", "dropconnect", *_names("variational_method", n)][:max(2, n)]
    methods = [s for b in bases for s in (b, f"{b}_tta")]
    rng = np.random.default_rng(3)
    shape = (len(methods), 4, 3)
    dims = ("method", "size", "order")
    return xr.Dataset({v: (dims, rng.normal(size=shape)) for v in ("cll", "nll", "accuracy")}
                      | {"dee": (dims, rng.random(shape) * 4)},
                      coords={"method": methods, "size": [1, 2, 3, 4]},
                      attrs={"reference": "deep_ensemble"})


def _disentangle(n: int) -> xr.Dataset:
    from uqvision.protocols.disentangle.score import TASKS

    rng = np.random.default_rng(4)
    estimators = ["entropy_of_expected", "expected_entropy", "mutual_information",
                  "one_minus_max_probability", "ddu_density", "laplace_variance",
                  *_names("estimator", n)][:max(3, n)]
    models = _names("resnet50_member", n)
    pair = ("model", "estimator")
    data = {v: (pair, rng.uniform(0.2, 0.9, (n, len(estimators)))) for v, _ in TASKS}
    data["estimate"] = (("model", "estimator", "image"), rng.random((n, len(estimators), 30)))
    data["true_entropy"] = ("image", rng.random(30))
    data["estimates"] = ("estimator", ["aleatoric", "epistemic", "epistemic", "total", "epistemic",
                                       "epistemic", *["total"] * n][:len(estimators)])
    data["members"] = ("model", np.arange(1, n + 1))
    return xr.Dataset(data, coords={"model": models, "estimator": estimators},
                      attrs={"protocol": "disentangle"})


def _url(n: int) -> xr.Dataset:
    rng = np.random.default_rng(5)
    methods = ["ce", "infonce", "mcinfonce", "elk", "nivmf", "hetxl", "riskpred", "losspred",
               "mcdropout", "ensemble", "sngp", "hib", *_names("method", n)][:max(3, n)]
    methods.append("constant_u")  # the control row (left out of Fig. 2)
    m, d, s, c = len(methods), 2, 3, 2
    return xr.Dataset(
        {"r_auroc": (("method", "dataset", "seed"), rng.uniform(0.4, 0.8, (m, d, s))),
         "r_auroc_mean": ("method", rng.uniform(0.4, 0.8, m)),
         "recall_at_1": (("method", "dataset", "seed"), rng.uniform(0.3, 0.9, (m, d, s))),
         "all_upstream_r_auroc": (("method", "config", "seed"), rng.uniform(0.4, 0.8, (m, c, s))),
         "all_upstream_crop_consistency": (("method", "config", "seed"),
                                           rng.uniform(0, 1, (m, c, s))),
         "all_r_auroc": (("method", "config", "dataset", "seed"),
                         rng.uniform(0.4, 0.8, (m, c, d, s))),
         "rank_correlation": ("quantity", [0.3, 0.5])},
        coords={"method": methods, "dataset": ["cub", "cars"], "seed": [0, 1, 2],
                "config": [0, 1], "quantity": ["upstream_r_auroc", "upstream_crop_consistency"]})


def _selective(n: int) -> xr.Dataset:
    """A selective result with metadata: ``n`` families of a plain, a distilled and a
    label-smoothed model (the distilled ones taught by the first family's plain model)."""
    rng = np.random.default_rng(6)
    rows = []
    for f in range(n):
        family = f"Family{f}_ConvNeXt"
        for kind, dist, ls in (("plain", "no", "no"), ("dist", "yes", "no"), ("ls", "no", "yes")):
            rows.append((f"{family}_{kind}", family, f"arch{f}", dist, ls))
    k = len(rows)
    ds = xr.Dataset(
        {"accuracy": (("model", "calibration"), np.repeat(rng.uniform(0.6, 0.9, (k, 1)), 2, 1)),
         "auroc": (("model", "calibration"), rng.uniform(0.75, 0.9, (k, 2))),
         "ece": (("model", "calibration"), rng.uniform(0.01, 0.2, (k, 2))),
         "aurc": (("model", "calibration"), rng.uniform(0.02, 0.2, (k, 2))),
         "sac_95": (("model", "calibration"), rng.uniform(0.1, 0.9, (k, 2))),
         "temperature": (("model", "calibration"),
                         np.stack([np.ones(k), rng.uniform(0.7, 1.6, k)], 1))},
        coords={"model": [r[0] for r in rows], "calibration": ["none", "temperature"],
                "method": ("model", ["softmax"] * k), "base_model": ("model", [r[0] for r in rows]),
                "family": ("model", [r[1] for r in rows]),
                "base_architecture": ("model", [r[2] for r in rows]),
                "distillation": ("model", [r[3] for r in rows]),
                "label_smoothing": ("model", [r[4] for r in rows]),
                "metadata_key": ("model", [f"k.{r[0]}" for r in rows]),
                "teacher": ("model", [f"k.{rows[0][0]}" if r[3] == "yes" else "" for r in rows]),
                "pretraining_data": ("model", ["none"] * k),
                "adversarial_training": ("model", ["no"] * k),
                "supervision": ("model", ["supervised"] * k),
                "params": ("model", rng.uniform(1e6, 3e8, k)),
                "input_size": ("model", np.full(k, 224.0))})
    ds["auroc"].attrs["greater_is_better"] = 1
    ds["ece"].attrs["greater_is_better"] = 0
    return ds


def _uimnet(n: int) -> xr.Dataset:
    from uqvision.protocols.uimnet.score import OUT_DOMAIN_METRICS

    rng = np.random.default_rng(7)
    algs = ["ERM", "MCDropout", "MIMO", "Mixup", "OC", "SoftLabeler", "RND", "DUE",
            *_names("Algorithm", n)][:max(2, n)]
    measures = ["Entropy", "Largest", "Gap", "Jacobian", "GaussianMixture", "Native"]
    shape = (len(algs), len(measures), 2, 2, 2, 2)
    dims = ("algorithm", "measure", "k", "calibration", "spectral", "stat")
    data = {m: (dims, rng.uniform(0.3, 0.9, shape)) for m in OUT_DOMAIN_METRICS}
    data |= {f"oracle_{m}": ("stat", [0.9, 0.01]) for m in OUT_DOMAIN_METRICS}
    return xr.Dataset(data, coords={"algorithm": algs, "measure": measures, "k": [1, 5],
                                    "calibration": ["none", "initial"], "spectral": [False, True],
                                    "stat": ["mean", "std"]},
                      attrs={"n_data_seeds": 3})


def _uimnet_histograms(monkeypatch, ds: xr.Dataset) -> None:
    """The per-image u the histograms recompute from the run's caches, made up (no caches)."""
    from uqvision.protocols.uimnet import plots as uimnet_plots

    rng = np.random.default_rng(8)
    cells = {str(a): Path(f"{a}.nc") for a in ds["algorithm"].values}
    monkeypatch.setattr(uimnet_plots, "histogram_selection", lambda _: {
        "measure": "Entropy", "k": 1, "spectral": False, "data_seed": 0, "cells": cells})
    monkeypatch.setattr(uimnet_plots, "_uncertainties", lambda *_: {
        "in_test": rng.random(100), "out_test": 0.5 + rng.random(100)})


# ---------------------------------------------------------------------------------------------
# each protocol's figures, as it saves them


#: Per protocol with figures: the module and function that draw its figures into a folder,
#: and the hand-made result of ``n`` series it draws.
DRAWERS = {
    "shift": ("shift.figures", "draw_figures", _shift),
    "ood": ("ood.figures", "draw_figures", _ood),
    "conformal": ("conformal.figures", "draw_figures", _conformal),
    "pitfalls": ("pitfalls.plots", "plot_ensembles", _pitfalls),
    "disentangle": ("disentangle.figures", "draw_figures", _disentangle),
    "url": ("url.plots", "draw_figures", _url),
    "selective": ("selective.plots", "plot_selective", _selective),
    "uimnet": ("uimnet.plots", "draw_figures", _uimnet),
}
#: The protocols with figures, each drawn by :func:`_draw`.
DRAWN_PROTOCOLS = tuple(DRAWERS)


def _draw(name: str, n: int, monkeypatch, out: Path) -> None:
    """Draw protocol ``name``'s figures of a result of ``n`` series into ``out``."""
    import importlib

    module, function, make = DRAWERS[name]
    ds = make(n)
    if name == "uimnet":
        _uimnet_histograms(monkeypatch, ds)
    getattr(importlib.import_module(f"uqvision.protocols.{module}"), function)(ds, out)


def drawn_figures(name: str, n: int, monkeypatch, out: Path) -> dict[str, object]:
    """File name -> Figure of each figure protocol ``name`` saves (every module's
    ``save_figure`` recorded, the figures still written into ``out``)."""
    import sys

    found: dict[str, object] = {}
    save = plotting.save_figure

    def record(fig, path, **kwargs):
        found[Path(path).name] = fig
        return save(fig, path, **kwargs)

    monkeypatch.setattr(plotting, "save_figure", record)
    for module in list(sys.modules.values()):  # those that imported it by name
        if getattr(module, "__name__", "").startswith("uqvision.") and \
                getattr(module, "save_figure", None) is save:
            monkeypatch.setattr(module, "save_figure", record)
    _draw(name, n, monkeypatch, out)
    return found


def drawn_problems(name: str, n: int, monkeypatch, out: Path) -> dict[str, list]:
    """File name -> :func:`overlapping_text` and :func:`alike_legend_entries` of each figure
    protocol ``name`` saves."""
    return {f: overlapping_text(fig) + alike_legend_entries(fig)
            for f, fig in drawn_figures(name, n, monkeypatch, out).items()}


@pytest.fixture(autouse=True)
def _protocol_modules():
    """Import every protocol's figures first, so that :func:`drawn_figures` finds them."""
    import importlib

    for name in ("pitfalls", "selective", "url"):  # the others import it on use
        importlib.import_module(f"uqvision.protocols.{name}.plots")


@pytest.mark.parametrize(("name", "scale"), [(name, scale) for name in DRAWN_PROTOCOLS for scale in SCALES
                                             if scale != "zoo" or ZOO[name] is not None])
def test_every_figure_is_legible(name, scale, monkeypatch, tmp_path):
    found = drawn_problems(name, SCALES[scale] or ZOO[name], monkeypatch, tmp_path)
    assert found, f"{name} drew no figure"
    assert {f: o for f, o in found.items() if o} == {}


def test_the_families_of_a_selective_zoo_are_told_apart(monkeypatch, tmp_path):
    """Past tab20's 20 colours two families were drawn alike (their legend keys differ in size
    only, which :func:`alike_legend_entries` counts): each family's points now differ from every
    other's in colour or marker."""
    from matplotlib.colors import to_hex

    figures = drawn_figures("selective", ZOO["selective"], monkeypatch, tmp_path)
    for name in ("selective_auroc_vs_ece_none.png", "selective_aurc_vs_accuracy.png"):
        points = [c for c in figures[name].axes[0].collections
                  if c.get_label().startswith("Family")]
        looks = {(to_hex(c.get_facecolor()[0]), c.get_paths()[0].vertices.round(3).tobytes())
                 for c in points}
        assert len(points) == len(looks) == ZOO["selective"]
