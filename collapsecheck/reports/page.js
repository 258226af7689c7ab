// collapsecheck's report page: sortable tables, and a prompt's traces opened when its link
// is followed. Everything else on the page works without it.
"use strict";
function cellValue(row, index) {
  const cell = row.cells[index];
  const raw = cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent;
  const number = parseFloat(raw);
  return Number.isNaN(number) ? raw.toLowerCase() : number;
}
function sortBy(table, index, header) {
  const ascending = header.getAttribute("aria-sort") !== "ascending";
  for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
  header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = cellValue(a, index), y = cellValue(b, index);
    const missing = (v) => v === "" || v === "-";
    if (missing(x) !== missing(y)) return missing(x) ? 1 : -1;
    const order = x < y ? -1 : x > y ? 1 : 0;
    return ascending ? order : -order;
  });
  for (const row of rows) body.appendChild(row);
}
function openFromHash() {
  const target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
  if (target && target.tagName === "DETAILS") {
    target.open = true;
    target.scrollIntoView();
  }
}
document.addEventListener("DOMContentLoaded", () => {
  for (const table of document.querySelectorAll("table.sortable")) {
    Array.from(table.tHead.rows[0].cells).forEach((header, index) => {
      header.addEventListener("click", () => sortBy(table, index, header));
    });
  }
  window.addEventListener("hashchange", openFromHash);
  openFromHash();
  document.body.dataset.ready = "true";
});
