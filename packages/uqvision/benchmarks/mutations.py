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


_BAYES = "packages/uqvision/src/uqvision/methods/bayesian.py"
_SAMPLING = "packages/uqvision/tests/methods/test_methods_sampling.py"

#: The mutations, extensible: append entries (see the module docstring).
MUTATIONS: list[Mutation] = [
    Mutation("SWAG draws with scale in place of sqrt(scale)", _BAYES,
             "w = mean + math.sqrt(hp.scale) * z", "w = mean + hp.scale * z",
             (f"{_SAMPLING}::test_swag_sample_covariance_is_diagonal_plus_low_rank",)),
    Mutation("SWAG without 1/sqrt(K-1) on the low-rank part", _BAYES,
             "dtype=torch.float64) \\\n                    / math.sqrt(len(dev) - 1)",
             "dtype=torch.float64)",
             (f"{_SAMPLING}::test_swag_sample_covariance_is_diagonal_plus_low_rank",)),
    Mutation("VI prior precision wd in place of N wd", _BAYES,
             "prior_precision = state.n_train * hp.weight_decay",
             "prior_precision = hp.weight_decay",
             (f"{_SAMPLING}::test_vi_kl_uses_the_prior_precision_n_wd",)),
    Mutation("BatchNorm refresh of sampled weights disabled",
             "packages/uqvision/src/uqvision/training/method.py",
             "if enabled and state.bn_loader is not None and has_batchnorm(state.net):",
             "if False and state.bn_loader is not None and has_batchnorm(state.net):",
             (f"{_SAMPLING}::test_sampled_weights_get_their_own_batchnorm_statistics",)),
    Mutation("VI convolutions: per-position noise (local reparameterisation)", _BAYES,
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
    Mutation("K-FAC Laplace scale grid never extended", _BAYES,
             "for _ in range(int(max_extensions)):", "for _ in range(0):",
             (("packages/uqvision/tests/methods/test_methods_registry.py"
              "::test_laplace_scale_search_extends_past_an_edge_optimum"),)),
    Mutation("URL Losspred: target loss not detached (the CE is trained towards u)",
             "packages/uqvision/src/uqvision/protocols/url/methods.py",
             '((out["scalar"] - ce.detach()) ** 2)', '((out["scalar"] - ce) ** 2)',
             (("packages/uqvision/tests/protocols/url/test_url_losses.py"
               "::test_losspred_target_is_detached"),)),
    Mutation("DUE: KL weighted by the batch size instead of the training-set size",
             "packages/uqvision/src/uqvision/protocols/uimnet/methods.py",
             "num_data=state.n_train)", "num_data=len(y))",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_methods.py"
               "::test_due_loss_is_the_negative_elbo_and_predictions_are_distributions"),)),
    Mutation("UIMNET extractor trained on the caller's thread count",
             "packages/uqvision/src/uqvision/protocols/uimnet/reproduce.py",
             "with cpu_threads(1, device):", "with cpu_threads(torch.get_num_threads(), device):",
             (("packages/uqvision/tests/protocols/uimnet/test_uimnet_reproduce.py"
               "::test_the_split_does_not_depend_on_the_thread_count"),)),
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
