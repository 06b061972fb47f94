// Live parts of a dashboard page: every element with data-refresh="URL" gets its content replaced
// by that URL's HTML fragment every data-every milliseconds, so the page follows the ledger without
// a reload. Open <details> (log panels) stay open across refreshes. No framework, no build step.
(function () {
  "use strict";
  var stamp = document.getElementById("updated");

  function openDetails(el) {
    var open = {};
    el.querySelectorAll("details").forEach(function (d, i) { open[i] = d.open; });
    return open;
  }

  function refresh(el) {
    var every = parseInt(el.dataset.every, 10) || 3000;
    fetch(el.dataset.refresh, { credentials: "same-origin", cache: "no-store", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (html) {
        var open = openDetails(el);
        el.innerHTML = html;
        el.querySelectorAll("details").forEach(function (d, i) { if (i in open) { d.open = open[i]; } });
        if (stamp) { stamp.textContent = "updated " + new Date().toLocaleTimeString(); stamp.className = "muted"; }
      })
      .catch(function (err) {
        if (stamp) { stamp.textContent = "not updated (" + err.message + "), retrying"; stamp.className = "warn"; }
      })
      .then(function () { setTimeout(function () { refresh(el); }, every); });
  }

  document.querySelectorAll("[data-refresh]").forEach(function (el) {
    setTimeout(function () { refresh(el); }, parseInt(el.dataset.every, 10) || 3000);
  });
})();
