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

__all__ = ["BUILT_IN", "CATALOG", "REGISTRIES", "describe", "names"]

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
# fmt: on

#: The catalog of these registries (the module of each registers its entries).
CATALOG = Catalog(REGISTRIES, BUILT_IN)
#: ``names(kind)``, ``describe(kind)``: the built-in entries.
names, describe = CATALOG.names, CATALOG.describe

if __name__ == "__main__":  # python -m uqreg.catalog: BUILT_IN from the registries
    print(CATALOG.source())
