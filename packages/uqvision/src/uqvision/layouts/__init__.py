"""Evaluation sets in the layouts ImageNet ships in: where the images are, how they are labelled.

A ``--data`` path is read in the first layout of :data:`LAYOUTS` that claims it:

- ``class_folders``: a folder with one sub-folder per class, ``root/<class>/.../<image>`` (the
  ImageFolder convention of torchvision and timm; ImageNet-A/R/O ship so, with WordNet ids as
  folder names);
- ``flat``: a folder of images and no class sub-folder (``ILSVRC2012_val_00000001.JPEG``, ...)
  labelled by a label file (:data:`LABEL_FILES`): the devkit's ground truth
  (``ILSVRC2012_devkit_t12``: ``data/ILSVRC2012_validation_ground_truth.txt`` + ``data/meta.mat``,
  or its ``.tar.gz``) or the Kaggle redistribution's ``LOC_val_solution.csv``. A set whose
  images need no labels (an OOD set: ``scan_layout(..., unlabelled=True)``) may have none: with
  no label file found, its images are one class :data:`UNLABELLED` (``-1``, as an OOD image
  list's), which the set's class map ``none`` labels -1; a labelled set is refused there,
  naming the label files looked for;
- ``tar``: an uncompressed ``.tar`` archive, read in place (nothing is extracted): class folders
  inside it, one ``<class>.tar`` per class inside it (``ILSVRC2012_img_train.tar``), or flat
  images with a label file (``ILSVRC2012_img_val.tar``). A tar whose every member sits in one
  top folder (``imagenet-r.tar`` holds ``imagenet-r/<wnid>/...``) is read as that folder;
- ``tar_folder``: a folder inside such an archive, given as a path through it,
  ``ARCHIVE.tar/<inner>/<dir>`` (ImageNet-C as shipped: ``blur.tar/defocus_blur/3``), read in
  place as the archive would be (its sub-folders are the classes); the archive is listed once
  however many of its folders are read (:func:`is_folder`: a folder on disk or in an archive);
- ``image_list``: a ``.txt`` image list, ``<relative path> <label>`` per line, as OpenOOD ships
  its benchmarks (``benchmark_imglist/imagenet/test_ninco.txt``: label -1 for OOD, a class
  index for ID), its paths under its data root: ``--labels DIR``, else OpenOOD's
  ``<list folder>/../../images_largescale`` where it exists, else the list's folder
  (:mod:`~uqvision.layouts.lists`).

Whatever the layout, a scan (:class:`Scan`) gives the classes (sorted), the samples sorted by
class and then by sample id (the relative path of the image: in the folder, or in the archive,
a member of ``<class>.tar`` being ``<class>/<member>``), an image source that opens a sample
and knows its size, and the label file with its content hash (part of the dataset fingerprint).

A label file is given explicitly (``labels=``, ``--labels FILE``) or looked for, in this order,
in the folder that holds the flat folder or the archive, then in the folder above it, then (for
a folder at ``ILSVRC/Data/CLS-LOC/<split>``, the Kaggle tree) in the folder that holds
``ILSVRC``; in each folder: ``ILSVRC2012_devkit_t12/`` (its ``data/`` files),
``ILSVRC2012_devkit_t12.tar.gz``, ``LOC_val_solution.csv`` (:data:`LABEL_SEARCH`).

The code, one concern per module (this package re-exports their names):

- :mod:`~uqvision.layouts.names`: image and class names, WordNet ids;
- :mod:`~uqvision.layouts.sources`: reading a sample (:class:`FileSource`, :class:`TarSource`);
- :mod:`~uqvision.layouts.labels`: the label files (:data:`LABEL_FILES`), their search,
  labelling flat images;
- :mod:`~uqvision.layouts.base`: :class:`Scan`, :data:`LAYOUTS`, :func:`scan_layout`;
- the layouts, registered in this order: :mod:`~uqvision.layouts.folders` (``class_folders``,
  ``flat``), :mod:`~uqvision.layouts.tars` (``tar``, ``tar_folder``; why timm's tar readers
  are not used is in its docstring) and :mod:`~uqvision.layouts.lists` (``image_list``).

What is refused or reported rather than dropped (docs/conventions.md#v-data): images both
directly in a folder and in class folders (a mixed layout), dangling symbolic links and file
names that are not UTF-8 (unreadable images, :attr:`Scan.problems`), absent images of the label
file unless the scan is a subset (``subset=True``, :class:`Subset`), a link to a folder that
leads back to a folder holding it, and a hidden folder beside the class folders that holds
images. Links to folders are followed (as torchvision's ImageFolder follows them); hidden
names (``.``) are read at no depth of any layout.
"""

from __future__ import annotations

# isort: off
from .names import IMG_EXTENSIONS, list_classes, wnid_description
from .sources import FileSource, TarSource, UnreadableFileError
from .labels import (
    DEVKIT_GROUND_TRUTH,
    DEVKIT_META,
    LABEL_FILES,
    LABEL_SEARCH,
    LabelFile,
    LabelFormat,  # noqa: F401  (public, not in __all__)
    find_label_file,
    find_label_files,
    read_label_file,
)
from .base import LAYOUTS, UNLABELLED, Layout, Scan, Subset, scan_layout
from . import folders  # noqa: F401  (registers class_folders, flat: the order a path is tried)
from .tars import is_folder  # registers tar, tar_folder
from .lists import IMAGE_LIST_ROOT, image_list_root  # registers image_list
# isort: on

__all__ = [
    "DEVKIT_GROUND_TRUTH",
    "DEVKIT_META",
    "IMAGE_LIST_ROOT",
    "IMG_EXTENSIONS",
    "LABEL_FILES",
    "LABEL_SEARCH",
    "LAYOUTS",
    "UNLABELLED",
    "FileSource",
    "LabelFile",
    "Layout",
    "Scan",
    "Subset",
    "TarSource",
    "UnreadableFileError",
    "find_label_file",
    "find_label_files",
    "image_list_root",
    "is_folder",
    "list_classes",
    "read_label_file",
    "scan_layout",
    "wnid_description",
]

