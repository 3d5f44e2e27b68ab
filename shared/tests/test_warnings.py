"""uqmetrics' warnings: own categories, and test filters that actually catch them.

A warning raised with ``stacklevel=k > 1`` is attributed to the module ``k - 1`` frames up, the
caller's, so a filter on uqmetrics' *module* (``error::UserWarning:uqmetrics.*``) never sees the
warnings metrics raise about their caller's input. The configured filters select by category.
"""

import warnings

import numpy as np
import pytest
from _pytest.config import parse_warning_filter

from uqmetrics import UndefinedMetricWarning, UqmetricsWarning, auroc_score
from uqmetrics.metrics.retrieval import human_alignment_score

#: Raise a uqmetrics warning: (call, the stacklevel uqmetrics raises it with).
WARNING_CALLS = {
    "human_alignment_score (stacklevel=2)":
        lambda: human_alignment_score([0.5, 0.5, 0.5], [[1.0, 0.0], [0.5, 0.5], [0.9, 0.1]]),
    "auroc_score (stacklevel=3)": lambda: auroc_score([True, True], [0.1, 0.2]),
}


def _apply(filters):
    for f in filters:
        warnings.filterwarnings(*parse_warning_filter(f, escape=False))


def test_every_uqmetrics_warning_is_a_uqmetrics_warning():
    assert issubclass(UndefinedMetricWarning, UqmetricsWarning)
    assert issubclass(UqmetricsWarning, UserWarning)  # as sklearn's, visible by default


@pytest.mark.parametrize("call", WARNING_CALLS.values(), ids=list(WARNING_CALLS))
def test_warning_is_attributed_to_the_caller(call):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert np.isnan(call())
    assert [w.category for w in seen] == [UndefinedMetricWarning]
    assert seen[0].filename == __file__  # this module, not uqmetrics: why module filters miss


@pytest.mark.parametrize("call", WARNING_CALLS.values(), ids=list(WARNING_CALLS))
def test_configured_filters_make_uqmetrics_warnings_errors(call, request):
    """Under this session's configured ``filterwarnings`` (shared/pyproject.toml) alone."""
    filters = request.config.getini("filterwarnings")
    with warnings.catch_warnings():
        warnings.resetwarnings()
        _apply(filters)
        with pytest.raises(UndefinedMetricWarning):
            call()
    # and, as pytest applies them to every test, here too without any help
    with pytest.raises(UndefinedMetricWarning):
        call()
    assert "error::uqmetrics.metrics.exceptions.UqmetricsWarning" in filters  # the documented string


@pytest.mark.parametrize("call", WARNING_CALLS.values(), ids=list(WARNING_CALLS))
def test_module_filter_misses_them(call):
    """The old filter: the warning stays a warning (this is the defect the category fixes)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        _apply(["error::UserWarning:uqmetrics.*"])
        assert np.isnan(call())
    assert [w.category for w in seen] == [UndefinedMetricWarning]
