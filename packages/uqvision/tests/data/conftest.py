"""Fixtures of the data tests: ``magick``, for the corruptions that run ImageMagick."""

import os

import pytest
from uqmetrics import InputError

from uqvision.data.corruptions_original import check_imagemagick


@pytest.fixture(scope="session")
def magick():
    """Skip where Wand or ImageMagick's library is missing, saying what to install; under
    ``CI=true`` fail instead (.ci/run installs Debian's libmagickwand-6.q16-6 and the tox
    environments the ``uqvision[imagemagick]`` extra)."""
    try:
        check_imagemagick(["motion_blur"])
    except InputError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{exc}; CI=true: the ImageMagick tests must run in CI")
        pytest.skip(str(exc))
