// idem console: the only script. The pages work without it; it adds
// "select all" checkboxes and local times in tooltips.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll("input.pick").forEach(function (c) { c.checked = all.checked; });
    });
  }
  document.querySelectorAll("time[datetime]").forEach(function (t) {
    var d = new Date(t.getAttribute("datetime").replace(" ", "T"));
    if (!isNaN(d)) { t.title = d.toLocaleString(); }
  });
});
