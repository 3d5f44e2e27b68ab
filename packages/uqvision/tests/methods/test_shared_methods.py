"""The learners moved out of the URL and UIMNET protocol folders into :mod:`uqvision.methods`
(issue 41, item 5): registered from there, importable from their old paths as the same
objects, and listed in the registry in the same order as before the move (``uqvision train
-h``).
"""

from __future__ import annotations

import importlib

import pytest
from torch import nn

import uqvision
from uqvision.methods import TRAINING_METHODS

#: moved entry -> (the module that defines and registers it, its hyper-parameter class)
MOVED = {
    "hetxl": ("uqvision.methods.representation", "HetXLHParams"),
    "sngp": ("uqvision.methods.representation", "SNGPHParams"),
    "losspred": ("uqvision.methods.representation", "LosspredHParams"),
    "ensemble": ("uqvision.methods.representation", "EnsembleHParams"),
    "mimo": ("uqvision.methods.mimo", "MIMOHParams"),
    "rbf": ("uqvision.methods.rbf", None),
    "due": ("uqvision.methods.due", "DUEHParams"),
}

#: (old path, name, new path): every name the protocols exported that now lives elsewhere
OLD_PATHS = [
    *[("uqvision.protocols.url.methods", n, "uqvision.methods.representation") for n in (
        "Accumulating", "URLHParams", "HetXLHParams", "SNGPHParams", "LosspredHParams",
        "EnsembleHParams", "MCDropoutHParams", "build_model", "hib_loss",
        "hib_match_probability", "infonce_loss", "two_views", "warmup_cosine_lr")],
    *[("uqvision.protocols.url.heads", n, "uqvision.methods.uncertainty_heads") for n in (
        "UMLP", "U_FUNCTIONS", "U_HEADS", "BatchNoise", "SampleNoise", "URLModel",
        "entropy_of_logits", "kappa_mlp", "nivmf_log_density")],
    *[("uqvision.protocols.url.vmf", n, "uqvision.methods.vmf") for n in (
        "elk_sim", "log_iv", "sample_vmf", "vmf_log_normalizer")],
    *[("uqvision.protocols.uimnet.methods", n, "uqvision.methods.feature") for n in (
        "FeatureClassifier", "OODRecipe", "feature_classifier", "small_cnn")],
    ("uqvision.protocols.uimnet.methods", "MIMOHParams", "uqvision.methods.mimo"),
    ("uqvision.protocols.uimnet.methods", "MIMONet", "uqvision.methods.mimo"),
    ("uqvision.protocols.uimnet.methods", "mimo_batch", "uqvision.methods.mimo"),
    ("uqvision.protocols.uimnet.methods", "RBFNet", "uqvision.methods.rbf"),
    ("uqvision.protocols.uimnet.methods", "rbf_transform", "uqvision.methods.rbf"),
    ("uqvision.protocols.uimnet.methods", "DUEHParams", "uqvision.methods.due"),
    ("uqvision.protocols.uimnet.methods", "DUENet", "uqvision.methods.due"),
]


@pytest.mark.parametrize("name", sorted(MOVED))
def test_moved_methods_are_registered_from_uqvision_methods(name):
    uqvision.load_registries()
    module, hparams = MOVED[name]
    entry = TRAINING_METHODS.lookup(name)
    assert entry.wrap_model.__module__ == module  # the registration moved with the code
    if hparams is not None:
        assert entry.hparams is getattr(importlib.import_module(module), hparams)
    assert entry.hparams.__module__.startswith("uqvision.methods.")


def test_moved_heads_are_registered_in_the_shared_head_registry():
    from uqvision.methods.uncertainty_heads import U_HEADS

    for head in ("linear_mlp", "ensemble", "hetxl", "sngp"):  # losspred, 10 heads, HET-XL, SNGP
        assert U_HEADS.lookup(head).__module__ == "uqvision.methods.uncertainty_heads"


@pytest.mark.parametrize(("old", "name", "new"), OLD_PATHS,
                         ids=[f"{o.rsplit('.', 1)[1]}.{n}" for o, n, _ in OLD_PATHS])
def test_old_import_paths_give_the_same_objects(old, name, new):
    moved = getattr(importlib.import_module(new), name)
    assert getattr(importlib.import_module(old), name) is moved
    assert name in importlib.import_module(old).__all__


def test_build_model_still_names_the_url_methods_in_its_error():
    from uqvision.methods.representation import URLHParams, build_model
    from uqvision.protocols.url import REPRESENTATION_METHODS

    with pytest.raises(ValueError, match=", ".join(REPRESENTATION_METHODS) + ", got 'nope'"):
        build_model("nope", nn.Identity(), 3, URLHParams(), embed_dim=4)


def test_the_registry_lists_the_methods_in_the_order_before_the_move():
    """The order of ``uqvision train --method``'s choices (the registry's, filled by
    :func:`uqvision.load_registries`, which the test session's conftest calls first): the
    general methods, UIMNET's algorithms with MIMO, RBF and DUE where the paper lists them,
    then URL's learners, as before the move (plugins' entries after them)."""
    uqvision.load_registries()
    before = ["deep_ensemble", "mc_dropout", "sse", "fge", "swag", "csgld", "vi", "kfac_laplace",
              "erm", "mixup", "soft_labeler", "mimo", "rbf", "rnd", "oc", "deep_ae", "due",
              "ce", "infonce", "mcinfonce", "elk", "nivmf", "hib", "hetxl", "sngp", "losspred",
              "ensemble", "mcdropout"]
    assert TRAINING_METHODS.names()[:len(before)] == before
