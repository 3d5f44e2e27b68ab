"""The report site in a real browser: the installed ``uqvision`` and ``uqreg`` console scripts
write a smoke reproduction and a small study, ``report`` makes their sites, and Debian's
chromium (through its chromedriver and Selenium, headless) opens them from disk (file://).

Checked in the rendered DOM: no console error; every metric cell's exact value (its
``data-value``) equals the netCDF value and its text is that value's rounding; a click on a
column header orders the rows as the sorted netCDF values (again: reversed); a metadata filter
keeps exactly the rows with that value; a provenance panel opens on a click. Only the headline
metric columns are displayed at first (every column's cells are in the DOM, checked above by
their data-value); ticking a hidden column in the column chooser displays it, and it sorts;
"headline only" hides it again. A screenshot of each page (the headline view, sorted, the
first metric columns in view) goes to the test's folder. The OOD page's default table is
OpenOOD's: a row per model and detector, near/far FPR@95 and AUROC and ID accuracy; each page's
subtitle is the run's (its models), not the paper's.

Where no browser is installed the tests skip, saying so, except under ``CI=true`` (.ci/run
installs chromium and chromium-driver): there they fail.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import uqmetrics
from uqmetrics.report import (
    column_name,
    column_values,
    format_value,
    headline_columns,
    leaderboard,
    read_manifest,
)
from uqmetrics.runs.result_schema import metric_variables

BROWSER, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
#: Flags under which chromium runs here: headless, no sandbox (root in containers), and no
#: background traffic (a closed network refuses it, which would read as console errors).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000")

pytestmark = pytest.mark.slow

_ROWS_JS = """
return Array.from(document.querySelectorAll('#leaderboard > tbody > tr')).map(tr => ({
    row: tr.getAttribute('data-row'), hidden: tr.hidden,
    cells: Array.from(tr.cells).map(td => [td.getAttribute('data-value'),
                                           td.textContent.trim()])}));
"""
_COLUMNS_JS = """
return Array.from(document.querySelectorAll('#leaderboard > thead > tr > th')).map(th => [
    th.getAttribute('data-column'), th.classList.contains('metric')]);
"""

#: Scroll to the page's top and the table sideways to its first metric column, which then sits
#: right of the (sticky) row names: the screenshot's view.
_FIRST_METRICS_JS = """
window.scrollTo(0, 0);
const wrap = document.querySelector('.table-wrap');
wrap.scrollLeft = 0;
const names = document.querySelector('#leaderboard th.rowname').getBoundingClientRect();
const metric = document.querySelector('#leaderboard th.metric').getBoundingClientRect();
wrap.scrollLeft = metric.left - names.right;
"""


def _browser_missing() -> str:
    missing = [str(p) for p in (BROWSER, DRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the Python package selenium")
    return f"no browser to drive: {', '.join(missing)} missing (.ci/run installs Debian's " \
           "chromium and chromium-driver)" if missing else ""


@pytest.fixture(scope="module")
def browser():
    why = _browser_missing()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why}; CI=true: the browser test must run in CI")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(BROWSER)
    profile = tempfile.mkdtemp(prefix="uq-report-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _run(*argv: str, timeout: float = 600) -> str:
    exe = shutil.which(argv[0])
    assert exe, f"the {argv[0]} console script must be installed"
    res = subprocess.run([exe, *argv[1:]], check=False, capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "MPLBACKEND": "Agg"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def _errors(driver) -> list[dict]:
    """The console's errors since the last call (the browser log is drained by reading)."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _open(driver, page: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page.resolve().as_uri())
    # a large page (inline figures) can still be parsing when get() returns on a loaded machine
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script("return document.readyState") == "complete")
    assert _errors(driver) == [], page


def _expected_columns(ds, variables, dim: str) -> list[str]:
    """The metric columns the page must show: one per label combination of a variable's other
    dims (in the variable's dim order)."""
    out = []
    for var in variables:
        others = [d for d in ds[var].dims if d != dim]
        for combo in itertools.product(*([str(v) for v in ds.indexes[d]] for d in others)):
            out.append(column_name(var, dict(zip(others, combo, strict=True))))
    return out


def _sorted_order(rows: list[str], values: dict[str, float], descending: bool) -> list[str]:
    """Stable sort of ``rows`` by value (ties keep their order, as the page's comparator in a
    stable sort), missing (NaN) values last either way."""
    present = [r for r in rows if not math.isnan(values[r])]
    missing = [r for r in rows if math.isnan(values[r])]
    return sorted(present, key=(lambda r: -values[r]) if descending else values.get) + missing


def _click_header(driver, column: str) -> None:
    """A real click on a header's top-left corner (its padding: not the convention link)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    th = driver.find_element(By.CSS_SELECTOR, f'#leaderboard th[data-column="{column}"]')
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", th)
    size = th.size
    ActionChains(driver).move_to_element_with_offset(
        th, -size["width"] // 2 + 2, -size["height"] // 2 + 2).click().perform()


def _displayed(driver) -> dict[str, bool]:
    """Metric column -> whether its header and every cell of its column are displayed (they
    must agree)."""
    from selenium.webdriver.common.by import By

    out = {}
    first = driver.find_element(By.CSS_SELECTOR, "#leaderboard > tbody > tr")
    cells = first.find_elements(By.CSS_SELECTOR, ":scope > td")
    ths = driver.find_elements(By.CSS_SELECTOR, "#leaderboard > thead > tr > th")
    for th, td in zip(ths, cells, strict=True):
        if "metric" in th.get_attribute("class").split():
            out[th.get_attribute("data-column")] = th.is_displayed()
            assert td.is_displayed() == out[th.get_attribute("data-column")]
    return out


def _tick(driver, column: str) -> None:
    """Open the column chooser and click a column's checkbox."""
    from selenium.webdriver.common.by import By

    chooser = driver.find_element(By.CSS_SELECTOR, "details.column-chooser")
    if chooser.get_attribute("open") is None:
        chooser.find_element(By.CSS_SELECTOR, "summary").click()
    box = chooser.find_element(By.CSS_SELECTOR, f'input.column-toggle[value="{column}"]')
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    box.click()


def _check_leaderboard(driver, page: Path, ds, dim: str, variables, sort_column: str,
                       shot: Path, headline: list[str]) -> list[dict]:
    """The DOM checks shared by both sites; returns the rows as first rendered. ``headline``:
    the metric columns displayed at first."""
    from selenium.webdriver.common.by import By

    _open(driver, page)
    header = driver.execute_script(_COLUMNS_JS)
    metric_cols = [c for c, is_metric in header if is_metric]
    assert metric_cols == _expected_columns(ds, variables, dim)
    col_index = {c: i for i, (c, _) in enumerate(header)}
    rows = driver.execute_script(_ROWS_JS)
    labels = [str(v) for v in ds.indexes[dim]]
    assert [r["row"] for r in rows] == labels
    n_checked = 0
    for col in metric_cols:
        expected = column_values(ds, col, dim)
        for i, r in enumerate(rows):
            exact, shown = r["cells"][col_index[col]]
            if math.isnan(expected[i]):
                assert exact == "NaN" and shown == format_value(expected[i]), (col, r["row"])
            else:
                assert float(exact) == expected[i], (col, r["row"])  # the float64, exactly
                assert shown == format_value(expected[i]), (col, r["row"])
            n_checked += 1
    assert n_checked == len(metric_cols) * len(labels)

    # the headline columns are displayed, the others hidden (their cells checked above)
    displayed = _displayed(driver)
    assert [c for c in metric_cols if displayed[c]] == headline
    hidden = [c for c in metric_cols if not displayed[c]]
    choosers = driver.find_elements(By.CSS_SELECTOR, "details.column-chooser")
    assert len(choosers) == (1 if hidden else 0)  # a chooser where a column is hidden
    assert sort_column in headline  # the screenshot's view: sorted by a headline column

    # sorting: the rows follow the netCDF values of the clicked column
    values = dict(zip(labels, column_values(ds, sort_column, dim), strict=True))
    _click_header(driver, sort_column)
    order = [r["row"] for r in driver.execute_script(_ROWS_JS)]
    assert order == _sorted_order(labels, values, descending=False)
    assert driver.current_url == page.resolve().as_uri()  # the click sorted, did not navigate
    _click_header(driver, sort_column)
    descending = [r["row"] for r in driver.execute_script(_ROWS_JS)]
    assert descending == _sorted_order(order, values, descending=True)
    assert descending != order or len(set(values.values())) <= 1
    driver.execute_script(_FIRST_METRICS_JS)
    driver.save_screenshot(str(shot))  # sorted, the first metric columns in view
    assert shot.read_bytes()[:4] == b"\x89PNG"

    # ticking a hidden column displays it, and it sorts; "show all" shows every column,
    # "headline only" hides the others again
    if hidden:
        extra = hidden[0]
        count = driver.find_element(By.CSS_SELECTOR, ".column-count")
        assert count.text == f"{len(headline)} of {len(metric_cols)} metric columns shown"
        _tick(driver, extra)
        assert _displayed(driver) == {c: c in headline or c == extra for c in metric_cols}
        assert count.text == f"{len(headline) + 1} of {len(metric_cols)} metric columns shown"
        extra_values = dict(zip(labels, column_values(ds, extra, dim), strict=True))
        _click_header(driver, extra)
        by_extra = [r["row"] for r in driver.execute_script(_ROWS_JS)]
        assert by_extra == _sorted_order(descending, extra_values, descending=False)
        driver.find_element(By.CSS_SELECTOR, "button.show-all").click()
        assert all(_displayed(driver).values())
        driver.find_element(By.CSS_SELECTOR, "button.show-headline").click()
        assert [c for c, on in _displayed(driver).items() if on] == headline
        assert count.text == f"{len(headline)} of {len(metric_cols)} metric columns shown"
        assert [r["row"] for r in driver.execute_script(_ROWS_JS)] == by_extra  # order kept

    # a provenance panel opens
    first = driver.find_element(By.CSS_SELECTOR, "#leaderboard > tbody > tr")
    body = first.find_element(By.CSS_SELECTOR, "details.prov .prov-body")
    assert not body.is_displayed()
    first.find_element(By.CSS_SELECTOR, "details.prov summary").click()
    assert body.is_displayed()
    assert first.find_element(By.CSS_SELECTOR, "details.prov").get_attribute("open") is not None
    assert "git commit" in body.text
    assert _errors(driver) == []
    return rows


def test_infinite_values_show_and_sort_as_infinities(browser, tmp_path):
    """An infinite value is a value (an NLL of a label given probability 0), not a missing
    one: its cell shows ``∞`` / ``−∞`` and holds ``Infinity`` / ``-Infinity``, which the page
    sorts as the largest and smallest values, NaN last either way. Before, the cell showed
    ``–`` and held Python's ``inf``, which the page's ``parseFloat`` reads as NaN: sorted with
    the missing values."""
    import xarray as xr
    from uqmetrics import stamp_result, write_dataset
    from uqmetrics.report import build_site

    ds = xr.Dataset({"nll": ("model", [0.3, np.inf, np.nan, 0.1, -np.inf])},
                    coords={"model": ["a", "b", "c", "d", "e"]})
    path = write_dataset(stamp_result(ds, "toy", input_checksums=["ab" * 32],
                                      metrics={"nll": "nll"}), tmp_path / "toy.nc")
    build_site([path], tmp_path / "site")
    ds = uqmetrics.read_result(path)
    _check_leaderboard(browser, tmp_path / "site" / "toy.html", ds, "model", ["nll"], "nll",
                       tmp_path / "toy.png", ["nll"])
    cells = {r["row"]: r["cells"] for r in browser.execute_script(_ROWS_JS)}
    assert [cells[m][-1][1] for m in "abcde"] == ["0.3000", "∞", "–", "0.1000", "−∞"]


def test_selective_smoke_site_in_browser(browser, selective_smoke, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    site = tmp_path / "site"
    result = selective_smoke / "scores" / "selective.nc"  # the session's smoke reproduction
    _run("uqvision", "report", str(result), "--out", str(site))
    ds = uqmetrics.read_result(result)

    _open(browser, site / "index.html")
    link = browser.find_element(By.CSS_SELECTOR, 'a[href="selective.html"]')
    assert link.is_displayed()
    browser.save_screenshot(str(tmp_path / "index.png"))
    variables = list(metric_variables(ds))
    # the generic headline: 11 variables along calibration (2) would be 22 columns, more than
    # 16: every variable at calibration=none
    headline = [f"{v}[calibration=none]" for v in variables]
    assert headline == headline_columns(leaderboard(result, "selective", ds=ds).columns)
    assert len(headline) < len(_expected_columns(ds, variables, "model"))  # a chooser to use
    _check_leaderboard(browser, site / "selective.html", ds, "model", variables,
                       "auroc[calibration=none]", tmp_path / "selective.png", headline)
    if os.environ.get("UQ_REPORT_SCREENSHOT"):  # docs/figures/report.png (docs/report.md)
        shutil.copyfile(tmp_path / "selective.png", os.environ["UQ_REPORT_SCREENSHOT"])

    # the subtitle is the run's (its models), not the paper's; the images are said
    subtitle = browser.find_element(By.CSS_SELECTOR, "p.subtitle").text
    assert subtitle.startswith(f"{ds.sizes['model']} models;") and "523" not in subtitle
    images = browser.find_element(By.CSS_SELECTOR, "p.images").text
    assert f"n_images = {ds.attrs['n_images']}" in images

    # a metadata filter keeps exactly the rows with that value
    select = browser.find_element(By.CSS_SELECTOR, 'select.row-filter[data-filter="architecture"]')
    value = str(ds["architecture"].values[0])
    Select(select).select_by_value(value)
    shown = {r["row"] for r in browser.execute_script(_ROWS_JS) if not r["hidden"]}
    want = {str(m) for m, a in zip(ds["model"].values, ds["architecture"].values, strict=True)
            if str(a) == value}
    assert shown == want and 0 < len(want) < ds.sizes["model"]
    count = browser.find_element(By.CSS_SELECTOR, ".row-count").text
    assert count == f"{len(want)} of {ds.sizes['model']} rows"

    # the figures are inline SVG, every one decoded by the browser
    sizes = browser.execute_script(
        "return Array.from(document.querySelectorAll('.figures img')).map(i => "
        "[i.src.slice(0, 26), i.naturalWidth])")
    assert sizes and all(src == "data:image/svg+xml;base64," and w > 0 for src, w in sizes)
    _open(browser, site / "conventions.html")
    assert browser.find_element(By.ID, "selective-auroc").is_displayed()
    assert _errors(browser) == []
    entries = read_manifest(site)["entries"]
    assert [e["row"] for e in entries] == [str(m) for m in ds.indexes["model"]]

    # the CSV download: timm's results columns first, from the same file
    with open(site / "data" / "selective.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert list(table[0])[:6] == ["model", "top1", "top1_err", "param_count", "img_size",
                                  "method"]
    accuracy = ds["accuracy"].sel(calibration="none").values
    for rec, acc, params in zip(table, accuracy, ds["params"].values, strict=True):
        assert float(rec["top1"]) == 100 * acc and float(rec["top1_err"]) == 100 - 100 * acc
        assert float(rec["param_count"]) == params / 1e6
        assert float(rec["auroc[calibration=none]"]) == ds["auroc"].sel(
            model=rec["model"], calibration="none").item()


def test_uqreg_study_site_in_browser(browser, tmp_path):
    from uqreg.report import COLUMNS, HOOK

    out, site = tmp_path / "study", tmp_path / "site"
    _run("uqreg", "study", "--task", "sinusoid", "--complexities", "1,2", "--methods",
         "blr,bd,ens", "--repetitions", "3", "--members", "3", "--epochs", "20",
         "--mc-samples", "10", "--out", str(out), "--no-plots", "--quiet")
    _run("uqreg", "report", str(out / "study.nc"), "--out", str(site))
    ds = uqmetrics.read_dataset(out / "study.nc")
    headline = leaderboard(out / "study.nc", "uqreg", HOOK, ds=ds).headline
    assert headline  # the rule's, or the hook's where it sets one
    _check_leaderboard(browser, site / "uqreg.html", ds, "method", list(COLUMNS),
                       "region_coverage[recipe=paper,complexity=2,region=in]",
                       tmp_path / "uqreg.png", headline)
    entries = read_manifest(site)["entries"]
    assert [e["id"] for e in entries] == ["uqreg:blr", "uqreg:bd", "uqreg:ens"]
    for e in entries:
        for col, v in e["metrics"].items():
            want = column_values(ds, col, "method")[list(ds.indexes["method"]).index(e["row"])]
            assert (v is None and np.isnan(want)) or v == want


#: OpenOOD v1.5's table: near- and far-OOD FPR@95 and AUROC, and ID accuracy.
OPENOOD_COLUMNS = ["near_fpr_at_95_tpr", "near_auroc", "far_fpr_at_95_tpr", "far_auroc",
                   "id_accuracy"]


def test_ood_site_default_table_is_openoods(browser, tmp_path):
    """Issue 37 §5: the OOD page's default table has a row per model and detector and shows
    OpenOOD's columns, each cell the netCDF value; a click on near AUROC sorts the rows."""
    from selenium.webdriver.common.by import By

    out, site = tmp_path / "repro", tmp_path / "site"
    _run("uqvision", "reproduce", "ood", "--scale", "smoke", "--out", str(out))
    result = out / "ood.nc"
    _run("uqvision", "report", str(result), "--out", str(site))
    ds = uqmetrics.read_result(result)
    page = site / "ood.html"
    _open(browser, page)
    header = browser.execute_script(_COLUMNS_JS)
    assert [c for c, _ in header[:2]] == ["model", "detector"]
    displayed = _displayed(browser)
    assert [c for c, on in displayed.items() if on] == OPENOOD_COLUMNS
    pairs = [(str(m), str(d)) for m in ds.indexes["model"] for d in ds.indexes["detector"]]
    rows = browser.execute_script(_ROWS_JS)
    assert [r["row"] for r in rows] == [f"{m}/{d}" for m, d in pairs]
    index = {c: i for i, (c, _) in enumerate(header)}
    for r, (m, d) in zip(rows, pairs, strict=True):
        assert r["cells"][index["detector"]][0] == d
        for col in OPENOOD_COLUMNS:
            want = float(ds[col].sel(model=m, **({"detector": d} if "detector" in ds[col].dims
                                                  else {})))
            exact = r["cells"][index[col]][0]
            assert (exact == "NaN") if math.isnan(want) else (float(exact) == want), (col, m, d)
    subtitle = browser.find_element(By.CSS_SELECTOR, "p.subtitle").text
    assert subtitle.startswith(f"{ds.sizes['model']} models (")
    assert f"× {ds.sizes['detector']} detectors" in subtitle
    values = {f"{m}/{d}": float(ds["near_auroc"].sel(model=m, detector=d)) for m, d in pairs}
    _click_header(browser, "near_auroc")
    order = [r["row"] for r in browser.execute_script(_ROWS_JS)]
    assert order == _sorted_order(list(values), values, descending=False)
    ids = [e["id"] for e in read_manifest(site)["entries"]]
    assert ids == [f"ood:{m}/{d}" for m, d in pairs]
    assert _errors(browser) == []
