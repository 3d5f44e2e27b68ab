"""The UIMNET scoring protocol (docs/conventions.md#v-3): caches → uqmetrics → ``ood.nc``.

Reads the run caches and ensemble cells that :mod:`uqvision.protocols.uimnet.reproduce` writes under a
``caches/`` folder, and scores every (algorithm, spectral, data seed, K) ensemble:

- in-domain ``acc1``, ``acc5``, ``nll``, ``ece`` on the in-domain test set over ``calibration``
  ∈ {none, temperature}, with τ fitted on in-domain validation
  (:func:`uqmetrics.temperature_scaled_metrics`, protocol ``holdout``; S.1);
- out-domain ``auc``, ``in_as_in``, ``out_as_out`` for every measure of
  :data:`uqvision.protocols.uimnet.measures.MEASURES` (:func:`uqmetrics.ood_scores`; S.4: θ = 95 % quantile of u
  on in-domain validation; OutAsOut counts OUT-domain images). ``gmm`` has three fits
  (``gmm_fit``, :data:`uqvision.protocols.uimnet.measures.GMM_FITS`): ``train-ledoit-wolf``
  (the default) and ``official`` (UIMNET's code), class Gaussians of the in-domain training
  split with Ledoit–Wolf covariances or sample covariance + 0.1 I, read from the run caches
  (a run cache that does not hold the chosen fit's values, or holds them under another
  estimator, is refused, never scored in its place), and ``validation-ledoit-wolf``. The
  latter is a *fitted* measure
  (:attr:`uqvision.protocols.uimnet.measures.Measure.fitted`): fitted on one part of in-domain
  validation, its θ the 95 % quantile on the other, held-out part
  (:func:`uqvision.protocols.uimnet.measures.reference_split`: class-stratified, seeded,
  ``fit_fraction`` of the samples to the fit):
  θ on the samples a GMM was fitted on is an in-sample quantile, far below the one of unseen
  in-domain images, and InAsIn collapses. Every other measure fits nothing on validation and
  takes θ on all of it, so for exchangeable validation and test images InAsIn ≈ 0.95 (the
  5 % type-I bound). Every metric and measure reads one predictor per ensemble and
  calibration, ``softmax(log p̄ / τ)`` with ``p̄ = mean_k softmax(z_k)`` (τ = 1 or τ̂;
  :func:`uqvision.protocols.uimnet.measures.calibrated_log_probs`), the one τ̂ is fitted on.
  Not corrected, and recorded as such: τ̂ and the top-K members are chosen
  on the same in-domain validation set (one scalar and a selection among trials);
- the oracle (an in/out classifier, u = p(out)) as the upper reference.

Every number is computed by uqmetrics; this module only arranges them. Values are the mean and
the sample standard deviation (ddof 1) over data seeds (dim ``stat``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import xarray as xr
from uqmetrics import ood_scores
from uqmetrics.metrics.calibration import log_softmax, temperature_scaled_metrics
from uqmetrics.runs.io import read_dataset
from uqmetrics.runs.result_schema import input_checksum, stamp_result

from ...provenance import entry_provenance
from .measures import (
    DEFAULT_GMM_FIT,
    GMM_COVARIANCE,
    GMM_FITS,
    GMM_TRAIN_FITS,
    MEASURES,
    MeasureInput,
    measures_for,
    reference_split,
)

__all__ = ["IN_DOMAIN_METRICS", "OUT_DOMAIN_METRICS", "OUT_DOMAIN_TAGS", "check_gmm_run",
           "ensemble_log_probs", "ood_tables", "score_ood"]

#: ood.nc name -> uqmetrics metric name (S.1).
IN_DOMAIN_METRICS = {"acc1": "accuracy", "acc5": "top5_accuracy", "nll": "nll", "ece": "ece"}
#: ood.nc name -> variable of :func:`uqmetrics.ood_scores` (S.4).
OUT_DOMAIN_METRICS = {"auc": "auroc", "in_as_in": "in_as_in", "out_as_out": "out_as_out"}
#: ood.nc name -> its metric tag (:func:`uqmetrics.tag_metric`): ``auc`` is the registered
#: ``ood_auroc``; InAsIn and OutAsOut, which uqmetrics does not register, are better higher.
OUT_DOMAIN_TAGS: dict[str, str | tuple[str, bool]] = {
    "auc": "ood_auroc", "in_as_in": ("in_as_in", True), "out_as_out": ("out_as_out", True)}
_SPLITS = ("in_val", "in_test", "out_test")
_ENS = re.compile(r"^(?P<alg>.+)\.sn(?P<sp>\d)\.s(?P<seed>\d+)\.k(?P<k>\d+)\Z")


def check_gmm_run(run: xr.Dataset, path, gmm_fit: str, *, variables=None) -> None:
    """Refuse a run cache (``run``, read from ``path``) that cannot give the GMM fit
    ``gmm_fit``'s values: for a training-split fit
    (:data:`~uqvision.protocols.uimnet.measures.GMM_TRAIN_FITS`), a cache without
    ``<set>_<variable>`` (written before the fit existed) or one whose attr ``uimnet`` records
    another estimator for that variable than the fit's
    (:data:`~uqvision.protocols.uimnet.measures.GMM_COVARIANCE`). ``variables`` (the names the
    file holds) defaults to ``run``'s data variables. A fit on validation reads the features,
    which every run cache holds.

    Raises
    ------
    ValueError
        Naming the file, the fit, the missing or mismatched variable, and what to do.
    """
    if gmm_fit not in GMM_TRAIN_FITS:
        return
    field = GMM_TRAIN_FITS[gmm_fit][0]
    names = set(run.data_vars if variables is None else variables)
    other = sorted(set(GMM_FITS.names()) - {gmm_fit})
    fix = (f"delete its caches/runs and caches/ensembles and rerun 'uqvision reproduce "
           f"uimnet' (or rerun with --overwrite) to recompute the runs, or score with "
           f"gmm_fit in {other} (--set gmm_fit=... / --gmm-fit ...)")
    missing = [f"{s}_{field}" for s in _SPLITS if f"{s}_{field}" not in names]
    if missing:
        raise ValueError(f"run cache {str(path)!r} has no {missing[0]!r}, the values of the "
                         f"GMM fit gmm_fit={gmm_fit!r} (a run cache written before that fit "
                         f"was computed): {fix}")
    recorded = (json.loads(run.attrs.get("uimnet", "{}")).get("gmm_train", {})
                .get("covariance", {}).get(field))
    if recorded is not None and recorded != GMM_COVARIANCE[gmm_fit]:
        raise ValueError(f"run cache {str(path)!r} holds '<set>_{field}' computed as "
                         f"{recorded!r}, not as the GMM fit gmm_fit={gmm_fit!r} now is "
                         f"({GMM_COVARIANCE[gmm_fit]!r}): {fix}")


def _check_cells(members: list[xr.Dataset], ens: xr.Dataset, path, gmm_fit: str,
                 member_paths) -> None:
    """Refuse caches written before the official Jacobian (an ensemble cell without
    ``<set>_jacobian_softmax`` holds the softmax variant under ``<set>_jacobian``) or, for a
    training-split GMM fit, run caches without its values (:func:`check_gmm_run`)."""
    if "in_val_jacobian_softmax" not in ens:
        raise ValueError(f"{str(path)!r} predates the official UIMNET Jacobian (its "
                         "'<set>_jacobian' is the softmax variant): delete caches/ensembles "
                         "and rerun 'uqvision reproduce uimnet' to recompute the ensemble cells")
    for m, p in zip(members, member_paths, strict=True):
        check_gmm_run(m, p, gmm_fit)


def _inputs(members: list[xr.Dataset], ens: xr.Dataset, split: str, calibration: str,
            tau: float) -> MeasureInput:
    def stack(name):
        return np.stack([m[f"{split}_{name}"].values for m in members])

    def jac(name):
        return ens[f"{split}_{name}"].sel(calibration=calibration).values
    gmm = {field: stack(field) if all(f"{split}_{field}" in m for m in members) else None
           for field, _ in GMM_TRAIN_FITS.values()}
    return MeasureInput(
        logits=stack("logits"), temperature=tau if calibration == "temperature" else 1.0,
        labels=members[0][f"{split}_label"].values, features=stack("features"),
        tta=stack("tta"), native=stack("native"), jacobian=jac("jacobian"),
        jacobian_softmax=jac("jacobian_softmax"), **gmm)


def _tta_policy(run: xr.Dataset) -> str:
    """``"<policy> x <count>"`` of a run cache (its ``uimnet`` attr), ``"unknown"`` if absent."""
    cfg = json.loads(run.attrs.get("uimnet", "{}"))
    if "tta_policy" not in cfg:
        return "unknown"
    return f"{cfg['tta_policy']} x {cfg['tta']}"


def ensemble_log_probs(member_logits) -> np.ndarray:
    """``log mean_k softmax(z_k)`` of member logits (member, n, C), shape (n, C) (S.3)."""
    lp = log_softmax(np.asarray(member_logits, np.float64))
    return np.logaddexp.reduce(lp, axis=0) - np.log(lp.shape[0])


def _log_mean_probs(inp: MeasureInput) -> np.ndarray:
    return ensemble_log_probs(inp.logits)


def _score_ensemble(ens: xr.Dataset, path, *, fit_fraction: float, split_seed: int,
                    gmm_fit: str, checksums: dict[str, str]
                    ) -> tuple[dict, dict, float, tuple[int, int], set]:
    """One ensemble cell's in-domain and out-domain metrics, τ̂, the reference split's sizes
    and the runs' TTA policies; the checksum of each member's run cache is added to
    ``checksums`` (path -> checksum)."""
    paths = json.loads(ens.attrs["members"])
    members = [read_dataset(p) for p in paths]
    for p, m in zip(paths, members, strict=True):
        if str(p) not in checksums:
            checksums[str(p)] = input_checksum(m)
    _check_cells(members, ens, path, gmm_fit, paths)
    measures = measures_for(gmm_fit)
    tau = float(ens.attrs["temperature"])
    val = _inputs(members, ens, "in_val", "none", tau)
    test = _inputs(members, ens, "in_test", "none", tau)
    ind = temperature_scaled_metrics(
        _log_mean_probs(test), test.labels, protocol="holdout",
        metrics=tuple(IN_DOMAIN_METRICS.values()), calib_logits=_log_mean_probs(val),
        calib_labels=val.labels)
    in_domain = {name: ind[m].values for name, m in IN_DOMAIN_METRICS.items()}
    fit, held = reference_split(val.labels, fit_fraction=fit_fraction, seed=split_seed)
    out_domain = defaultdict(dict)
    for cal in ("none", "temperature"):
        sets = {s: _inputs(members, ens, s, cal, tau) for s in _SPLITS}
        in_val = sets["in_val"]
        fit_set, held_set = in_val.subset(fit), in_val.subset(held)
        for name, measure in measures.items():
            # (reference the measure is fitted on, the set its threshold is the quantile of)
            ref, theta_set = (fit_set, held_set) if measure.fitted else (in_val, in_val)
            u = {s: measure(sets[s], ref) for s in ("in_test", "out_test")}
            u["in_val"] = measure(theta_set, ref)
            if any(not np.isfinite(v).all() for v in u.values()):
                out_domain[(name, cal)] = {k: np.nan for k in OUT_DOMAIN_METRICS}
                continue
            sc = ood_scores(u["in_val"], u["in_test"], u["out_test"])
            out_domain[(name, cal)] = {k: float(sc[v]) for k, v in OUT_DOMAIN_METRICS.items()}
    return (in_domain, out_domain, float(ind["temperature"].values.mean()),
            (len(fit), len(held)), {_tta_policy(m) for m in members})


def score_ood(caches, *, ks=(1, 5), fit_fraction: float = 0.5, split_seed: int = 0,
              gmm_fit: str = DEFAULT_GMM_FIT) -> xr.Dataset:
    """Score a UIMNET ``caches`` folder (``runs/`` and ``ensembles/``) into one Dataset.

    Parameters
    ----------
    caches : path
        The folder :func:`uqvision.protocols.uimnet.reproduce.run_uimnet` writes.
    ks : sequence of int
        Ensemble sizes to report (cells of other sizes are ignored).
    fit_fraction : float in (0, 1), default 0.5
        Share of in-domain validation a fitted measure (``gmm`` with the
        ``validation-ledoit-wolf`` fit) is fitted on; its thresholds are the quantiles of u on
        the rest (:func:`uqvision.protocols.uimnet.measures.reference_split`).
    split_seed : int, default 0
        Seed of that class-stratified split (the same split for every ensemble of a data seed:
        they share the in-domain validation set).
    gmm_fit : str, default :data:`~uqvision.protocols.uimnet.measures.DEFAULT_GMM_FIT`
        The fit of the ``gmm`` measure, a name in
        :data:`~uqvision.protocols.uimnet.measures.GMM_FITS`: ``train-ledoit-wolf`` (class
        Gaussians of each run's in-domain training split, Ledoit–Wolf covariances) or
        ``official`` (the same, sample covariance + 0.1 I), both read from the run caches and
        fitting nothing on validation, or ``validation-ledoit-wolf`` (a fitted measure).

    Returns
    -------
    xarray.Dataset
        ``acc1``, ``acc5``, ``nll``, ``ece`` over (algorithm, k, calibration, spectral, stat);
        ``auc``, ``in_as_in``, ``out_as_out`` over (algorithm, measure, k, calibration,
        spectral, stat); ``temperature`` and ``members`` over (algorithm, k, spectral, stat);
        ``oracle_auc``, ``oracle_in_as_in``, ``oracle_out_as_out`` over ``stat``; ``stat`` =
        mean, std over data seeds (``n_data_seeds`` in attrs). The metric variables carry the
        result-file schema's tag (``metric``: :data:`IN_DOMAIN_METRICS`' names and
        :data:`OUT_DOMAIN_TAGS`; ``greater_is_better``), the attrs the schema's (``protocol =
        "uimnet"``, ``conventions``, ``input_checksums``: of the ensemble cells, their
        members' run caches and the oracles; :func:`uqmetrics.stamp_result`); attr ``notes``
        the protocol's conventions in words. Attr ``reference_split`` (JSON)
        records the fitted measures' split: the measures, ``fit_fraction``, ``seed``, the
        stratification and, per data seed, the fit and threshold sample counts (no measure
        with a training-split GMM fit); attr ``gmm_fit`` the GMM fit, ``gmm_covariance`` its
        estimator (:data:`uqvision.protocols.uimnet.measures.GMM_COVARIANCE`); attr
        ``tta_policy`` the runs' TTA policy and augmentation count (JSON, from the run
        caches; ``unknown`` for caches that do not record it); ``caches`` and ``entries``
        (each algorithm's ensemble cells, run caches and the oracles, and their provenance:
        :mod:`uqvision.provenance`).

    Raises
    ------
    ValueError
        For caches that cannot give ``gmm_fit``'s values (:func:`check_gmm_run`: a run cache
        written before that fit, or under another estimator), or that predate UIMNET's
        Jacobian; nothing is written.

    Notes
    -----
    θ of a measure is the 95 % quantile of its u on in-domain validation, except for a fitted
    measure (``gmm`` fitted on validation), whose θ is the 95 % quantile on the held-out part
    of the split it was not fitted on. Given the fit, held-out and in-domain test images are
    exchangeable, so E[InAsIn] ≈ 0.95 for every measure when in-domain validation and test
    come from one distribution; θ on the fitted part itself would be an in-sample quantile.
    """
    if not 0.0 < float(fit_fraction) < 1.0:
        raise ValueError(f"fit_fraction must lie in (0, 1), got {fit_fraction!r}")
    chosen = measures_for(gmm_fit)
    caches = Path(caches)
    cells = {}
    for p in sorted((caches / "ensembles").glob("*.nc")):
        m = _ENS.match(p.stem)
        if m and int(m["k"]) in ks:
            cells[(m["alg"], int(m["k"]), bool(int(m["sp"])), int(m["seed"]))] = p
    if not cells:
        raise ValueError(f"caches: no ensemble cell in {str(caches / 'ensembles')!r}")
    algs = list(dict.fromkeys(a for a, *_ in cells))
    kk = sorted({k for _, k, _, _ in cells})
    sps = sorted({sp for _, _, sp, _ in cells})
    seeds = sorted({s for *_, s in cells})
    cal = ["none", "temperature"]
    meas = MEASURES.names()
    shape_in = (len(algs), len(kk), len(cal), len(sps), len(seeds))
    shape_out = (len(algs), len(meas), len(kk), len(cal), len(sps), len(seeds))
    raw = {n: np.full(shape_in, np.nan) for n in IN_DOMAIN_METRICS}
    raw.update({n: np.full(shape_out, np.nan) for n in OUT_DOMAIN_METRICS})
    temp = np.full((len(algs), len(kk), len(sps), len(seeds)), np.nan)
    n_members = np.full_like(temp, np.nan)
    split_sizes = {}
    tta_policies = set()
    checksums: dict[str, str] = {}  # every input file: path -> checksum
    row_files: dict[str, list] = defaultdict(list)  # algorithm -> its cells and run caches
    for (alg, k, sp, s), path in cells.items():
        ens = read_dataset(path)
        row_files[alg] += [ens, *json.loads(ens.attrs["members"])]
        checksums[str(path)] = input_checksum(ens)
        i, j, q, r = algs.index(alg), kk.index(k), sps.index(sp), seeds.index(s)
        ind, outd, tau, sizes, policies = _score_ensemble(
            ens, path, fit_fraction=fit_fraction, split_seed=split_seed, gmm_fit=gmm_fit,
            checksums=checksums)
        tta_policies |= policies
        split_sizes[str(s)] = {"n_fit": sizes[0], "n_threshold": sizes[1]}
        for n, v in ind.items():
            raw[n][i, j, :, q, r] = v
        for (mname, c), vals in outd.items():
            for n, v in vals.items():
                raw[n][i, meas.index(mname), j, cal.index(c), q, r] = v
        temp[i, j, q, r] = tau
        n_members[i, j, q, r] = len(json.loads(ens.attrs["members"]))
    dims_in = ("algorithm", "k", "calibration", "spectral", "data_seed")
    dims_out = ("algorithm", "measure", "k", "calibration", "spectral", "data_seed")
    ds = xr.Dataset(
        {**{n: (dims_in, raw[n]) for n in IN_DOMAIN_METRICS},
         **{n: (dims_out, raw[n]) for n in OUT_DOMAIN_METRICS},
         "temperature": (("algorithm", "k", "spectral", "data_seed"), temp),
         "members": (("algorithm", "k", "spectral", "data_seed"), n_members)},
        coords={"algorithm": algs, "k": kk, "calibration": cal, "spectral": sps,
                "data_seed": seeds, "measure": meas})
    oracle = []
    for s in seeds:
        path = caches / "runs" / f"oracle.s{s}.nc"
        if path.exists():
            o = read_dataset(path)
            checksums[str(path)] = input_checksum(o)
            for files in row_files.values():  # the oracle row of every algorithm's entry
                files.append(o)
            sc = ood_scores(o["in_val_u"].values, o["in_test_u"].values, o["out_test_u"].values)
            oracle.append([float(sc[v]) for v in OUT_DOMAIN_METRICS.values()])
    for i, n in enumerate(OUT_DOMAIN_METRICS):
        vals = [row[i] for row in oracle]
        ds[f"oracle_{n}"] = ("data_seed", vals + [np.nan] * (len(seeds) - len(vals)))
    out = xr.concat([ds.mean("data_seed"), ds.std("data_seed", ddof=1)],
                    dim=xr.DataArray(["mean", "std"], dims="stat", name="stat"))
    out = out.transpose(..., "stat")
    fitted = [m for m in meas if chosen[m].fitted]
    notes = ("UIMNET (docs/conventions.md#v-3): S.1 in-domain on in-domain test, tau fitted "
             "on in-domain validation (holdout); S.4 out-domain, theta = 95% quantile of u on "
             "in-domain validation, except for fitted measures ("
             + (", ".join(fitted) or "none") + "): fitted on the reference_split 'fit' part "
             "of in-domain validation, theta = 95% quantile of u on the held-out 'threshold' "
             "part; out_as_out = fraction of OUT-domain flagged; jacobian and "
             "jacobian_softmax on a seeded class-stratified subset of jacobian_max images of "
             "each set, jacobian NaN for ensembles of several networks and MC dropout "
             "(UIMNET's code); gmm fit: " + gmm_fit + "; one predictor per ensemble and "
             "calibration, softmax(log mean_k softmax(z_k) / tau), for every metric and "
             "measure; tau and the top-K members are also chosen on in-domain validation (not "
             "corrected)")
    metrics = {**IN_DOMAIN_METRICS, **OUT_DOMAIN_TAGS,
               **{f"oracle_{n}": tag for n, tag in OUT_DOMAIN_TAGS.items()}}
    stamp_result(out, "uimnet", input_checksums=checksums.values(), metrics=metrics,
                 config={"ks": list(ks), "fit_fraction": fit_fraction,
                         "split_seed": split_seed, "gmm_fit": gmm_fit},
                 notes=notes, extra={
                     "n_data_seeds": len(seeds),
                     "reference_split": json.dumps({
                         "measures": fitted, "fit_fraction": fit_fraction, "seed": split_seed,
                         "stratified_by": "in_val_label",
                         "method": "uqvision.protocols.uimnet.measures.reference_split "
                                   "(uqmetrics calibration_splits, stratified_holdout)",
                         "sizes_by_data_seed": split_sizes}),
                     "gmm_fit": gmm_fit,
                     "gmm_covariance": GMM_COVARIANCE[gmm_fit],
                     "tta_policy": json.dumps(sorted(tta_policies)),
                     **entry_provenance(row_files, "algorithm")})
    return out


def _fmt(ds: xr.Dataset, var: str, **sel) -> str:
    m = float(ds[var].sel(stat="mean", **sel))
    s = float(ds[var].sel(stat="std", **sel))
    return "—" if np.isnan(m) else (f"{m:.3f}" if np.isnan(s) else f"{m:.3f} ± {s:.3f}")


def ood_tables(ds: xr.Dataset, *, measure: str = "entropy") -> str:
    """Markdown analogues of the paper's Table 2 (in-domain) and Table 3 (out-domain, one
    measure), plus the mean AUC of every measure (the paper's appendix B ranking)."""
    lines = ["### In-domain (Table 2 analogue)", "",
             "| algorithm | k | calibration | spectral | acc1 | acc5 | nll | ece |",
             "|---|---|---|---|---|---|---|---|"]
    rows = [(a, k, c, sp) for a in ds.algorithm.values for k in ds.k.values
            for c in ds.calibration.values for sp in ds.spectral.values]
    def kk(a, k, sp):  # requested K (members actually averaged, when fewer trials exist)
        n = float(ds["members"].sel(algorithm=a, k=k, spectral=sp, stat="mean"))
        return f"{k}" if n == k else f"{k} ({n:g})"

    for a, k, c, sp in rows:
        sel = {"algorithm": a, "k": k, "calibration": c, "spectral": sp}
        lines.append(f"| {a} | {kk(a, k, sp)} | {c} | {bool(sp)} | " + " | ".join(
            _fmt(ds, v, **sel) for v in IN_DOMAIN_METRICS) + " |")
    lines += ["", f"### Out-domain, measure '{measure}' (Table 3 analogue)", "",
              "| algorithm | k | calibration | spectral | auc | in_as_in | out_as_out |",
              "|---|---|---|---|---|---|---|"]
    for a, k, c, sp in rows:
        sel = {"algorithm": a, "k": k, "calibration": c, "spectral": sp, "measure": measure}
        lines.append(f"| {a} | {kk(a, k, sp)} | {c} | {bool(sp)} | " + " | ".join(
            _fmt(ds, v, **sel) for v in OUT_DOMAIN_METRICS) + " |")
    lines.append("| oracle | | | | " + " | ".join(
        _fmt(ds, f"oracle_{v}") for v in OUT_DOMAIN_METRICS) + " |")
    lines += ["", "### Measures: AUC averaged over algorithms, k, calibration, spectral", "",
              "| measure | auc | in_as_in | out_as_out |", "|---|---|---|---|"]
    for mname in ds.measure.values:
        sub = ds.sel(measure=mname, stat="mean")
        lines.append(f"| {mname} | " + " | ".join(
            f"{float(sub[v].mean(skipna=True)):.3f}" for v in OUT_DOMAIN_METRICS) + " |")
    return "\n".join(lines) + "\n"
