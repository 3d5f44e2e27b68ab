"""Image folders, per-model preprocessing, test-time augmentation and development datasets.

The reader follows the ImageNet folder convention that timm and torchvision use: one
sub-folder per class, class index = position of the folder name in sorted order (for ImageNet
the sorted WordNet synsets, which is the class order of every ImageNet-1k checkpoint), samples
sorted by class and then by relative path. Every sample has a stable id, its relative path, so
prediction caches of different models can be checked to be in the same order. The other
layouts ImageNet ships in (a flat folder with the devkit's or Kaggle's label file, a tar
archive of either) are scanned by :mod:`uqvision.layouts` into the same classes and samples.

One concern per module; every name is importable from ``uqvision.data`` itself:

- :mod:`~.decode`: decoding an image file to 8-bit RGB (``load_image``);
- :mod:`~.images`: checking image files (``check_image``, ``check_images``,
  ``readable_images`` and the bad-image messages);
- :mod:`~.folders`: ``ImageFolderDataset``, class matching (``match_classes``,
  ``check_split_classes``), ``describe_labels``, fingerprints by content
  (``sample_digests``), ``check_output_outside``;
- :mod:`~.transforms`: ``DataConfig``, ``eval_transform``, the seeded augmentations and
  ``TTA_POLICIES``;
- :mod:`~.overlap`: whether two image sets share images, by their decoded pixels
  (``image_hashes``, ``content_hashes``, ``check_disjoint``: an ID image in an OOD set is
  refused, a near duplicate reported by a perceptual hash);
- :mod:`~.makers`: the development datasets (``DATASET_MAKERS``: digits, synthetic, hierarchy);
- :mod:`~.views`: ``ClassSubset``, ``image_view`` and the index files' format and reader (their
  writer, UIMNET's 90/10 split, is :func:`uqvision.protocols.uimnet.index.make_index_files`);
- :mod:`~._util`: ``derive_seed``, ``flush_denormal``, versioned JSON files.
"""

from uqmetrics.runs.lazy import attach

# every name imported on first use (docs/conventions.md#fast-help)
__getattr__, __dir__ = attach(__name__, {
    "..layouts": ["IMG_EXTENSIONS", "LAYOUTS", "list_classes"],
    "._util": ["derive_seed", "flush_denormal", "read_format_json", "write_format_json"],
    ".corruptions": ["make_corrupted_folder"],
    ".decode": ["load_image"],
    ".folders": ["EARLIER_FINGERPRINTS", "FINGERPRINT_PREFIX", "ImageFolderDataset",
                 "check_output_outside", "check_split_classes", "dataset_fingerprint",
                 "describe_labels", "earlier_fingerprint", "folder_fingerprint", "match_classes",
                 "sample_digests"],
    ".images": ["bad_images_message", "check_image", "check_images", "label_problems_message",
                "readable_images"],
    ".makers": ["DATASET_MAKERS", "make_digits_folder", "make_subset_folder",
                "make_synthetic_folder", "subset_choice"],
    ".overlap": ["HASHES_FORMAT", "NEAR_DUPLICATE_DISTANCE", "NearDuplicateWarning",
                 "check_disjoint", "content_hashes", "image_hashes"],
    ".transforms": ["TTA_POLICIES", "DataConfig", "RandomCrop", "RandomHorizontalFlip",
                    "RandomResizedCrop", "SeededAugmentation", "cifar_augmentation",
                    "crop_augmentation", "eval_transform", "imagenet_augmentation",
                    "tta_transform"],
    ".views": ["INDEX_FORMAT", "ClassSubset", "image_view", "read_index_file"],
})

__all__ = [
    "DATASET_MAKERS",
    "EARLIER_FINGERPRINTS",
    "FINGERPRINT_PREFIX",
    "HASHES_FORMAT",
    "IMG_EXTENSIONS",
    "INDEX_FORMAT",
    "LAYOUTS",
    "NEAR_DUPLICATE_DISTANCE",
    "TTA_POLICIES",
    "ClassSubset",
    "DataConfig",
    "ImageFolderDataset",
    "NearDuplicateWarning",
    "RandomCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "SeededAugmentation",
    "bad_images_message",
    "check_disjoint",
    "check_image",
    "check_images",
    "check_output_outside",
    "check_split_classes",
    "cifar_augmentation",
    "content_hashes",
    "crop_augmentation",
    "dataset_fingerprint",
    "derive_seed",
    "describe_labels",
    "earlier_fingerprint",
    "eval_transform",
    "flush_denormal",
    "folder_fingerprint",
    "image_hashes",
    "image_view",
    "imagenet_augmentation",
    "label_problems_message",
    "list_classes",
    "load_image",
    "make_corrupted_folder",
    "make_digits_folder",
    "make_subset_folder",
    "make_synthetic_folder",
    "match_classes",
    "read_format_json",
    "read_index_file",
    "readable_images",
    "sample_digests",
    "subset_choice",
    "tta_transform",
    "write_format_json",
]
