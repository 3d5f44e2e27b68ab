"""The generated ``hierarchy`` image set: a class tree for the vision protocols
(docs/conventions.md#v-0).

Each superclass is one family of procedural patterns (oriented gratings, ring sets, blob
constellations, checkers, strokes, …) drawn in its own two-colour palette; each class is one
parameter setting inside its family (an orientation, a ring frequency, a blob count, …). Every
image is its class prototype under a random affine transform, a colour jitter and pixel noise,
so classes of one superclass look alike, features cluster by superclass, and a small CNN
reaches neither chance nor 100 %.

Layout written by :func:`make_hierarchy`::

    out/
      classes.json              format version, scale, seed, every class -> superclass, role, group
      train/<class>/<nnnnn>.png  ImageFolder trees, 32x32 RGB, the same count for every class
      val/<class>/<nnnnn>.png
      test/<class>/<nnnnn>.png
      mixed/<class>/<nnnnn>.png  blends of two classes of one superclass, filed under the majority
      mixed/soft_labels.csv      file, class_a, class_b, alpha: label distribution (alpha, 1-alpha)

With ``ambiguity=F > 0`` the first ``floor(F * n + 1/2)`` images of every class of train/val/test
are blends of two classes of one superclass, labelled by a draw from their weights and filed
under the drawn class (``<class>/blend-<iii>-<jjjjj>.png``), and each split gets
``<split>/label_distributions.csv`` (the columns of ``soft_labels.csv``; a plain image is
``class, class, 1``): every image's exact label distribution, read by
:func:`read_label_distributions`. ``F = 0`` (the default) writes the set above byte for byte.
A blend's weight follows ``weight_law`` (:data:`AMBIGUITY_WEIGHT_LAWS`: ``uniform``, U(0, 1),
the default, or ``beta(a, b)``), recorded in ``classes.json`` with the fraction.

Class folder names are ``<ss>-<family>-<kk>`` (superclass and class number), so the sorted
folder order — the class index of :class:`uqvision.data.ImageFolderDataset` — is superclass-major.

Roles (V.4): the classes of the first half of the superclasses are ``upstream``; the rest are
``downstream``, grouped by whole superclasses into ``downstream_groups`` stand-in datasets
(``down_a``, ``down_b``, …). V.3 takes its in/out split from clustering, not from these roles.

Everything is a pure function of ``(scale, seed, ambiguity, weight_law)``: every image draws from its own
random stream ``numpy.random.default_rng([seed, split, class, index])``, and PNG encoding is
deterministic, so the same seed gives byte-identical files.

The code, one concern per module (this package re-exports their names):
:mod:`~uqvision.hierarchy.patterns` draws (the pattern families :data:`FAMILIES`, the per-image
randomness :class:`Augmentation`, rendering a class's pattern into pixels);
:mod:`~uqvision.hierarchy.dataset` is the image set on disk (:data:`SCALES`, the class tree,
:func:`make_hierarchy` and :func:`read_hierarchy`); :mod:`~uqvision.hierarchy.truth` is the
ground truth of the disentanglement protocol (:func:`read_label_distributions`,
:func:`stratified_subset`).
"""

from __future__ import annotations

from .dataset import (
    AMBIGUITY_WEIGHT_LAWS,
    FORMAT_VERSION,
    LABEL_DISTRIBUTIONS,
    MIXED,  # noqa: F401  (public, not in __all__)
    SCALES,
    SPLITS,
    HierarchyInfo,
    HierarchyScale,
    WeightLaw,
    class_prototypes,
    ensure_hierarchy,
    make_hierarchy,
    parse_weight_law,
    read_hierarchy,
)
from .patterns import AUGMENTATION, FAMILIES, Augmentation
from .truth import LabelDistributions, read_label_distributions, stratified_subset

__all__ = [
    "AMBIGUITY_WEIGHT_LAWS",
    "AUGMENTATION",
    "FAMILIES",
    "FORMAT_VERSION",
    "LABEL_DISTRIBUTIONS",
    "SCALES",
    "SPLITS",
    "Augmentation",
    "HierarchyInfo",
    "HierarchyScale",
    "LabelDistributions",
    "WeightLaw",
    "class_prototypes",
    "ensure_hierarchy",
    "make_hierarchy",
    "parse_weight_law",
    "read_hierarchy",
    "read_label_distributions",
    "stratified_subset",
]

