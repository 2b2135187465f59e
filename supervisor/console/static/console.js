// hunter console: follow the live stream and re-read the part of the page that changed.
// The page says what it follows in <body data-follow>: "all", "turn:<id>", "session:<id>",
// "reconnect" (the daemon is unreachable: wait for it), or nothing.
(() => {
  "use strict";
  const body = document.body;
  const follow = body.dataset.follow || "";
  const live = document.getElementById("live");
  const main = document.getElementById("main");
  const mark = (text, title) => { if (live) { live.textContent = text; live.title = title; } };

  if (follow === "reconnect") {
    const check = () => fetch("/healthz", { credentials: "same-origin" })
      .then((r) => { if (r.ok) location.reload(); else setTimeout(check, 2000); })
      .catch(() => setTimeout(check, 2000));
    setTimeout(check, 2000);
    return;
  }
  if (!follow || !main) return;

  let timer = null;
  let running = false;
  let again = false;
  // never replace a form an operator has started to fill in (a reason typed, not yet sent)
  const typing = () => Array.from(main.querySelectorAll("form input:not([type=hidden])"))
    .some((el) => el.value && el.name !== "after");
  const refresh = async () => {
    if (running || typing()) { again = true; return; }
    running = true;
    try {
      const r = await fetch(location.href, {
        credentials: "same-origin",
        headers: { "X-Console-Partial": "main" },
      });
      if (r.redirected || r.status === 401) { location.reload(); return; }
      if (r.ok) {
        main.innerHTML = await r.text();  // the server's escaped HTML; no script runs from it
        body.dataset.updated = String(Date.now());
      }
    } catch (e) {
      mark("○", "cannot reach the console");
    } finally {
      running = false;
      if (again) { again = false; soon(); }
    }
  };
  // bursts of events cost one re-read: at most one every 300 ms (a second on busy pages)
  const delay = follow === "all" ? 1000 : 300;
  const soon = () => { if (!timer) timer = setTimeout(() => { timer = null; refresh(); }, delay); };

  const [what, id] = follow === "all" ? ["", ""] : [follow.slice(0, follow.indexOf(":")), follow.slice(follow.indexOf(":") + 1)];
  const url = "/events" + (what ? "?" + new URLSearchParams({ [what]: id }).toString() : "");
  const source = new EventSource(url);
  source.onopen = () => {
    mark("●", "live: this page follows the daemon's changes");
    // subscribed first, read second: a change between the page's load and the stream's
    // opening (or while reconnecting) is in this re-read, the later ones come as events
    soon();
  };
  source.onmessage = () => soon();
  source.onerror = () => mark("○", "reconnecting to the live stream");
  document.addEventListener("input", () => { if (again && !typing()) soon(); });
})();
