"""The entries of the registries whose modules import torch, by name and description, known
without importing them: the choices and help of ``uqvision train --method``, ``--augment``,
``uqvision predict --mode``, ``--tta-policy`` and ``uqvision score uimnet --gmm-fit``
(:class:`uqmetrics.runs.lazy.Catalog`; docs/conventions.md#fast-help), and the names of the
installed plugins (:func:`plugin_names`, read from the packages' metadata).

:data:`BUILT_IN` lists the package's own entries, in the registries' order;
``tests/test_fast_help.py`` checks it against the registries once filled, and
``python -m uqvision.catalog`` prints it anew from them (paste it below after adding an entry
to one of them). A plugin's entries are listed by name: its module is imported when a command
runs. This module imports nothing of the package: any layer may read it.
"""

from __future__ import annotations

from uqmetrics.runs.lazy import Catalog, plugin_names

__all__ = ["BUILT_IN", "CATALOG", "REGISTRIES", "describe", "names", "plugin_names"]

#: Each registry listed here: kind -> (``module:attribute`` of the registry, the entry-point
#: group of its plugins or None).
REGISTRIES: dict[str, tuple[str, str | None]] = {
    "training method": ("uqvision.training.method:TRAINING_METHODS",
                        "uqvision.training_methods"),
    "prediction mode": ("uqvision.predict.modes:PASS_MODES", None),
    "augmentation": ("uqvision.data.transforms:TTA_POLICIES", None),
    "GMM fit": ("uqvision.protocols.uimnet.measures:GMM_FITS", None),
}

# fmt: off
#: kind -> {name: its description's first paragraph}, the package's own entries in registry
#: order (written by ``python -m uqvision.catalog``).
BUILT_IN: dict[str, dict[str, str]] = {
    "training method": {
        "deep_ensemble": "independently trained networks, one per seed (Lakshminarayanan et al.)",
        "mc_dropout": "dropout kept on at test time, one pass per sample (Gal & Ghahramani)",
        "sse": "snapshot ensemble: cosine cycles (eq. 16), one snapshot per cycle (Huang et al.)",
        "fge": "fast geometric ensembling: eq. (10) pre-training, eq. (17) cycles (Garipov et al.)",
        "swag": "SWA-Gaussian: diagonal + rank-20 deviations around the SWA mean (Maddox et al.)",
        "csgld": "cyclical SGLD: eq. (16) cycles, noise and several snapshots late in each cycle "
                 "(Zhang et al.)",
        "vi": "variational inference: factorised Gaussian, local reparameterisation, KL weight "
              "(Blundell et al.; Kingma et al.)",
        "kfac_laplace": "K-FAC Laplace: empirical Fisher, pi-corrected damping, noise scale tuned "
                        "on validation (Ritter et al.)",
        "erm": "empirical risk minimisation (cross-entropy)",
        "mixup": "ERM on mixed examples (Zhang et al.); native: the Mixup criterion",
        "soft_labeler": "cross-entropy to smoothed labels; native: soft-label over-shoot",
        "mimo": "M sub-networks in one (Havasi et al.)",
        "rbf": "logits transformed by exp(-z^2) before the softmax (Broomhead & Lowe)",
        "rnd": "student matching a fixed random teacher on φ (Burda et al.); native: "
               "student-teacher disagreement",
        "oc": "orthogonal certificates mapping φ to zero (Tagasovska & Lopez-Paz); native: "
              "student-teacher disagreement",
        "deep_ae": "auto-encoder of φ with a bottleneck (Vincent et al.); native: student-teacher "
                   "disagreement",
        "due": "spectral-normalised featurizer + sparse variational GP head (gpytorch); native: GP"
               " predictive variance",
        "ce": "URL: cross-entropy, u = class entropy (eq. B.1)",
        "infonce": "URL: InfoNCE on two views (eq. 1), u = 1/||e||",
        "mcinfonce": "URL: InfoNCE on vMF samples (eq. 2), u = 1/kappa",
        "elk": "URL: expected likelihood kernel to vMF proxies (eq. 3), u = 1/kappa",
        "nivmf": "URL: MC expected likelihood to non-isotropic vMF proxies (eq. 4)",
        "hib": "URL: hedged instance embeddings, match probabilities (eq. 5), u = 1/kappa",
        "hetxl": "URL: HET-XL low-rank heteroscedastic softmax (eq. 6)",
        "sngp": "URL: SNGP random-feature GP, mean-field (eq. 7)",
        "losspred": "URL: CE + lambda (u - CE.detach())^2 (eq. 8)",
        "ensemble": "URL: 10 heads on one backbone, mean probability under CE (B.10)",
        "mcdropout": "URL: dropout before the classifier, 10 passes averaged (B.11)",
    },
    "prediction mode": {
        "plain": "The model's own evaluation preprocessing, one pass.",
        "tta": "One random augmentation (--tta-policy) per pass, one file per pass.",
        "mc_dropout": "Dropout masks per sample and pass, all passes in one file (pass, sample, "
                      "class); the backbone runs once per batch when every dropout module is in "
                      "the head.",
        "crop": "URL's crop: centre crop to a per-sample fraction in [0.1, 0.75], resized back "
                "(S.5).",
    },
    "augmentation": {
        "imagenet": "RandomResizedCrop + horizontal flip (ImageNet style).",
        "cifar": "Pad-4 random crop + horizontal flip (CIFAR style; the pad scales with the "
                 "input).",
        "crop": "Pad-4 random crop, no flip (digits must not be flipped).",
    },
    "GMM fit": {
        "train-ledoit-wolf": "-log sum_c lambda_c N(phi(x); mu_c, Sigma_c), class Gaussians fitted"
                             " on the in-domain training split, Ledoit-Wolf covariances (mean over"
                             " members)",
        "official": "-log sum_c lambda_c N(phi(x); mu_c, Sigma_c), class Gaussians fitted on the "
                    "in-domain training split, sample covariance + 0.1 I (mean over members)",
        "validation-ledoit-wolf": "-log sum_c lambda_c N(phi(x); mu_c, Sigma_c), Ledoit-Wolf class"
                                  " Gaussians fitted on half of in-domain validation (mean over "
                                  "members)",
    },
}
# fmt: on

#: The catalog of these registries (filled by :func:`uqvision.load_registries`).
CATALOG = Catalog(REGISTRIES, BUILT_IN, fill="uqvision:load_registries")
#: ``names(kind)``, ``describe(kind)``: the built-in entries, then the plugins' (by name).
names, describe = CATALOG.names, CATALOG.describe

if __name__ == "__main__":  # python -m uqvision.catalog: BUILT_IN from the registries
    print(CATALOG.source())
