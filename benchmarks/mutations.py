"""Mutation checks: does each known-wrong edit of the source make at least one test fail?

Each :class:`Mutation` is one string replacement in one source file (a bug a fidelity review
found, or could reintroduce) and the tests that must catch it. The tests of one mutation belong
to one of the :data:`PACKAGES` (uqmetrics: ``shared/tests``, uqreg: ``packages/uqreg/tests``,
uqvision: ``packages/uqvision/tests``), found from their paths; the package says which source
trees are copied, where pytest runs (its pyproject.toml configures it) and which interpreter
runs it (``.tox/<env>/bin/python``, the package's tox environment; this interpreter if that
environment does not exist). For each mutation the script copies those source trees into a
temporary folder, applies the replacement there (the working tree is never touched), runs the
tests with ``PYTHONPATH`` pointing at the copy (ahead of the installed packages) and prints one
Markdown row::

    mutation | package | test file | killed?

"killed" when pytest fails; "SURVIVED" when the tests pass on the mutant (the tests do not
bite); "not applied" when the text to replace does not occur exactly once (the source moved
on: update the entry), a named test file does not exist, or the mutated file is not what the
tests import. Run from the repository root::

    python benchmarks/mutations.py [--only NAME ...] [--baseline] [--verbose]

``--baseline`` first runs every chosen mutation's tests on an unmutated copy (they must pass,
or a "killed" means nothing). Exit status 0 when every applied mutation is killed, 1 otherwise.
The tests run as tox runs them (``MPLBACKEND=Agg``, ``HYPOTHESIS_PROFILE=ci``: derandomised
hypothesis, ``PYTHONHASHSEED=0``, ``OMP_NUM_THREADS=2``) unless the environment sets these.

To add one, append a :class:`Mutation` to :data:`MUTATIONS`: ``file`` relative to the
repository root, ``old`` the exact text (it must occur once), ``new`` its replacement, ``tests``
pytest node ids or files relative to the repository root, all of one package.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900
#: The environment of the tests, as tox.ini's ``setenv`` (a value already set is kept).
TEST_ENV = {"MPLBACKEND": "Agg", "HYPOTHESIS_PROFILE": "ci", "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "2"}


@dataclass(frozen=True)
class Package:
    """Where a package's tests run: ``root`` (pytest's working folder, holding ``tests/``),
    ``env`` (its tox environment) and ``sources`` (the source trees copied for a mutant, each a
    ``PYTHONPATH`` entry)."""

    name: str
    root: str
    env: str
    sources: tuple[str, ...]

    def python(self) -> str:
        """The tox environment's interpreter, or this one where the environment is missing."""
        exe = REPO / ".tox" / self.env / "bin" / "python"
        return str(exe) if exe.exists() else sys.executable


PACKAGES = (
    Package("uqmetrics", "shared", "uqmetrics", ("shared/src",)),
    Package("uqreg", "packages/uqreg", "uqreg", ("packages/uqreg/src", "shared/src")),
    Package("uqvision", "packages/uqvision", "uqvision", ("packages/uqvision/src", "shared/src")),
)


@dataclass(frozen=True)
class Mutation:
    """One wrong edit: replace ``old`` (occurring exactly once in ``file``) by ``new``; at
    least one of ``tests`` (all of one package's tests) must then fail."""

    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]

    @property
    def package(self) -> Package:
        """The package whose ``tests/`` folder holds every one of :attr:`tests`."""
        found = {next((p for p in PACKAGES if t.startswith(f"{p.root}/tests/")), None)
                 for t in self.tests}
        if len(found) != 1 or None in found:
            raise ValueError(f"mutation {self.name!r}: its tests must all be of one package's "
                             f"tests/ folder ({', '.join(p.root for p in PACKAGES)}), got "
                             f"{self.tests}")
        return found.pop()


_METHODS = "packages/uqvision/src/uqvision/methods/"
_SWAG, _VI, _LAPLACE, _CSGLD = (_METHODS + m + ".py" for m in ("swag", "vi", "laplace", "csgld"))
_SAMPLING = "packages/uqvision/tests/methods/test_methods_sampling.py"
_CLS = "shared/src/uqmetrics/metrics/classification.py"
_CLS_TESTS = "shared/tests/test_classification.py"

# evaluation as a whole (R.6 CQR, R.7, R.9, S.6, S.9, V.8): the modules and their tests
_UQREG_DIS = "packages/uqreg/src/uqreg/disentangle.py"
_UQREG_DIS_TESTS = "packages/uqreg/tests/test_disentangle.py"
_UQREG_DIS_NEW = "packages/uqreg/tests/test_mutants_disentangle.py"
_UQREG_CONF = "packages/uqreg/src/uqreg/conformal.py"
_CONFORMAL = "shared/src/uqmetrics/metrics/conformal.py"
_CQR_TESTS = "packages/uqreg/tests/test_cqr.py"
_UQREG_CQR_NEW = "packages/uqreg/tests/test_mutants_cqr.py"
_REAL = "packages/uqreg/src/uqreg/real.py"
_REAL_TESTS = "packages/uqreg/tests/test_real.py"
_REAL_NEW = "packages/uqreg/tests/test_mutants_real.py"
_REG = "shared/src/uqmetrics/metrics/regression.py"
_REG_TOOLBOX = "shared/tests/test_regression_toolbox.py"
_REG_SCORING = "shared/tests/test_regression_scoring.py"
_ADVERSARIAL_TOOLBOX = (f"{_REG_TOOLBOX}"
                        "::test_adversarial_group_calibration_equals_the_toolbox_on_equal_draws")
_DIS = "shared/src/uqmetrics/metrics/disentangle.py"
_DIS_TESTS = "shared/tests/test_disentangle_estimators.py"
_DIS_NEW = "shared/tests/test_mutants_disentangle.py"
_VDIS = "packages/uqvision/src/uqvision/protocols/disentangle/score.py"
_VDIS_TESTS = "packages/uqvision/tests/protocols/disentangle/test_disentangle.py"
_VDIS_NEW = "packages/uqvision/tests/test_mutants_disentangle.py"
#: the tests of test_disentangle.py that score caches (not the slow smoke reproduction), then ours
_VDIS_SCORED = (*(f"{_VDIS_TESTS}::test_{t}" for t in (
    "an_estimate_of_the_true_entropy_ranks_it_perfectly",
    "disagreement_detects_ood_and_shift_perfectly",
    "every_value_equals_a_direct_call_on_the_same_arrays")), _VDIS_NEW)

#: The mutations, extensible: append entries (see the module docstring).
MUTATIONS: list[Mutation] = [
    Mutation("SWAG draws with scale in place of sqrt(scale)", _SWAG,
             "w = mean + math.sqrt(hp.scale) * z", "w = mean + hp.scale * z",
             (f"{_SAMPLING}::test_swag_sample_covariance_is_diagonal_plus_low_rank",)),
    Mutation("SWAG without 1/sqrt(K-1) on the low-rank part", _SWAG,
             "dtype=torch.float64) \\\n                    / math.sqrt(len(dev) - 1)",
             "dtype=torch.float64)",
             (f"{_SAMPLING}::test_swag_sample_covariance_is_diagonal_plus_low_rank",)),
    Mutation("VI prior precision wd in place of N wd", _VI,
             "prior_precision = state.n_train * hp.weight_decay",
             "prior_precision = hp.weight_decay",
             (f"{_SAMPLING}::test_vi_kl_uses_the_prior_precision_n_wd",)),
    Mutation("BatchNorm refresh of sampled weights disabled",
             "packages/uqvision/src/uqvision/training/method.py",
             "if enabled and state.bn_loader is not None and has_batchnorm(state.net):",
             "if False and state.bn_loader is not None and has_batchnorm(state.net):",
             (f"{_SAMPLING}::test_sampled_weights_get_their_own_batchnorm_statistics",)),
    Mutation("VI convolutions: per-position noise (local reparameterisation)", _VI,
             "        gens = self.noise_generators\n"
             "        if gens is None:  # training: one kernel draw for the batch",
             "        gens = self.noise_generators\n"
             "        if True:\n"
             "            return self._sample(self._conv_forward(x, self.weight, self.bias),"
             " self._conv_forward(x * x, sigma ** 2, None))\n"
             "        if gens is None:  # training: one kernel draw for the batch",
             (f"{_SAMPLING}::test_vi_conv_samples_kernels_not_positions",)),
    Mutation("snapshot curves over random subsets (snapshots treated as exchangeable)",
             "packages/uqvision/src/uqvision/protocols/pitfalls/score.py",
             "return TRAINING_METHODS.lookup(self.training_method).samples is snapshot_samples",
             "return False",
             (("packages/uqvision/tests/protocols/pitfalls/test_pitfalls_score.py"
              "::test_snapshot_curves_follow_training_order"),)),
    Mutation("missing training folder: BatchNorm refresh skipped silently",
             "packages/uqvision/src/uqvision/training/runs.py",
             "if not folder or not Path(folder).is_dir():", "if False:",
             (("packages/uqvision/tests/training/test_training_loop.py"
              "::test_start_from_a_checkpoint_cumulates_its_cost"),)),
    Mutation("K-FAC Laplace scale grid never extended", _LAPLACE,
             "for _ in range(int(max_extensions)):", "for _ in range(0):",
             (("packages/uqvision/tests/methods/test_methods_registry.py"
              "::test_laplace_scale_search_extends_past_an_edge_optimum"),)),
    Mutation("URL Losspred: target loss not detached (the CE is trained towards u)",
             "packages/uqvision/src/uqvision/methods/representation.py",
             '((out["scalar"] - ce.detach()) ** 2)', '((out["scalar"] - ce) ** 2)',
             (("packages/uqvision/tests/protocols/url/test_url_losses.py"
               "::test_losspred_target_is_detached"),)),
    Mutation("DUE: KL weighted by the batch size instead of the training-set size",
             "packages/uqvision/src/uqvision/methods/due.py",
             "num_data=state.n_train)", "num_data=len(y))",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_methods.py"
               "::test_due_loss_is_the_negative_elbo_and_predictions_are_distributions"),)),
    Mutation("UIMNET extractor trained on the caller's thread count",
             "packages/uqvision/src/uqvision/protocols/uimnet/reproduce.py",
             "with cpu_threads(1, device):", "with cpu_threads(torch.get_num_threads(), device):",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_reproduce.py"
               "::test_the_split_does_not_depend_on_the_thread_count"),)),
    # cSGLD temperature (issue 25, item 1)
    Mutation("cSGLD default temperature T = 1 instead of pytorch-ensembles' N / n_b^2", _CSGLD,
             'temperature: str | float = "pytorch-ensembles"', "temperature: str | float = 1.0",
             (f"{_SAMPLING}::test_csgld_noise_variance_matches_the_reference_codes",
              f"{_SAMPLING}::test_csgld_default_temperature_is_pytorch_ensembles_not_one")),
    Mutation("cSGLD pytorch-ensembles rule N / n_b (no square)", _CSGLD,
             "return n_train / n_batches**2", "return n_train / n_batches",
             (f"{_SAMPLING}::test_csgld_noise_variance_matches_the_reference_codes",)),
    Mutation("cSGLD noise ignores the temperature (T = 1)", _CSGLD,
             "std = math.sqrt(2 * state.lr * temperature / state.n_train)",
             "std = math.sqrt(2 * state.lr / state.n_train)",
             (f"{_SAMPLING}::test_csgld_noise_variance_matches_the_reference_codes",)),
    Mutation("cSGLD resolved temperature not recorded with the run", _CSGLD,
             'state.extra["csgld.temperature"] = torch.tensor(temperature, dtype=torch.float64)',
             "pass",
             (f"{_SAMPLING}::test_csgld_noise_variance_matches_the_reference_codes",)),
    # ACE/TACE binning as Ashukha et al.'s code (issue 25, item 6b)
    Mutation("ACE/TACE: p >= threshold instead of the strict p > threshold", _CLS,
             "sel = p[:, k] > threshold", "sel = p[:, k] >= threshold",
             (f"{_CLS_TESTS}::test_ace_index_bins_split_ties_and_take_the_remainder_last",
              f"{_CLS_TESTS}::test_ace_is_the_official_index_binning")),
    Mutation("ACE/TACE: quantile edges instead of index bins", _CLS,
             "gaps = _index_bin_gap_sum(y[sel] == k, p[sel, k], n_bins)",
             "gaps = _reduce_gaps(*_bin_stats(y[sel] == k, p[sel, k], _quantile_edges("
             "p[sel, k], n_bins)), 'l1') * sel.sum()",
             (f"{_CLS_TESTS}::test_ace_index_bins_split_ties_and_take_the_remainder_last",
              f"{_CLS_TESTS}::test_ace_is_the_official_index_binning")),
    Mutation("ACE/TACE: the remainder spread over the bins (ceil sizes) instead of the last",
             _CLS, "per_bin = v.shape[0] // n_bins", "per_bin = -(-v.shape[0] // n_bins)",
             (f"{_CLS_TESTS}::test_ace_index_bins_split_ties_and_take_the_remainder_last",
              f"{_CLS_TESTS}::test_ace_is_the_official_index_binning")),
    Mutation("ACE/TACE: ties in data order (not permutation invariant)", _CLS,
             "order = np.lexsort((hit, value))", "order = np.argsort(value, kind='stable')",
             (f"{_CLS_TESTS}::test_ace_index_bins_split_ties_and_take_the_remainder_last",
              f"{_CLS_TESTS}::test_ace_is_the_official_index_binning",
              "shared/tests/test_common.py::test_permutation_invariance")),
    Mutation("ACE/TACE: default bins weighted by the class's own count n_k, not n", _CLS,
             "errors.append(gaps / sel.sum() if weighting == \"class\" else gaps / n)",
             "errors.append(gaps / sel.sum())",
             (f"{_CLS_TESTS}::test_ace_and_tace_hand_case",
              f"{_CLS_TESTS}::test_tace_is_ashukha_et_al_eq_2_as_their_code_computes_it")),
    # UIMNET Jacobian, TTA and GMM as the released code (issue 25, items 2-4)
    Mutation("UIMNET Jacobian of the softmax instead of the tau-scaled logits",
             "packages/uqvision/src/uqvision/protocols/uimnet/measures.py",
             "scaled = net(x) / temperature", "scaled = torch.softmax(net(x) / temperature, -1)",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_measures.py"
               "::test_uimnet_jacobian_of_a_linear_network_is_the_analytic_value"),)),
    Mutation("UIMNET Jacobian summed over input elements instead of averaged",
             "packages/uqvision/src/uqvision/protocols/uimnet/measures.py",
             "g.flatten(1).double().pow(2).mean(1)", "g.flatten(1).double().pow(2).sum(1)",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_measures.py"
               "::test_uimnet_jacobian_of_a_linear_network_is_the_analytic_value"),)),
    Mutation("UIMNET Jacobian computed for ensembles and MC dropout (not NaN)",
             "packages/uqvision/src/uqvision/protocols/uimnet/measures.py",
             "if len(members) != 1 or stochastic:", "if len(members) < 1:",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_measures.py"
               "::test_uimnet_jacobian_is_nan_for_ensembles_and_mc_dropout"),)),
    Mutation("UIMNET Jacobian: the ensemble cell does not mark MC dropout invalid",
             "packages/uqvision/src/uqvision/protocols/uimnet/reproduce.py",
             "functools.partial(jacobian_logits, stochastic=stochastic)",
             "functools.partial(jacobian_logits, stochastic=False)",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_reproduce.py"
               "::test_ood_nc_has_every_metric_over_its_dims"),)),
    Mutation("UIMNET TTA on real data: the former pad-crop + flip policy",
             "packages/uqvision/src/uqvision/protocols/uimnet/augment.py",
             'UIMNET_TTA_POLICIES.add("uimnet", official_policy)',
             'UIMNET_TTA_POLICIES.add("uimnet", lambda cfg: tta_transform("cifar", cfg))',
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_augment.py"
               "::test_the_real_data_policy_is_the_released_composition_with_10_augmentations"),)),
    Mutation("UIMNET TTA: 2 augmentations instead of 10",
             "packages/uqvision/src/uqvision/protocols/uimnet/augment.py",
             "OFFICIAL_TTA_COUNT = 10", "OFFICIAL_TTA_COUNT = 2",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_augment.py"
               "::test_the_real_data_policy_is_the_released_composition_with_10_augmentations"),)),
    Mutation("UIMNET TTA: torchvision's default crop scale (0.08, 1)",
             "packages/uqvision/src/uqvision/protocols/uimnet/augment.py",
             "CROP_SCALE = (0.7, 1.0)", "CROP_SCALE = (0.08, 1.0)",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_augment.py"
               "::test_the_real_data_policy_is_the_released_composition_with_10_augmentations"),)),
    Mutation("UIMNET TTA: colour jitter from the global RNG (not the per-image generator)",
             "packages/uqvision/src/uqvision/protocols/uimnet/augment.py",
             "order = torch.randperm(4, generator=generator).tolist()",
             "order = torch.randperm(4).tolist()",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_augment.py"
               "::test_every_random_step_draws_from_the_per_image_generator"),)),
    Mutation("UIMNET official GMM: sample covariance with divisor n (ddof 0)",
             "packages/uqvision/src/uqvision/protocols/uimnet/measures.py",
             "base = centred.T @ centred / (len(xc) - 1)", "base = centred.T @ centred / len(xc)",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_measures.py"
               "::test_official_gmm_equals_the_released_estimate_by_hand"),)),
    Mutation("UIMNET official GMM: Ledoit-Wolf instead of the sample covariance",
             "packages/uqvision/src/uqvision/protocols/uimnet/measures.py",
             'GaussianClasses.fit(train_features, train_labels, covariance="sample")',
             'GaussianClasses.fit(train_features, train_labels, covariance="ledoit-wolf")',
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_measures.py"
               "::test_official_gmm_equals_the_released_estimate_by_hand"),)),
    Mutation("UIMNET official GMM: eps 0.01 instead of 0.1",
             "packages/uqvision/src/uqvision/protocols/uimnet/measures.py",
             "OFFICIAL_GMM_EPS = 0.1", "OFFICIAL_GMM_EPS = 0.01",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_measures.py"
               "::test_official_gmm_equals_the_released_estimate_by_hand"),)),
    Mutation("UIMNET official GMM fitted on in-domain validation instead of training",
             "packages/uqvision/src/uqvision/protocols/uimnet/reproduce.py",
             'f"seed{seed}.train.json"\n    return image_view(',
             'f"seed{seed}.val.json"\n    return image_view(',
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_reproduce.py"
               "::test_trials_selection_jacobian_subset_and_oracle_images"),)),
    Mutation("UIMNET default GMM fit: validation Ledoit-Wolf",
             "packages/uqvision/src/uqvision/protocols/uimnet/__init__.py",
             'DEFAULT_GMM_FIT = "official"', 'DEFAULT_GMM_FIT = "validation-ledoit-wolf"',
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_measures.py"
               "::test_the_registry_holds_the_seven_measures_in_the_papers_order"),)),
    Mutation("V.1 'none' row scored on the held-out samples, not on every image",
             "packages/uqvision/src/uqvision/protocols/selective/score.py",
             "cells = [(score_metrics(y, p_all, metrics=scored, confidence=kind.confidence), "
             "y, p_all),",
             'cells = [({n: float(res[n].sel(calibration="none")) for n in scored}, y[held], '
             "softmax(z[held])),",
             (("packages/uqvision/tests/protocols/selective/test_selective_score.py"
               "::test_unscaled_rows_use_every_sample_and_scaled_rows_the_held_out_ones"),)),
    Mutation("V.1 n_scored of the 'none' row: the held-out count",
             "packages/uqvision/src/uqvision/protocols/selective/score.py",
             '"n_scored": ("calibration", np.array([y.size, held.size]',
             '"n_scored": ("calibration", np.array([held.size, held.size]',
             (("packages/uqvision/tests/protocols/selective/test_selective_score.py"
               "::test_unscaled_rows_use_every_sample_and_scaled_rows_the_held_out_ones"),)),
    Mutation("V.1 AURC_C ignores --aurc-coverage (always [0, 0.5])",
             "packages/uqvision/src/uqvision/protocols/selective/score.py",
             "n](correct, kappa, coverage=(0.0, coverage))",
             "n](correct, kappa, coverage=(0.0, 0.5))",
             (("packages/uqvision/tests/protocols/selective/test_selective_score.py"
               "::test_aurc_coverage_is_an_option_recorded_in_the_file"),)),
    Mutation("V.1 temperature effect against the 'none' row of other samples (unpaired)",
             "packages/uqvision/src/uqvision/protocols/selective/analysis.py",
             'before = _unscaled_heldout(rows, m) if paired else _values(rows, m, "none")',
             'before = _values(rows, m, "none")',
             (("packages/uqvision/tests/protocols/selective/test_selective_analysis.py"
               "::test_temperature_effect_compares_the_same_samples"),)),
    Mutation("V.1 results table: n_scored from the score file's n_eval",
             "packages/uqvision/src/uqvision/results.py",
             'n_scored = (int(scores["n_scored"].sel(calibration="none")) if "n_scored" in',
             'n_scored = (int(scores.attrs["n_eval"]) if "n_scored" in',
             (("packages/uqvision/tests/test_results.py"
               "::test_with_a_score_file_the_selective_numbers_are_the_score_files"),)),
    Mutation("V.1 results caption: 'evaluation images' though the 'none' row is over all",
             "packages/uqvision/src/uqvision/results.py",
             'every = all(r["n_scored"] == r["n_images"] for r in self.rows)',
             "every = False",
             (("packages/uqvision/tests/test_results.py"
               "::test_a_cache_the_score_file_did_not_score_is_refused"),)),
    # -- evaluation as a whole: R.7 disentanglement study (uqreg) -----------------------------
    Mutation("R.7 cell: the method's aleatoric part stored as its epistemic one (swapped)",
             _UQREG_DIS,
             "mean, epi, ale = dec.mean, dec.epistemic_variance, dec.aleatoric_variance",
             "mean, ale, epi = dec.mean, dec.epistemic_variance, dec.aleatoric_variance",
             (f"{_UQREG_DIS_TESTS}::test_a_cell_stores_each_part_under_its_own_name",)),
    Mutation("R.7 exact parts swapped in the task data (sigma^2 as the exact epistemic)",
             _UQREG_DIS,
             'rows["exact_epistemic_variance"].append(dec.epistemic_variance)\n'
             '        rows["exact_aleatoric_variance"].append(dec.aleatoric_variance)',
             'rows["exact_epistemic_variance"].append(dec.aleatoric_variance)\n'
             '        rows["exact_aleatoric_variance"].append(dec.epistemic_variance)',
             (f"{_UQREG_DIS_TESTS}::test_the_scores_tell_the_parts_apart",
              f"{_UQREG_DIS_TESTS}::test_reproduce_disentangle_smoke_end_to_end_and_resumes")),
    Mutation("R.7 truth band: z sqrt(est. total) instead of z sqrt(est. epistemic)", _UQREG_DIS,
             "cov_truth = np.abs(mean - truth) <= z * np.sqrt(epi)",
             "cov_truth = np.abs(mean - truth) <= z * np.sqrt(epi + ale)",
             (f"{_UQREG_DIS_TESTS}::test_scores_equal_an_independent_computation",)),
    Mutation("R.7 new-target band: the variance in place of the std", _UQREG_DIS,
             "cov_new = np.abs(y_new - mean) <= z * np.sqrt(epi + ale)",
             "cov_new = np.abs(y_new - mean) <= z * (epi + ale)",
             (f"{_UQREG_DIS_TESTS}::test_scores_equal_an_independent_computation",)),
    Mutation("R.7 bands: z_(1-alpha) (one-sided) instead of z_(1-alpha/2)", _UQREG_DIS,
             "z = float(norm.ppf(1 - alpha / 2))", "z = float(norm.ppf(1 - alpha))",
             (f"{_UQREG_DIS_TESTS}::test_scores_equal_an_independent_computation",)),
    Mutation("R.7 bands open (|mu - f| < z sd) instead of closed", _UQREG_DIS,
             "cov_truth = np.abs(mean - truth) <= z", "cov_truth = np.abs(mean - truth) < z",
             (f"{_UQREG_DIS_TESTS}::test_scores_equal_an_independent_computation",
              _UQREG_DIS_NEW)),
    Mutation("R.7 epistemic leakage against the exact epistemic instead of sigma^2", _UQREG_DIS,
             'per_region["epistemic_leakage"].append(spearman(e, ta))',
             'per_region["epistemic_leakage"].append(spearman(e, te))',
             (f"{_UQREG_DIS_TESTS}::test_scores_equal_an_independent_computation",)),
    Mutation("R.7 Spearman with ordinal ranks (ties not averaged)", _UQREG_DIS,
             "ra = rankdata(a, axis=-1)", 'ra = rankdata(a, axis=-1, method="ordinal")',
             (f"{_UQREG_DIS_TESTS}::test_scores_equal_an_independent_computation",)),
    Mutation("R.7 findings: the one-sided sign test's p reported as two-sided", _UQREG_DIS,
             "p = min(1.0, 2 * sign_test(max(k_above, n - k_above), n))",
             "p = sign_test(max(k_above, n - k_above), n)",
             (f"{_UQREG_DIS_TESTS}::test_reproduce_disentangle_smoke_end_to_end_and_resumes",
              _UQREG_DIS_NEW)),
    Mutation("R.7 findings: arithmetic mean of the ratios instead of the geometric", _UQREG_DIS,
             "return 10 ** float(v.mean()) if n else np.nan, above, p, n",
             "return float(np.mean(10.0 ** v)) if n else np.nan, above, p, n",
             (f"{_UQREG_DIS_TESTS}::test_reproduce_disentangle_smoke_end_to_end_and_resumes",
              _UQREG_DIS_NEW)),
    # -- CQR and the split-conformal threshold (R.6) -------------------------------------------
    Mutation("CQR scores clipped at 0 (q never narrows a too-wide interval)", _UQREG_CONF,
             "return np.maximum(low - y, y - high)",
             "return np.maximum(np.maximum(low - y, y - high), 0.0)",
             (f"{_CQR_TESTS}::test_cqr_equals_mapie",
              f"{_CQR_TESTS}::test_study_cqr_conditional_coverage_by_hand", _UQREG_CQR_NEW)),
    Mutation("conformal rank ceil(n (1 - alpha)) instead of ceil((n + 1)(1 - alpha))",
             _CONFORMAL,
             "np.ceil(np.round((np.asarray(n) + 1) * (1.0 - alpha), 10))",
             "np.ceil(np.round(np.asarray(n) * (1.0 - alpha), 10))",
             (f"{_CQR_TESTS}::test_cqr_equals_mapie",
              "packages/uqreg/tests/test_conformal.py::test_conformal_quantile_rank_by_hand")),
    Mutation("conformal rank: the float product not rounded (100 x 0.9 ranks 91)", _CONFORMAL,
             "np.ceil(np.round((np.asarray(n) + 1) * (1.0 - alpha), 10))",
             "np.ceil((np.asarray(n) + 1) * (1.0 - alpha))",
             (f"{_CQR_TESTS}::test_cqr_equals_mapie",)),
    Mutation("CQR calibrated with the two quantiles swapped", "packages/uqreg/src/uqreg/methods.py",
             "conformal.cqr_calibrate(calibration[1], result.cal_quantile_low, "
             "result.cal_quantile_high,",
             "conformal.cqr_calibrate(calibration[1], result.cal_quantile_high, "
             "result.cal_quantile_low,",
             (f"{_CQR_TESTS}::test_study_cqr_conditional_coverage_by_hand",)),
    Mutation("quantile averages not rearranged where they cross",
             "packages/uqreg/src/uqreg/methods.py",
             "return np.minimum(low, high), np.maximum(low, high)", "return low, high",
             (f"{_CQR_TESTS}::test_study_cqr_conditional_coverage_by_hand", _UQREG_CQR_NEW)),
    Mutation("exact conditional coverage of an empty interval negative (no clip at 0)",
             _UQREG_CONF, "return np.where(np.isnan(cov), np.nan, np.maximum(cov, 0.0))",
             "return cov",
             (("packages/uqreg/tests/test_conformal.py"
               "::test_conditional_coverage_matches_monte_carlo"),)),
    # -- recalibration of real data (R.9) -------------------------------------------------------
    Mutation("R.9 isotonic recalibration fitted on the test part", _REAL,
             "iso = IsotonicRecalibrator().fit(y_cal, mean_cal, std_cal)",
             "iso = IsotonicRecalibrator().fit(y, mean, std)",
             (f"{_REAL_TESTS}::test_isotonic_recalibration_lowers_mace_beyond_sampling_error",
              _REAL_NEW)),
    Mutation("R.9 sigma scaling fitted on the test part", _REAL,
             "sc = SigmaScaling().fit(y_cal, mean_cal, std_cal)",
             "sc = SigmaScaling().fit(y, mean, std)",
             (f"{_REAL_TESTS}::test_isotonic_recalibration_lowers_mace_beyond_sampling_error",
              _REAL_NEW)),
    # -- S.6 regression scores (uqmetrics) ------------------------------------------------------
    Mutation("S.6 interval curve: open intervals (bounds excluded)", _REG,
             "inside = (r >= special.ndtri(0.5 - levels / 2.0)) & "
             "(r <= special.ndtri(0.5 + levels / 2.0))",
             "inside = (r > special.ndtri(0.5 - levels / 2.0)) & "
             "(r < special.ndtri(0.5 + levels / 2.0))",
             (f"{_REG_TOOLBOX}::test_interval_calibration_curve_is_the_toolboxs",)),
    Mutation("S.6 quantile curve: the toolbox's residual sign (targets above 1 - p)", _REG,
             "r = ((ya - ma).reshape(-1) / sa.reshape(-1))[:, None]",
             "r = ((ma - ya).reshape(-1) / sa.reshape(-1))[:, None]",
             (f"{_REG_TOOLBOX}::test_quantile_curve_is_the_toolboxs_of_the_reflected_targets",)),
    Mutation("S.6 adversarial groups of floor(n r) points instead of round(n r)", _REG,
             "size = max(round(n * r), 2)", "size = max(int(n * r), 2)",
             (_ADVERSARIAL_TOOLBOX,)),
    Mutation("S.6 adversarial group calibration: spread over trials with ddof 0", _REG,
             "sds.append(np.std(worst, ddof=1))", "sds.append(np.std(worst))",
             (_ADVERSARIAL_TOOLBOX,)),
    Mutation("S.6 sharpness: mean std instead of root mean variance", _REG,
             "return float(np.sqrt(np.mean(sa ** 2)))", "return float(np.mean(sa))",
             (f"{_REG_SCORING}::test_sharpness_is_root_mean_variance",
              f"{_REG_TOOLBOX}::test_scores_are_the_toolboxs")),
    Mutation("S.6 interval score: penalty 1/alpha instead of 2/alpha", _REG,
             "a = 2.0 / (1.0 - coverages)", "a = 1.0 / (1.0 - coverages)",
             (f"{_REG_SCORING}::test_interval_score_is_width_plus_penalties",
              f"{_REG_TOOLBOX}::test_scores_are_the_toolboxs")),
    Mutation("S.6 PIT chi-square with bins degrees of freedom (not bins - 1)", _REG,
             "p = float(special.chdtrc(bins - 1, chi2))", "p = float(special.chdtrc(bins, chi2))",
             (f"{_REG_SCORING}::test_pit_histogram_counts_and_statistics",)),
    Mutation("S.6 PIT KS distance one-sided (D+ only)", _REG,
             "return float(max(np.max(i / n - u), np.max(u - (i - 1) / n)))",
             "return float(np.max(i / n - u))",
             (f"{_REG_SCORING}::test_pit_histogram_counts_and_statistics",)),
    Mutation("S.6 isotonic map fitted from expected to observed (inverted)", _REG,
             "self.x_, self.y_ = _isotonic_fit(observed, expected)",
             "self.x_, self.y_ = _isotonic_fit(expected, observed)",
             (f"{_REG_TOOLBOX}::test_isotonic_recalibrator_is_the_toolboxs_iso_recal",
              f"{_REG_SCORING}::test_isotonic_quantile_recalibration")),
    Mutation("S.6 sigma scaling: the criterion ignored (always MACE)", _REG,
             "fn = _CALIBRATION_FNS[self.criterion]", 'fn = _CALIBRATION_FNS["mace"]',
             (f"{_REG_TOOLBOX}::test_sigma_scaling_factor_is_the_toolboxs",)),
    # -- S.9 disentanglement estimators (uqmetrics) ---------------------------------------------
    Mutation("S.9 entropy in bits instead of nats", "shared/src/uqmetrics/metrics/confidence.py",
             "return 0.0 - np.sum(xlogy(p, p), axis=-1)",
             "return (0.0 - np.sum(xlogy(p, p), axis=-1)) / np.log(2)",
             (f"{_DIS_TESTS}::test_information_split_is_untangles",)),
    Mutation("S.9 mutual information not clipped at 0", _DIS,
             "epistemic = np.maximum(_entropy(p.mean(axis=0)) - aleatoric, 0.0)",
             "epistemic = _entropy(p.mean(axis=0)) - aleatoric",
             (_DIS_TESTS, _DIS_NEW)),
    Mutation("S.9 Bregman epistemic part not clipped at 0", _DIS,
             "epistemic = np.where(shared, np.maximum(-log_z, 0.0), np.inf)",
             "epistemic = np.where(shared, -log_z, np.inf)",
             (_DIS_TESTS, _DIS_NEW)),
    Mutation("S.9 Bregman bias not clipped at 0", _DIS,
             "bias = np.where(shared, np.maximum(kl, 0.0), np.inf)",
             "bias = np.where(shared, kl, np.inf)",
             (_DIS_TESTS, _DIS_NEW)),
    Mutation("S.9 Bregman central prediction: the arithmetic mean (BMA) not the dual BMA", _DIS,
             "mean_logp = logp.mean(axis=0)", "mean_logp = np.log(p.mean(axis=0))",
             (f"{_DIS_TESTS}::test_bregman_split_is_untangles",)),
    Mutation("S.9 DDU class covariance with divisor n_c (ddof 0)", _DIS,
             "covs[k] = r.T @ r / (counts[k] - 1)", "covs[k] = r.T @ r / counts[k]",
             (f"{_DIS_TESTS}::test_ddu_density_is_the_scipy_mixture",)),
    # -- V.8 disentanglement protocol (uqvision) ------------------------------------------------
    Mutation("V.8 abstinence keeps floor(c n) predictions, not ceil(c n)", _VDIS,
             "k = max(1, math.ceil(coverage * correct.size - 1e-9))",
             "k = max(1, int(coverage * correct.size))",
             _VDIS_SCORED),
    Mutation("V.8 severity Spearman against the severity's index, not its value", _VDIS,
             "sev_x.append(np.full(us.size, float(s)))", "sev_x.append(np.full(us.size, float(k)))",
             _VDIS_SCORED),
    Mutation("V.8 shift AUROC: the best severity's, not the mean over severities", _VDIS,
             'task["shift_auroc"][i, j] = float(np.nanmean(sev_auroc[i, j]))',
             'task["shift_auroc"][i, j] = float(np.nanmax(sev_auroc[i, j]))',
             _VDIS_SCORED),
    Mutation("V.8 temperature fitted on the test set instead of the calibration set", _VDIS,
             "labels_cal, cp, _, _ = predictor_members(groups, p.members, cal)",
             "labels_cal, cp, _, _ = predictor_members(groups, p.members, test)",
             _VDIS_SCORED),
    Mutation("V.8 temperature not applied to the OOD images", _VDIS,
             "for n, u in _estimates(scaled(po, t), eo, scorers).items():",
             "for n, u in _estimates(po, eo, scorers).items():",
             _VDIS_SCORED),
    Mutation("V.8 NLL of the first member instead of the predictive mean", _VDIS,
             'pm["nll"][i] = nll_loss(labels, mean)', 'pm["nll"][i] = nll_loss(labels, probs[0])',
             _VDIS_SCORED),
    Mutation("V.8 ensemble row: every member's passes as members (not averaged per member)",
             _VDIS, "rows.append(p if len(members) == 1 else p.mean(0, keepdims=True))",
             "rows.append(p)", _VDIS_SCORED),
    Mutation("V.8 training-size task: the median estimate, not the mean", _VDIS,
             "float(x.mean()) if not np.isnan(x).any() else np.nan for x in u]",
             "float(np.median(x)) if not np.isnan(x).any() else np.nan for x in u]",
             _VDIS_SCORED),
]


def _copy_sources(dest: Path, package: Package) -> list[Path]:
    roots = []
    for root in package.sources:
        target = dest / root
        shutil.copytree(REPO / root, target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        roots.append(target)
    return roots


def _env(roots: list[Path]) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(r) for r in roots),
               PYTHONDONTWRITEBYTECODE="1")
    for k, v in TEST_ENV.items():
        env.setdefault(k, v)
    return env


def _run_tests(package: Package, roots: list[Path], tests: tuple[str, ...]) -> tuple[bool, str]:
    """(passed, last lines of the output) of pytest on ``tests`` with ``roots`` first on the
    import path."""
    cmd = [package.python(), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           *[str(REPO / t) for t in tests]]
    try:
        done = subprocess.run(cmd, cwd=REPO / package.root, env=_env(roots), capture_output=True,
                              text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {TIMEOUT_S} s"
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    return done.returncode == 0, tail


def _imported_from(package: Package, roots: list[Path], module: str) -> str:
    """Where ``module`` is imported from under the mutant's import path."""
    return subprocess.run([package.python(), "-c", f"import {module}; print({module}.__file__)"],
                          env=_env(roots), capture_output=True, text=True,
                          check=True).stdout.strip()


def check(mutation: Mutation, verbose: bool = False) -> str:
    """Apply ``mutation`` to a fresh copy and run its tests: "killed", "SURVIVED" or
    "not applied (...)" (``verbose``: pytest's last lines printed, to see why)."""
    package = mutation.package
    source = next((s for s in package.sources if mutation.file.startswith(f"{s}/")), None)
    if source is None:
        return f"not applied ({mutation.file} is not in {package.name}'s sources)"
    missing = [t for t in mutation.tests if not (REPO / t.split("::")[0]).is_file()]
    if missing:
        return f"not applied (no test file {missing[0].split('::')[0]})"
    module = Path(mutation.file).relative_to(source).parts[0]  # its top-level package
    with tempfile.TemporaryDirectory(prefix=f"{package.name}-mutant-") as tmp:
        roots = _copy_sources(Path(tmp), package)
        path = Path(tmp) / mutation.file
        text = path.read_text()
        count = text.count(mutation.old)
        if count != 1:
            return f"not applied ({count} occurrences)"
        path.write_text(text.replace(mutation.old, mutation.new))
        if not _imported_from(package, roots, module).startswith(tmp):
            return "not applied (the copy is not what imports)"
        passed, tail = _run_tests(package, roots, mutation.tests)
        if verbose:
            print(tail, file=sys.stderr)
        return "SURVIVED" if passed else "killed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only the mutations whose name contains one of these")
    parser.add_argument("--baseline", action="store_true",
                        help="first check that every mutation's tests pass unmutated")
    parser.add_argument("--verbose", action="store_true",
                        help="print the end of each mutant's pytest output (stderr)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS
              if args.only is None or any(s.lower() in m.name.lower() for s in args.only)]
    if args.baseline:
        for package in PACKAGES:
            tests = tuple(dict.fromkeys(t for m in chosen if m.package is package
                                        for t in m.tests))
            if not tests:
                continue
            with tempfile.TemporaryDirectory(prefix=f"{package.name}-baseline-") as tmp:
                passed, tail = _run_tests(package, _copy_sources(Path(tmp), package), tests)
            print(f"baseline {package.name}: {'pass' if passed else 'FAIL'} "
                  f"({tail.splitlines()[-1] if tail else 'no output'})", flush=True)
            if not passed:
                return 1
    print("| mutation | package | test file | killed? |")
    print("|---|---|---|---|")
    ok = True
    for m in chosen:
        verdict = check(m, args.verbose)
        ok &= verdict == "killed"
        files = ", ".join(dict.fromkeys(t.split("::")[0].rsplit("/", 1)[-1] for t in m.tests))
        print(f"| {m.name} | {m.package.name} | {files} | {verdict} |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
