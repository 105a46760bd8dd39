// ambient console: live updates. An element with data-live="topic1 topic2" and data-fragment="NAME" is re-fetched
// (the current URL with fragment=NAME) and its content replaced when the server's /events stream names one of its
// topics; a "resync" event re-fetches every live part. A hidden tab (another tab in front, a minimised window)
// fetches nothing: it notes which parts changed and fetches them once it is shown, so fifty open tabs cost the
// console what the few in sight ask. No eval, no inline handlers (the CSP forbids them).
(function () {
  "use strict";

  var inflight = new Map(); // element -> true while a fetch runs
  var again = new Set(); // elements that changed again during their fetch
  var unseen = new Set(); // elements that changed while the tab was hidden

  function fragmentUrl(name) {
    var url = new URL(window.location.href);
    url.searchParams.delete("notice");
    url.searchParams.delete("level");
    url.searchParams.set("fragment", name);
    return url.toString();
  }

  function refresh(el) {
    var name = el.getAttribute("data-fragment");
    if (!name) return;
    if (document.hidden) { unseen.add(el); return; }
    if (inflight.get(el)) { again.add(el); return; }
    if (el.contains(document.activeElement) && document.activeElement.matches("input, textarea, select")) {
      // Someone is typing a note here: do not wipe it; try again once they leave the field.
      again.add(el);
      document.activeElement.addEventListener("blur", function () { flush(el); }, { once: true });
      return;
    }
    inflight.set(el, true);
    fetch(fragmentUrl(name), { credentials: "same-origin", headers: { "X-Requested-With": "ambient-live" } })
      .then(function (resp) { return resp.ok ? resp.text() : null; })
      .then(function (html) {
        if (html !== null) {
          el.innerHTML = html;
          el.dispatchEvent(new CustomEvent("ambient:swapped", { bubbles: true }));
        }
      })
      .catch(function () { /* the stream's reconnect triggers a resync */ })
      .finally(function () { inflight.delete(el); flush(el); });
  }

  function flush(el) {
    if (again.has(el)) { again.delete(el); refresh(el); }
  }

  function liveElements() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-live][data-fragment]"));
  }

  function onChange(topics) {
    var wanted = new Set(topics);
    liveElements().forEach(function (el) {
      var mine = (el.getAttribute("data-live") || "").split(/\s+/);
      for (var i = 0; i < mine.length; i++) {
        if (mine[i] && wanted.has(mine[i])) { refresh(el); return; }
      }
    });
  }

  function resync() { liveElements().forEach(refresh); }

  function shown() {
    if (document.hidden) return;
    var changed = Array.from(unseen);
    unseen.clear();
    changed.forEach(refresh);
  }

  function connect() {
    var status = document.getElementById("live-status");
    if (!window.EventSource || liveElements().length === 0) {
      if (status) status.hidden = true;
      return;
    }
    if (status) status.hidden = false;
    // The console is served under a secret path prefix (data-root on <body>): every address it asks for is under it.
    var source = new EventSource((document.body.getAttribute("data-root") || "") + "/events");
    source.addEventListener("open", function () {
      if (status) { status.className = "live-status on"; status.textContent = "live"; }
      // What changed between the page's rendering and this connection (or while reconnecting) was not sent to
      // us: fetch every live part once now.
      resync();
    });
    source.addEventListener("error", function () {
      if (status) { status.className = "live-status off"; status.textContent = "reconnecting"; }
    });
    source.addEventListener("change", function (ev) {
      try { onChange(JSON.parse(ev.data).topics || []); } catch (e) { resync(); }
    });
    source.addEventListener("resync", resync);
    document.addEventListener("visibilitychange", shown);
    window.addEventListener("pagehide", function () { source.close(); });
  }

  function dropNoticeFromUrl() {
    // The notice of an action shows once; reloading the page should not show it again.
    var url = new URL(window.location.href);
    if (url.searchParams.has("notice") || url.searchParams.has("level")) {
      url.searchParams.delete("notice");
      url.searchParams.delete("level");
      window.history.replaceState(null, "", url.pathname + url.search + url.hash);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    dropNoticeFromUrl();
    connect();
  });
})();
