"""The V.2 (Pitfalls) methods' hyper-parameters against the paper's appendix B.

Ashukha, Lyzhov, Molchanov & Vetrov (2020), "Pitfalls of in-domain uncertainty estimation and
ensembling in deep learning", appendix B (CIFAR; PreResNet-110 for the conventional recipe,
Table 1): each method's ``paper`` field holds these values, and its default is the same recipe
with every duration in epochs divided by 10 (docs/conventions.md, V.2). The one exception is
SWAG's collection phase, pinned below with its reason.
"""

from __future__ import annotations

import dataclasses

import pytest

from uqvision.methods import TRAINING_METHODS

#: method -> the appendix B values of its ``paper`` field (CIFAR)
PAPER = {
    # Table 1, PreResNet-110: SGD, batch 128, momentum 0.9, lr_init 0.1, wd 3e-4, 300 epochs,
    # the schedule of eq. (10)
    "deep_ensemble": {"epochs": 300, "lr_init": 0.1, "weight_decay": 3e-4, "batch_size": 128,
                      "momentum": 0.9, "optimizer": "sgd", "schedule": "linear_decay"},
    # WideResNet: p = 0.3, trained 400 epochs
    "mc_dropout": {"epochs": 400, "p": 0.3, "lr_init": 0.1},
    # SSE: cycle of 40 epochs, maximum learning rate 0.2, batch 64
    "sse": {"cycle_epochs": 40, "lr0": 0.2, "batch_size": 64},
    # FGE: 160 epochs of eq. (10) pre-training, cycles of 4 epochs, alpha1 5e-2, alpha2 5e-4,
    # batch 128
    "fge": {"pretrain_epochs": 160, "lr_init": 0.1, "cycle_epochs": 4, "alpha1": 5e-2,
            "alpha2": 5e-4, "batch_size": 128},
    # SWAG: 160 epochs of pre-training, then a constant 1e-2, rank 20 (SWAG's 300-epoch budget)
    "swag": {"pretrain_epochs": 160, "lr_init": 0.1, "swag_lr": 1e-2, "rank": 20,
             "swag_epochs": 140, "collect_epochs": 1},
    # cSGLD: cycle of 50 epochs, lr 0.5, batch 64, noise in the last 3 epochs, 3 snapshots
    "csgld": {"cycle_epochs": 50, "lr0": 0.5, "batch_size": 64, "noise_epochs": 3,
              "samples_per_cycle": 3, "sample_gap_epochs": 1},
    # VI: beta 1e-4, log sigma_init -5, lr_init 1e-3, Adam 1e-3 for log sigma, 300 epochs of
    # pre-training then 100
    "vi": {"kl_weight": 1e-4, "log_sigma_init": -5.0, "lr_init": 1e-3, "log_sigma_lr": 1e-3,
           "pretrain_epochs": 300, "epochs": 100},
    # K-FAC Laplace around a conventional network (Table 1's recipe)
    "kfac_laplace": {"epochs": 300, "lr_init": 0.1, "weight_decay": 3e-4},
}
#: fields that are durations in epochs: the stand-in default is the paper's value / 10
EPOCH_FIELDS = ("epochs", "pretrain_epochs", "cycle_epochs", "noise_epochs",
                "sample_gap_epochs")


def test_every_pitfalls_method_is_pinned():
    from uqvision.methods import GENERAL_METHODS

    assert set(PAPER) == set(GENERAL_METHODS)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_field_holds_appendix_b(name):
    paper = TRAINING_METHODS.lookup(name).paper
    for key, value in PAPER[name].items():
        assert getattr(paper, key) == pytest.approx(value) if isinstance(value, float) \
            else getattr(paper, key) == value, (name, key)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_defaults_are_the_paper_with_epochs_divided_by_ten(name):
    method = TRAINING_METHODS.lookup(name)
    default, paper = method.hparams(), method.paper
    for f in dataclasses.fields(default):
        want = getattr(paper, f.name)
        if f.name in EPOCH_FIELDS:
            want = want / 10
        elif name == "swag" and f.name == "swag_epochs":
            # one collection per epoch kept (collect_epochs 1), and at least `rank` of them so
            # the rank-20 deviation matrix is full: 20 collections, not 140 / 10 = 14
            want = default.rank * default.collect_epochs
            assert want > paper.swag_epochs / 10
        elif f.name == "cycles":  # snapshot counts: the stand-in's own (10), not a duration
            continue
        assert getattr(default, f.name) == pytest.approx(want), (name, f.name)
