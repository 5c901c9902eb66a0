// The console's only script: it refreshes the overview, follows the
// progress of a bulk action or a replay, and asks before a write. Every
// page works without it.
"use strict";

(function () {
  // Replace an element's content with a fragment the server rendered
  // (and escaped) every few seconds, until the fragment says it is
  // finished.
  function follow(el, url, every) {
    var timer = setInterval(function () {
      fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (r) {
          if (!r.ok) { throw new Error(r.status); }
          return r.text();
        })
        .then(function (html) {
          el.innerHTML = html;
          if (el.querySelector("[data-finished]")) { clearInterval(timer); }
        })
        .catch(function () { /* keep the last content; try again */ });
    }, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(function (el) {
      follow(el, el.getAttribute("data-refresh"), 5000);
    });
    document.querySelectorAll("[data-poll]").forEach(function (el) {
      if (!el.querySelector("[data-finished]")) {
        follow(el, el.getAttribute("data-poll"), 1000);
      }
    });
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (ev) {
        if (!window.confirm(form.getAttribute("data-confirm"))) { ev.preventDefault(); }
      });
    });
  });
})();
