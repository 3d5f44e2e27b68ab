"""uqmetrics.report's published rows (issue 38, published numbers beside the user's): a hook's
``published`` blocks are shown in a table of their own under the leaderboard, each row marked
published with its citations, written to the page's JSON and never to the manifest (no cache
stands behind them: ``verify`` cannot check them); without a hook's ``published`` nothing
changes."""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from uqmetrics import stamp_result, write_dataset
from uqmetrics.report import PublishedRows, ReportHook, build_site


def _result(tmp_path):
    ds = xr.Dataset({"auroc": ("model", np.array([0.7, 0.8]))},
                    coords={"model": ["resnet50.tv_in1k", "mine"]})
    ds = stamp_result(ds, "toy", input_checksums=["ab" * 32], metrics={"auroc": "auroc"})
    return write_dataset(ds, tmp_path / "toy.nc")


def test_published_rows_are_shown_cited_and_kept_out_of_the_manifest(tmp_path):
    block = PublishedRows("paper: its table", ("model", "column", "published", "yours"),
                          (("resnet50.tv_in1k", "auroc", 76.02, 70.0),),
                          ("[s] A. Author, Title, 2023; Table 1; org/repo f.csv at commit abc",),
                          "setting: how the numbers were made")
    hook = ReportHook(published=lambda ds: [block])
    result = _result(tmp_path)
    build_site([result], tmp_path / "site", hooks={"toy": hook}, figures=False)
    html = (tmp_path / "site" / "toy.html").read_text()
    assert "Published numbers (cited; not re-verifiable)" in html
    assert html.count('<tr class="published">') == 1
    assert '<span class="badge published">published</span>' in html
    assert 'data-value="76.02"' in html and "org/repo f.csv at commit abc" in html
    data = json.loads((tmp_path / "site" / "data" / "toy.json").read_text())
    assert data["published"] == [{"title": "paper: its table",
                                  "columns": ["model", "column", "published", "yours"],
                                  "rows": [["resnet50.tv_in1k", "auroc", 76.02, 70.0]],
                                  "citations": list(block.citations),
                                  "note": "setting: how the numbers were made"}]
    manifest = json.loads((tmp_path / "site" / "manifest.json").read_text())
    assert [e["row"] for e in manifest["entries"]] == ["resnet50.tv_in1k", "mine"]
    # no published block: no section, no JSON key
    build_site([result], tmp_path / "plain", hooks={"toy": ReportHook()},
               figures=False)
    plain = (tmp_path / "plain" / "toy.html").read_text()
    assert 'id="published"' not in plain and '<tr class="published">' not in plain
    assert "published" not in json.loads((tmp_path / "plain" / "data" / "toy.json").read_text())
