"""Mutation checks: does each known-wrong edit of the source make at least one test fail?

Each :class:`Mutation` is one string replacement in one source file (a bug a fidelity review
found, or could reintroduce) and the tests that must catch it. For each mutation the script
copies the source trees of :data:`SOURCE_ROOTS` into a temporary folder, applies the
replacement there (the working tree is never touched), runs the tests with ``PYTHONPATH``
pointing at the copy (ahead of the editable install) and prints one Markdown row::

    mutation | test file | killed?

"killed" when pytest fails; "SURVIVED" when the tests pass on the mutant (the tests do not
bite); "not applied" when the text to replace does not occur exactly once (the source moved
on: update the entry). Run from the repository root::

    .tox/uqvision/bin/python packages/uqvision/benchmarks/mutations.py [--only NAME ...]
        [--baseline] [--verbose]

``--baseline`` first runs every mutation's tests on an unmutated copy (they must pass, or a
"killed" means nothing). Exit status 0 when every applied mutation is killed, 1 otherwise.

To add one (URL, UIMNET, ...), append a :class:`Mutation` to :data:`MUTATIONS`: ``file``
relative to the repository root, ``old`` the exact text (it must occur once), ``new`` its
replacement, ``tests`` pytest node ids or files relative to the repository root.
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

REPO = Path(__file__).resolve().parents[3]
#: Source trees copied for each mutant (each holds top-level packages; PYTHONPATH entries).
SOURCE_ROOTS = ("packages/uqvision/src", "shared/src")
#: Where pytest runs (its configuration: the package's pyproject.toml).
TEST_ROOT = "packages/uqvision"
TIMEOUT_S = 900


@dataclass(frozen=True)
class Mutation:
    """One wrong edit: replace ``old`` (occurring exactly once in ``file``) by ``new``; at
    least one of ``tests`` must then fail."""

    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


_METHODS = "packages/uqvision/src/uqvision/methods/"
_SWAG, _VI, _LAPLACE, _CSGLD = (_METHODS + m + ".py" for m in ("swag", "vi", "laplace", "csgld"))
_SAMPLING = "packages/uqvision/tests/methods/test_methods_sampling.py"
_CLS = "shared/src/uqmetrics/metrics/classification.py"
_CLS_TESTS = "shared/tests/test_classification.py"

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
             "packages/uqvision/src/uqvision/protocols/uimnet/measures.py",
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
]


def _copy_sources(dest: Path) -> list[Path]:
    roots = []
    for root in SOURCE_ROOTS:
        target = dest / root
        shutil.copytree(REPO / root, target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        roots.append(target)
    return roots


def _run_tests(roots: list[Path], tests: tuple[str, ...]) -> tuple[bool, str]:
    """(passed, last lines of the output) of pytest on ``tests`` with ``roots`` first on the
    import path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(r) for r in roots),
               PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           *[str(REPO / t) for t in tests]]
    try:
        done = subprocess.run(cmd, cwd=REPO / TEST_ROOT, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {TIMEOUT_S} s"
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    return done.returncode == 0, tail


def _imports_from(roots: list[Path]) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(r) for r in roots))
    return subprocess.run([sys.executable, "-c", "import uqvision; print(uqvision.__file__)"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def check(mutation: Mutation, verbose: bool = False) -> str:
    """Apply ``mutation`` to a fresh copy and run its tests: "killed", "SURVIVED" or
    "not applied (...)" (``verbose``: pytest's last lines printed, to see why)."""
    with tempfile.TemporaryDirectory(prefix="uqvision-mutant-") as tmp:
        roots = _copy_sources(Path(tmp))
        path = Path(tmp) / mutation.file
        text = path.read_text()
        count = text.count(mutation.old)
        if count != 1:
            return f"not applied ({count} occurrences)"
        path.write_text(text.replace(mutation.old, mutation.new))
        if not _imports_from(roots).startswith(tmp):
            return "not applied (the copy is not what imports)"
        passed, tail = _run_tests(roots, mutation.tests)
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
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        with tempfile.TemporaryDirectory(prefix="uqvision-baseline-") as tmp:
            passed, tail = _run_tests(_copy_sources(Path(tmp)), tests)
        print(f"baseline: {'pass' if passed else 'FAIL'} ({tail.splitlines()[-1]})")
        if not passed:
            return 1
    print("| mutation | test file | killed? |")
    print("|---|---|---|")
    ok = True
    for m in chosen:
        verdict = check(m, args.verbose)
        ok &= verdict == "killed"
        files = ", ".join(dict.fromkeys(t.split("::")[0].rsplit("/", 1)[-1] for t in m.tests))
        print(f"| {m.name} | {files} | {verdict} |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
