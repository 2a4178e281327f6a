// moet-panel's page script (auth on): keeps the session key and the device key in this origin's
// storage and adds them to the page's own requests. Cookies are sent to every port of a host
// (RFC 6265); localStorage belongs to one origin (scheme, host AND port), so a page on another port
// never holds these keys and the cookies alone open nothing. docs/ui-and-safety.md#sessions
(() => {
  "use strict";
  const KEY = "moet-panel.session", DEVICE = "moet-panel.device", PARAM = "moet_session";
  const store = window.localStorage;
  const key = () => store.getItem(KEY);
  const own = (u) => { try { return new URL(u, location.href).origin === location.origin; } catch (e) { return false; } };
  const pathOf = (u) => { try { return new URL(u, location.href).pathname; } catch (e) { return ""; } };

  // Navigations never carry the key, so the page arrives as the login shell. With a key here, drop
  // the shell's config: Gradio then fetches /config itself, through the fetch below, with the key.
  let config;
  Object.defineProperty(window, "gradio_config", {
    configurable: true,
    get: () => config,
    set: (v) => { config = (v && v.auth_required && key()) ? undefined : v; },
  });

  const note = (text) => {
    let box = document.getElementById("moet-session-note");
    if (!box) {
      box = document.createElement("div");
      box.id = "moet-session-note";
      box.setAttribute("role", "alert");
      box.style.cssText = "position:fixed;top:8px;left:50%;transform:translateX(-50%);z-index:10000;" +
        "background:#fef3c7;color:#78350f;border:1px solid #d97706;border-radius:6px;padding:6px 12px;font:14px sans-serif";
      document.body.appendChild(box);
    }
    box.textContent = text;
  };

  const seen = async (url, response, signed) => {
    const path = pathOf(url);
    if (path.endsWith("/login") && response.ok) {
      const s = response.headers.get("x-moet-session-key"), d = response.headers.get("x-moet-device-key");
      if (s) store.setItem(KEY, s);
      if (d) store.setItem(DEVICE, d);
    } else if (path.endsWith("/login") && ([413, 429, 503].includes(response.status) ||
        (response.status === 400 && (response.headers.get("content-type") || "").startsWith("text/plain")))) {
      // the panel's own answers (throttled, busy, too long); Gradio's "Incorrect credentials" is JSON
      note(await response.clone().text());
    } else if (response.status === 401 && signed) {
      store.removeItem(KEY);  // the session ended (expired, signed out elsewhere): back to the login form
      location.reload();
    }
    return response;
  };

  const realFetch = window.fetch.bind(window);
  window.fetch = (input, init) => {
    const url = input instanceof Request ? input.url : String(input);
    if (!own(url)) return realFetch(input, init);
    const headers = new Headers((init && init.headers) || (input instanceof Request ? input.headers : undefined));
    const k = key(), d = store.getItem(DEVICE);
    if (k) headers.set("X-Moet-Session", k);
    if (d && pathOf(url).endsWith("/login")) headers.set("X-Moet-Device", d);
    return realFetch(input, Object.assign({}, init, { headers })).then((r) => seen(url, r, !!k));
  };

  const open = XMLHttpRequest.prototype.open, send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.open = function (method, url, ...rest) {
    this.moetOwn = own(url);
    return open.call(this, method, url, ...rest);
  };
  XMLHttpRequest.prototype.send = function (body) {
    const k = key();
    if (this.moetOwn && k) this.setRequestHeader("X-Moet-Session", k);
    return send.call(this, body);
  };

  const withKey = (u) => {
    const k = key();
    if (!k || !own(u)) return u;
    const url = new URL(u, location.href);
    url.searchParams.set(PARAM, k);
    return url.toString();
  };
  if (window.EventSource) {
    const RealES = window.EventSource;
    window.EventSource = function (url, opts) { return new RealES(withKey(String(url)), opts); };
    window.EventSource.prototype = RealES.prototype;
  }

  // Links and images the page shows without fetch (file downloads, previews): GET with the key in the
  // query (the gate accepts it there on GET only).
  const fix = (el) => {
    for (const attr of ["href", "src"]) {
      const v = el.getAttribute && el.getAttribute(attr);
      if (v && v.includes("/gradio_api/file") && !v.includes(PARAM + "=") && own(v)) el.setAttribute(attr, withKey(v));
    }
  };
  const watch = () => {
    new MutationObserver((records) => {
      for (const r of records) {
        if (r.type === "attributes") fix(r.target);
        for (const n of r.addedNodes || []) {
          if (n.nodeType !== 1) continue;
          fix(n);
          n.querySelectorAll && n.querySelectorAll("[href*='/gradio_api/file'],[src*='/gradio_api/file']").forEach(fix);
        }
      }
    }).observe(document.documentElement, { subtree: true, childList: true, attributes: true, attributeFilter: ["href", "src"] });
    if (!key()) return;
    const bar = document.createElement("div");  // a line of its own above the app, at the right
    bar.style.cssText = "display:flex;justify-content:flex-end;padding:4px 12px 0";
    const b = document.createElement("button");  // sign out everywhere: every session of this user ends
    b.id = "moet-signout";
    b.type = "button";
    b.textContent = "Sign out everywhere";
    b.title = "End every signed-in session of this user, in every browser";
    b.style.cssText = "font:12px sans-serif;padding:3px 8px;border:1px solid #9ca3af;border-radius:6px;" +
      "background:#f9fafb;color:#111827;cursor:pointer";
    b.addEventListener("click", async () => {
      try { await window.fetch("/logout", { method: "POST" }); } finally { store.removeItem(KEY); location.assign("/"); }
    });
    bar.appendChild(b);
    document.body.prepend(bar);
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watch); else watch();
})();
