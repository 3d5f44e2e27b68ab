"""The metric conventions of docs/conventions.md#s, as written into result-file attrs.

Each entry names a convention on which peer implementations disagree and the choice this
package makes by default. Every registered metric (:mod:`uqmetrics.metrics.registry`) has an entry
under its registered name. :func:`uqmetrics.runs.io.provenance_attrs` stores this mapping (JSON) in
every result file, so that a number can always be traced to its definition. The prefix of
each entry (``S.1`` ... ``S.6``, ``R.4``) names the section of ``docs/conventions.md`` that
explains it (anchors ``#s-1`` ... ``#s-6``, ``#r-4``).
"""

__all__ = ["CONVENTIONS", "COVERAGE_Z"]

#: Half-width multiplier of the central 95% Gaussian interval, the 0.975 quantile of the
#: standard normal distribution; the default ``z`` of every coverage function
#: (docs/conventions.md#r-4). Written out: ``float(scipy.special.ndtri(0.975))`` exactly
#: (``tests/test_regression.py`` checks it against ``scipy.stats.norm.ppf``), so that every
#: result file's provenance does not import scipy.
COVERAGE_Z: float = 1.959963984540054

_ECE = ("15 bins on top-1 confidence, (j-1/M, j/M] left-open right-closed, 0 in the first bin, "
        "empty bins skipped, weights |B|/n")
_SELECTIVE = "correct = argmax p == y; kappa = the confidence function (default softmax response)"

CONVENTIONS: dict[str, str] = {
    # classification (labels, probs)
    "accuracy": "S.1: top-1, argmax returns the first maximum on ties",
    "top5_accuracy": "S.1: label among the 5 most probable classes, ties broken towards the "
    "first class as argmax does",
    "nll": "S.1: mean -log p_y, p clipped at 1e-12",
    "brier": "S.1: mean over samples of sum over classes (p_c - 1[c=y])^2, not divided by C",
    # calibration (labels, probs), S.1
    "ece": f"S.1: equal-width {_ECE}",
    "ece_quantile": f"S.1: equal-mass (quantile) {_ECE}",
    "mce": "S.1: max over non-empty equal-width bins of |acc - conf|, bins as ece",
    "confidence_ece": "S.1: ece of any confidence in [0, 1] against correctness, bins as ece",
    "sce": "S.1: classwise ece, 15 equal-width bins per class, mean over classes (Nixon 2019)",
    "ace": "S.1: classwise ece over the p > 0, per class the sorted p cut by position into 15 bins "
    "of floor(n_k/15), the remainder in the last; ties by label (other classes first); bins "
    "weighted |B|/n, mean over all classes (Nixon 2019; Ashukha 2020 code, get_ace)",
    "tace": "S.1: ace over the predictions p > 1e-3 (strict) only, bins weighted |B|/n over all n, "
    "mean over all C classes (Ashukha 2020 eq. 2 as their code get_tace; not |B|/n_k)",
    "temperature_scaling": "S.1: one scalar T>0 minimising NLL, bounded 1-D search over log T",
    # selective (correct, confidence), S.2
    "auroc": "S.2: tie-aware Mann-Whitney (ties count 1/2), NaN with a warning if a class is empty",
    "aupr": "S.2: average precision of the correct predictions ranked by kappa (no interpolation)",
    "aupr_wrong": "S.2: average precision of the wrong predictions ranked by -kappa",
    "aurc": "S.2: (1/N) sum_i e_i/i, kappa descending, errors spread evenly over tied blocks",
    "eaurc": "S.2: AURC minus AURC of the exact empirical oracle ranking",
    "sac": "S.2: largest coverage k/N with top-k accuracy >= alpha, k at distinct-kappa boundaries",
    "sac_95": "S.2: sac at alpha = 0.95",
    "sac_99": "S.2: sac at alpha = 0.99",
    "sac_first_drop": "S.2: official-code SAC: first 0-based index, after a 200-sample burn-in, at "
    "which top-i accuracy < alpha (else the first from 0; 0 if none), divided by N + 1; ties spread",
    "sac_95_first_drop": "S.2: sac_first_drop at alpha = 0.95",
    "sac_99_first_drop": "S.2: sac_first_drop at alpha = 0.99",
    "aurc_c": "S.2: mean selective risk e_i/i over the coverages i/N in [0, 0.5], kappa "
    "descending, errors spread evenly over tied blocks (aurc over (0, 1] = aurc)",
    "eaurc_c": "S.2: aurc_c minus aurc_c of the exact empirical oracle ranking, same coverages",
    "selective": f"S.2: {_SELECTIVE}",
    "softmax_response": "S.2: max softmax probability computed in float64",
    # ensembles, S.3
    "ensemble": "S.3: log pbar = logsumexp_k log p_k - log K",
    "dee": "S.3: smallest real l>=1 with interpolated DE mean CLL(l) >= method CLL; capped at max DE size",
    # OOD (u_in, u_out), S.4
    "ood": "S.4: out-domain positive; theta = 95% quantile of in-domain validation u",
    "ood_auroc": "S.4: P(u_out > u_in) + 1/2 P(tie), the tie-aware AUROC with out-domain positive",
    "fpr_at_95_tpr": "S.4: OpenOOD v1.5/pytorch-ood: out-domain positive scored by u; fraction of "
    "in-domain u >= t at the first threshold t (distinct u, descending, ties entering together) "
    "with #{u_out >= t}/n_out >= 0.95 (float division); no interpolation, no dropped ROC points; "
    "positive='in' is the in-domain-positive variant (OOD accepted at 95% in-domain TPR)",
    "aupr_in": "S.4: average precision (step-wise, sklearn average_precision_score, ties grouped) "
    "of the in-domain samples ranked by -u; curve='trapezoid' is OpenOOD's auc(recall, precision)",
    "aupr_out": "S.4: average precision (step-wise, sklearn average_precision_score, ties grouped) "
    "of the out-domain samples ranked by u; curve='trapezoid' is OpenOOD's auc(recall, precision)",
    # retrieval (embeddings, labels, uncertainty), S.5
    "retrieval": "S.5: cosine similarity, query excluded from its own neighbours",
    "recall_at_1": "S.5: mean 1[y_nn(i) = y_i], cosine nearest neighbour, query excluded, ties to "
    "the lowest index",
    "r_auroc": "S.5: AUROC of u for detecting Recall@1 errors (wrong neighbours positive)",
    # regression (y, mean, std), S.6
    "gaussian_nll": "S.6: mean -log N(y; mean, std^2) including 0.5 log(2 pi)",
    "crps": "S.6: closed-form CRPS of N(mean, std^2) (Gneiting and Raftery 2007, eq. 21)",
    "interval_width": f"S.6: mean width 2 z std of the central interval, z = {COVERAGE_Z!r}",
    "calibration_curve": "S.6: expected p = linspace(0, 1, 100) against the observed fraction of "
    "y in the closed central Gaussian interval [mean + std Phi^-1(1/2 - p/2), mean + std "
    "Phi^-1(1/2 + p/2)] (prop_type='interval', uncertainty-toolbox's) or y <= mean + std "
    "Phi^-1(p) ('quantile'; the toolbox counts y >= the 1 - p quantile instead)",
    "mace": "S.6: mean over the 100 proportions of |observed - expected| of the calibration curve "
    "(uncertainty-toolbox mean_absolute_calibration_error)",
    "rmsce": "S.6: sqrt of the mean over the 100 proportions of (observed - expected)^2",
    "miscalibration_area": "S.6: area between the piecewise-linear calibration curve and the "
    "diagonal, split into two triangles where it crosses (uncertainty-toolbox miscalibration_area)",
    "adversarial_group_mace": "S.6: mean over group fractions linspace(0, 1, 10) of the mean over "
    "10 trials of the worst MACE of 10 random groups of max(round(n r), 2) points drawn without "
    "replacement, rng seed 0 (the toolbox's curve, summarised by its mean)",
    "sharpness": "S.6: sqrt(mean(std^2)), lower is sharper (uncertainty-toolbox sharpness)",
    "check_score": "S.6: pinball loss (1[y <= q] - tau)(q - y) of the Gaussian quantiles at tau = "
    "0.01, ..., 0.99 (99 levels), mean over points and levels",
    "interval_score": "S.6: Gneiting-Raftery interval score (u - l) + (2/alpha)(l - y)1[y < l] + "
    "(2/alpha)(y - u)1[y > u], alpha = 1 - p, central Gaussian intervals at p = 0.01, ..., 0.99, "
    "mean over points and p",
    "pit_ks": "S.6: Kolmogorov-Smirnov distance sup|F_n(u) - u| of the PIT values Phi((y - mean) / "
    "std) from uniform; histogram: equal-width bins, Pearson chi2 against n/bins",
    "recalibration": "S.6: fitted on a calibration split, applied to a test split; isotonic: "
    "increasing least-squares map observed -> expected proportions of the 100-point interval "
    "curve, linear interpolation clipped to the fitted range (Kuleshov 2018; toolbox iso_recal); "
    "sigma-scaling: std * s, by default (criterion='nll') the NLL-optimal s = sqrt(mean ((y - "
    "mean) / std)^2) (Laves 2020); criterion='mace' (or 'rmsce', 'miscalibration_area'): s "
    "minimising that calibration error by bounded Brent over [0.01, 100], the toolbox's "
    "optimize_recalibration_ratio",
    "coverage": "S.6/R.4: fraction of repetitions with |prediction - truth| < z * uncertainty, "
    f"strict <, z = {COVERAGE_Z!r} (the 0.975 normal quantile)",
    "coverage_interval": "S.6/R.4: Wilson (default) or Clopper-Pearson, plus sqrt(p(1-p)/k) bars",
    # distribution shift (aggregates and label-space accuracies, not registered), S.7
    "corruption_error": "S.7: CE_c = sum_s E_sc / sum_s E^base_sc over the severities, a "
    "fraction (not x100); baseline sum > 0 (Hendrycks and Dietterich 2019)",
    "mean_corruption_error": "S.7: mCE = mean over corruptions of CE_c, each normalised by the "
    "baseline before averaging; a fraction (not x100)",
    "relative_mean_corruption_error": "S.7: mean over corruptions of sum_s (E_sc - E_clean) / "
    "sum_s (E^base_sc - E^base_clean); a fraction, may be negative; denominators > 0",
    "real_accuracy": "S.7: top-1 (first maximum on ties) in the image's ReaL label set; images "
    "with an empty set left out; NaN with a warning if none has a label (Beyer 2020)",
    "masked_accuracy": "S.7: argmax over the masked classes only (logits or probs; ties to the "
    "lowest class index), labels in the full class space and inside the mask (ImageNet-A/R)",
    # conformal prediction sets (uqmetrics.metrics.conformal, functions of (sets, labels); not registered
    # metrics: the metric kinds have no (sets, labels) signature), S.8
    "conformal_scores": "S.8: higher = less conforming; thr = 1 - p_y; aps = mass of the classes "
    "ranked above y + U p_y; raps = aps + lam max(0, o(x,y) - k_reg), o the 1-based rank; classes "
    "ranked by decreasing p, ties by class index (lower first); ONE uniform U per sample (not per "
    "class, U = 1 unless randomized; never on the penalty), the same U for the sample's "
    "calibration score and all its class scores",
    "conformal_quantile": "S.8: qhat = the ceil((n+1)(1-alpha))-th smallest of the n calibration "
    "scores (np.quantile at ceil((n+1)(1-alpha))/n, method='lower', as MAPIE); +inf when "
    "ceil((n+1)(1-alpha)) > n; Mondrian: the same within each class's calibration samples",
    "conformal_sets": "S.8: {y: s(x,y) <= qhat} (non-strict; empty sets allowed, no top-1 "
    "forced); Mondrian: s(x,y) <= qhat_y",
    "raps_tuning": "S.8: on a tuning split (default the first ceil(0.33 n_cal) of the calibration "
    "samples, Table 1's pct_paramtune, which then do not calibrate): k_reg = 1 + quantile(0-based "
    "true-label ranks, 1 - alpha, method='higher'); lam = argmin over (1e-3, 1e-2, 0.1, 0.2, 0.5) "
    "of the mean set size when calibrated and evaluated on the tuning split, first on ties "
    "(official pick_kreg/pick_lamda_size)",
    "conformal_coverage": "S.8: marginal coverage, fraction of test samples with y in the set",
    "mean_set_size": "S.8: mean number of classes in the test sets (empty sets count 0)",
    "median_set_size": "S.8: numpy median of the test set sizes (mean of the middle two)",
    "empty_fraction": "S.8: fraction of test sets that are empty",
    "sscv": "S.8: size-stratified coverage violation, max over non-empty strata of |coverage - "
    "(1 - alpha)|, strata 0-1, 2-3, 4-6, 7-10, 11-100, 101-1000 inclusive (official RAPS code); "
    "sizes in no stratum ignored; NaN if all strata are empty",
    "covgap": "S.8: mean over the classes present in the test labels of |class coverage - "
    "(1 - alpha)|, a fraction, not x100 (Ding et al. 2023)",
    "conformal_trials": "S.8: trials random permutations (default_rng(seed)), then uniforms "
    "(trials, n) from the same generator; per trial [tune | calibrate] = first n_cal, test = "
    "the rest; metrics per trial, not averaged; baselines (not conformal): naive = APS sets at "
    "qhat = 1 - alpha (official gcq, randomized, empty sets allowed), topk = the official fixed "
    "set size k of the calibration ranks, randomized; temperatures: optionally one per trial "
    "(official 'Platt': fitted on the trial's calibration draw)",
}
