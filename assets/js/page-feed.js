// moet-panel's page feed client (issue 42; docs/ui-and-safety.md#the-page-feed). The panel pushes, on one
// server-sent stream per page (GET /moet/feed, app/backend/pagefeed.py), the version of each part of the page
// ("topic": the header, each tab) when it moves. A part is redrawn (its hidden trigger button pressed: one
// Gradio event) only when it is on screen and its version differs from the one it last drew. Nothing runs
// for a tab that is not shown, and nothing for a page in the background: the stream is dropped while
// document.visibilityState is "hidden" and opened again when shown; its first message brings every version,
// so what changed meanwhile is drawn at once. A live log tail (the Engine and Logs tabs) comes as text on the
// stream and is set in its box here, no Gradio event (issue 49).
(() => {
  "use strict";
  const FEED = "/moet/feed";
  const latest = {};  // topic -> version the server last pushed
  const drawn = {};   // topic -> version this page last asked to draw
  const markup = {};  // element id -> HTML pushed and not yet drawn (the feed draws these parts itself)
  const texts = {};  // element id -> a live log tail's text pushed and not yet set in its box
  const pressed = {};  // topic -> redraws asked (tests, benches)
  let abort = null, retry = 0, started = false, streamFor = "";

  // The tab on screen (its panel's id "tab-<id>") and its settings: the stream is per shown tab, so a hidden
  // tab's own part (the Telemetry plots' points) is never sent.
  const shownTab = () => {
    for (const el of document.querySelectorAll('#main-tabs [id^="tab-"]:not([id$="-button"])')) {
      if (el.offsetParent !== null) return el.id.slice(4);
    }
    return "";
  };
  const query = () => {
    const tab = shownTab();
    let q = "?show=" + encodeURIComponent(tab);
    if (tab === "telemetry") {
      const w = document.querySelector('#telemetry-window input:checked');
      q += "&window=" + encodeURIComponent(w ? w.value : "15 min");
    }
    // a live log tail is sent as the page's view shows it (app/ui/logtail.py): a new view, a new stream
    const val = (sel, none) => { const el = document.querySelector(sel); return el ? el.value : none; };
    const on = (sel) => { const el = document.querySelector(sel); return !el || el.checked ? "1" : "0"; };
    const view = (p) => "&stream=" + encodeURIComponent(val("#" + p + "-stream input:checked", "both"))
      + "&needle=" + encodeURIComponent(val("#" + p + "-filter textarea", ""));
    if (tab === "engine") q += view("engine-log");
    if (tab === "logs") {
      q += view("logs") + "&source=" + encodeURIComponent(val("#logs-source input", ""))
        + "&probes=" + (document.querySelector("#logs-probes input:checked") ? "1" : "0")
        + "&follow=" + on("#logs-follow input");
    }
    return q;
  };
  // What a log view's settings are, for the listeners below (their change opens a stream for the new view).
  const LOG_VIEW = "#engine-log-stream, #engine-log-filter, #logs-source, #logs-stream, #logs-filter, #logs-probes, #logs-follow";

  const shown = (topic) => {
    if (topic === "header") return true;
    const el = document.getElementById("tab-" + topic);
    return !!el && el.offsetParent !== null;  // a hidden tab's panel has display:none
  };

  const press = (topic) => {
    const btn = document.getElementById("moet-poke-" + topic);
    if (!btn) return;
    drawn[topic] = latest[topic];
    pressed[topic] = (pressed[topic] || 0) + 1;
    (btn.tagName === "BUTTON" ? btn : btn.querySelector("button") || btn).click();
  };

  // A part the feed draws gets only what differs from what it shows: a changed text or attribute is set in
  // place (the header's figures: one text node each), a node of another kind is replaced, and nothing is
  // written when nothing differs — no style or layout for what did not move (issue 49).
  const tpl = document.createElement("template");
  const sync = (cur, want) => {
    const have = cur.childNodes, need = want.childNodes;
    for (let i = 0; i < need.length; i++) {
      const x = have[i], y = need[i];
      if (!x) { cur.appendChild(y.cloneNode(true)); continue; }
      if (x.nodeType !== y.nodeType || x.nodeName !== y.nodeName) { cur.replaceChild(y.cloneNode(true), x); continue; }
      if (x.nodeType !== 1) { if (x.nodeValue !== y.nodeValue) x.nodeValue = y.nodeValue; continue; }
      for (const a of y.attributes) if (x.getAttribute(a.name) !== a.value) x.setAttribute(a.name, a.value);
      for (const a of [...x.attributes]) if (!y.hasAttribute(a.name)) x.removeAttribute(a.name);
      sync(x, y);
    }
    while (have.length > need.length) cur.removeChild(cur.lastChild);
  };
  const patch = (el, html) => { tpl.innerHTML = html; sync(el, tpl.content); tpl.innerHTML = ""; };

  // A live log tail: its Gradio textbox's value set only when it differs, then an "input" event so Gradio's
  // own copy of the value follows (its bind:value) and its change listeners run as for a Gradio update (the
  // Logs tab's "Follow live" scroll); no request, no Gradio event through the server.
  const setText = (el, text) => {
    const ta = el.querySelector("textarea");
    if (!ta || ta.value === text) return;
    ta.value = text;
    ta.dispatchEvent(new Event("input", { bubbles: true }));
  };

  const catchUp = () => {
    if (document.visibilityState === "hidden") return;
    for (const id of Object.keys(markup)) {
      const el = document.getElementById(id);
      if (el && el.offsetParent !== null) { patch(el, markup[id]); delete markup[id]; }
    }
    for (const id of Object.keys(texts)) {
      const el = document.getElementById(id);
      if (el && el.offsetParent !== null) { setText(el, texts[id]); delete texts[id]; }
    }
    for (const topic of Object.keys(latest)) {
      if (latest[topic] !== drawn[topic] && shown(topic)) press(topic);
    }
  };
  window.__moetFeed = { latest, drawn, markup, texts, pressed, catchUp, stream: () => streamFor };

  const connect = async () => {
    if (abort || document.visibilityState === "hidden") return;
    const ctl = new AbortController();
    abort = ctl;
    streamFor = query();
    try {
      const res = await window.fetch(FEED + streamFor, { signal: ctl.signal, cache: "no-store" });
      if (!res.ok || !res.body) throw new Error("feed " + res.status);
      retry = 0;
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          for (const line of chunk.split("\n")) {
            if (!line.startsWith("data: ")) continue;
            const msg = JSON.parse(line.slice(6));
            Object.assign(latest, msg.v || {});
            Object.assign(markup, msg.html || {});
            Object.assign(texts, msg.text || {});
            if (msg.plot && window.__moetPlots) window.__moetPlots.apply(msg.plot);
          }
          catchUp();
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
    } finally {
      if (abort === ctl) abort = null;
    }
    // closed by the server (restart) or refused: try again, slower each time, while the page is shown
    retry = Math.min(retry + 1, 6);
    setTimeout(connect, 1000 * 2 ** (retry - 1));
  };

  // Another tab shown, or another Telemetry window: a new stream for it (the old one ends).
  const restream = () => {
    if (!started || document.visibilityState === "hidden") return;
    if (abort && query() === streamFor) { catchUp(); return; }
    if (abort) { abort.abort(); abort = null; }
    connect();
    catchUp();
  };
  document.addEventListener("change", (ev) => {
    if (ev.target && ev.target.closest && ev.target.closest("#telemetry-window")) setTimeout(restream, 0);
    if (ev.target && ev.target.closest && ev.target.closest(LOG_VIEW)) setTimeout(restream, 0);
  }, true);
  // a log filter applies on Enter (its Gradio submit); a run picked from the list shows once Gradio has set it
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && ev.target && ev.target.closest && ev.target.closest(LOG_VIEW)) setTimeout(restream, 0);
  }, true);
  document.addEventListener("click", (ev) => {
    if (ev.target && ev.target.closest && ev.target.closest("#logs-source, .options")) {
      for (const ms of [0, 100, 400]) setTimeout(restream, ms);
    }
  }, true);

  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "hidden") {
      if (abort) { abort.abort(); abort = null; }
    } else if (started) {
      connect();
    }
  });
  // A tab opened (a click, or the server selecting one): draw what it missed. Only the tab buttons are watched.
  document.addEventListener("click", (ev) => {
    if (ev.target && ev.target.closest && ev.target.closest('[role="tab"]')) {
      for (const ms of [0, 100, 400]) setTimeout(restream, ms);  // the panel shows once Gradio has drawn it
    }
  }, true);

  // Start once the app (not the login page) has drawn its first state.
  const start = () => {
    const marker = document.querySelector('#moet-loaded [data-loaded="1"]');
    if (!marker) return false;
    started = true;
    const tabs = document.getElementById("main-tabs");
    if (tabs) {  // the selected tab moved (a click, or the server selecting one): only aria-selected is watched
      new MutationObserver(() => setTimeout(restream, 0))
        .observe(tabs, { subtree: true, attributes: true, attributeFilter: ["aria-selected"] });
    }
    connect();
    return true;
  };
  const boot = setInterval(() => { if (start()) clearInterval(boot); }, 250);
})();
