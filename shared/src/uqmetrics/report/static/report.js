// The leaderboard's sorting and filtering (uqmetrics.report): plain DOM, no library, no network.
// A header click sorts the rows by that column (ascending, then descending; missing values
// last, ties in their previous order); the search box and the metadata selects hide rows.
// The column chooser shows or hides metric columns (class col-off): a hidden column's cells
// stay in the table, so sorting and filtering see every column. No state is kept.
(function () {
  "use strict";
  function cellValue(row, index, type) {
    var cell = row.cells[index];
    var text = cell.hasAttribute("data-value") ? cell.getAttribute("data-value")
                                               : cell.textContent.trim();
    if (type === "number") {
      var x = parseFloat(text);
      return isNaN(x) ? null : x;
    }
    return text === "" ? null : text;
  }

  function setUp(table) {
    var headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
    var body = table.tBodies[0];
    var root = table.closest("main") || document;
    var search = root.querySelector(".row-search");
    var selects = Array.prototype.slice.call(root.querySelectorAll(".row-filter"));
    var counter = root.querySelector(".row-count");
    var columnIndex = {};
    headers.forEach(function (th, i) { columnIndex[th.getAttribute("data-column")] = i; });

    headers.forEach(function (th, index) {
      if (!th.classList.contains("sortable")) { return; }
      th.addEventListener("click", function (event) {
        if (event.target.closest("a")) { return; }
        var order = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
        headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", order);
        var type = th.getAttribute("data-type");
        var sign = order === "ascending" ? 1 : -1;
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = cellValue(a, index, type), y = cellValue(b, index, type);
          if (x === null || y === null) { return (x === null) - (y === null); }
          var c = type === "number" ? (x < y ? -1 : x > y ? 1 : 0) : String(x).localeCompare(String(y));
          return sign * c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });

    function applyFilters() {
      var query = search ? search.value.trim().toLowerCase() : "";
      var shown = 0, rows = Array.prototype.slice.call(body.rows);
      rows.forEach(function (row) {
        var keep = !query || (row.getAttribute("data-search") || "").toLowerCase().indexOf(query) >= 0;
        selects.forEach(function (sel) {
          var index = columnIndex[sel.getAttribute("data-filter")];
          if (sel.value !== "" && index !== undefined && row.cells[index].getAttribute("data-value") !== sel.value) {
            keep = false;
          }
        });
        row.hidden = !keep;
        shown += keep ? 1 : 0;
      });
      if (counter) { counter.textContent = shown + " of " + rows.length + " rows"; }
    }
    if (search) { search.addEventListener("input", applyFilters); }
    selects.forEach(function (sel) { sel.addEventListener("change", applyFilters); });
    applyFilters();

    var toggles = Array.prototype.slice.call(root.querySelectorAll("input.column-toggle"));
    var columnCount = root.querySelector(".column-count");
    function showColumn(name, on) {
      var index = columnIndex[name];
      if (index === undefined) { return; }
      headers[index].classList.toggle("col-off", !on);
      Array.prototype.forEach.call(body.rows, function (row) {
        row.cells[index].classList.toggle("col-off", !on);
      });
    }
    function countShown() {
      if (!columnCount) { return; }
      var on = toggles.filter(function (box) { return box.checked; }).length;
      columnCount.textContent = on + " of " + toggles.length + " metric columns shown";
    }
    function setAll(which) {
      toggles.forEach(function (box) {
        box.checked = which(box);
        showColumn(box.value, box.checked);
      });
      countShown();
    }
    toggles.forEach(function (box) {
      box.addEventListener("change", function () { showColumn(box.value, box.checked); countShown(); });
    });
    var all = root.querySelector("button.show-all");
    var headline = root.querySelector("button.show-headline");
    if (all) { all.addEventListener("click", function () { setAll(function () { return true; }); }); }
    if (headline) {
      headline.addEventListener("click", function () {
        setAll(function (box) { return box.hasAttribute("data-headline"); });
      });
    }
  }

  document.querySelectorAll("table.leaderboard").forEach(setUp);
}());
