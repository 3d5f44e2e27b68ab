"""The entries of the registries whose modules import torch, by name and description, known
without importing them: the help of ``uqreg study --methods`` (and ``sweep``'s)
(:class:`uqmetrics.runs.lazy.Catalog`; docs/conventions.md#fast-help).

:data:`BUILT_IN` lists the package's own entries, in the registries' order;
``tests/test_fast_help.py`` checks it against the registries, and ``python -m uqreg.catalog``
prints it anew from them (paste it below after registering a method). This module imports
nothing of the package.
"""

from __future__ import annotations

from uqmetrics.runs.lazy import Catalog

__all__ = ["BUILT_IN", "CATALOG", "REGISTRIES", "VERSIONS", "describe", "method_names", "methods_help",
           "names"]

#: Each registry listed here: kind -> (``module:attribute`` of the registry, None: no plugins).
REGISTRIES: dict[str, tuple[str, str | None]] = {
    "method": ("uqreg.methods:METHODS", None),
    "conformal score": ("uqreg.conformal:SCORES", None),
}

# fmt: off
#: kind -> {name: description}, the package's own entries in registry order (written by
#: ``python -m uqreg.catalog``).
BUILT_IN: dict[str, dict[str, str]] = {
    "method": {
        "blr": "exact Bayesian linear regression, flat prior (reference, R.2)",
        "bd": "Bernoulli (MC) dropout on the last hidden layer",
        "cd": "concrete dropout, learned rate (Gal et al. 2017)",
        "vd": "variational Gaussian dropout, local reparameterisation (Kingma et al. 2015)",
        "ens": "deep ensemble",
        "ens_adv": "deep ensemble with FGSM adversarial training",
        "ens_bs": "bootstrap ensemble: two N/2 batches with replacement per epoch",
    },
    "conformal score": {
        "cp_abs": "split conformal, absolute residual: mean ± q, q from |y − mean|",
        "cp_std": "split conformal, residual normalised by the method's std: mean ± q·std, q from "
                  "|y − mean|/std",
    },
}
#: suffix -> the built-in methods that have that version, in registry order: ``<method>+mv``
#: (mean-variance, R.7: :func:`uqreg.methods.mean_variance_method_names`), ``<method>+qr`` and
#: ``<method>+cqr`` (quantile regression and its conformalized version, R.6:
#: :func:`uqreg.methods.quantile_method_names`); ``tests/test_fast_help.py`` checks it against
#: :func:`uqreg.methods.method_versions`, and ``python -m uqreg.catalog`` prints it anew.
VERSIONS: dict[str, tuple[str, ...]] = {
    "mv": ("bd", "cd", "vd", "ens", "ens_adv", "ens_bs"),
    "qr": ("bd", "ens", "ens_adv", "ens_bs"),
    "cqr": ("bd", "ens", "ens_adv", "ens_bs"),
}
# fmt: on

#: The catalog of these registries (the module of each registers its entries).
CATALOG = Catalog(REGISTRIES, BUILT_IN)
#: ``names(kind)``, ``describe(kind)``: the built-in entries.
names, describe = CATALOG.names, CATALOG.describe



def method_names() -> list[str]:
    """Every name ``--methods`` accepts of the built-in registries (and the plugins' methods):
    each method, its split-conformal versions ``<method>+<score>``, its versions of
    :data:`VERSIONS` (``+mv``, ``+qr``, ``+cqr``) and those of ``<method>+mv`` by score."""
    methods, scores = names("method"), names("conformal score")
    out = [*methods, *(f"{m}+{s}" for m in methods for s in scores)]
    for suffix, bases in VERSIONS.items():
        out += [f"{m}+{suffix}" for m in bases]
    out += [f"{m}+mv+{s}" for m in VERSIONS["mv"] for s in scores]
    return out


def methods_help(default: str) -> str:
    """The help of ``--methods`` (``uqreg study``, ``sweep``, ``real``): the methods and every
    version of them the registries accept, by name; ``default`` says what none given runs."""
    scores = names("conformal score")
    quantile = [f"{m}+{s}" for m in VERSIONS["qr"] for s in ("qr", "cqr")]
    return (f"comma-separated ({', '.join(names('method'))}; default {default}); "
            f"<method>+<score> is the method's split-conformal version, score {' or '.join(scores)} "
            f"(e.g. ens+{scores[0]}); <method>+mv a trained method's mean-variance version (R.7: "
            f"{', '.join(m + '+mv' for m in VERSIONS['mv'])}; then +<score>, e.g. ens+mv+{scores[-1]}); "
            f"<method>+qr its quantile-regression version and <method>+cqr the conformalized one "
            f"(R.6: {', '.join(quantile)})")


if __name__ == "__main__":  # python -m uqreg.catalog: BUILT_IN and VERSIONS from the registries
    import importlib  # uqreg.methods (torch) by name, as CATALOG.source() loads the registries

    print(CATALOG.source())
    versions = importlib.import_module("uqreg.methods").method_versions()
    print(f"VERSIONS: dict[str, tuple[str, ...]] = {versions!r}")
