"""The test settings turn the package's own warnings (and uqmetrics') into errors by category,
whichever module a warning is attributed to."""

import numpy as np
import pytest
from uqmetrics import auroc_score
from uqmetrics.metrics.exceptions import UqmetricsWarning

from uqvision.cache import index_caches
from uqvision.exceptions import SkippedCacheWarning, UqvisionWarning


def test_uqvision_warnings_raised_with_stacklevel_2_are_errors(tmp_path):
    (tmp_path / "junk.nc").write_bytes(b"not a netCDF file")
    # stacklevel=2 attributes the warning to this test module, not to uqvision
    with pytest.raises(SkippedCacheWarning, match="skipping unreadable cache"):
        index_caches([tmp_path])
    assert issubclass(SkippedCacheWarning, UqvisionWarning)


def test_uqmetrics_warnings_are_errors():
    with pytest.raises(UqmetricsWarning):
        auroc_score(np.ones(4, dtype=bool), np.arange(4.0))  # no wrong prediction: undefined
