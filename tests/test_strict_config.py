"""tests/ runs under the same strict pytest settings as each distribution (tox.ini [pytest])."""

import pytest
from uqmetrics import UndefinedMetricWarning, auroc_score


def test_settings_are_strict(request):
    cfg = request.config
    assert cfg.inipath is not None and cfg.inipath.name == "tox.ini"
    assert cfg.getini("xfail_strict") is True
    assert "error::uqmetrics.metrics.exceptions.UqmetricsWarning" in cfg.getini("filterwarnings")
    assert {"--strict-markers", "--strict-config"} <= set(cfg.getini("addopts"))


def test_uqmetrics_warning_attributed_to_the_caller_is_an_error():
    # auroc_score warns with stacklevel=3: the warning's module is this test module's, so only
    # the category filter (not a uqmetrics.* module filter) makes it an error
    with pytest.raises(UndefinedMetricWarning):
        auroc_score([True, True], [0.1, 0.2])
