// Select all: a checkbox with data-select-all ticks the checkboxes of its table.
document.addEventListener("change", function (e) {
  var box = e.target;
  if (!box.matches || !box.matches("input[data-select-all]")) return;
  var table = box.closest("table");
  if (!table) return;
  table.querySelectorAll("tbody input[type=checkbox]").forEach(function (c) { c.checked = box.checked; });
});
