/* moet-panel: the Chat tab's quick start (docs/chat.md, "Time to first token").
 *
 * Gradio's path from a click on Send to the first token on screen takes tens of milliseconds
 * (its queue's round trips, scheduling, a full Chatbot render). This script posts the Send to the
 * panel's own route the moment it is clicked (or Enter is pressed), draws the first tokens in a
 * preview at the bottom of the chat, and only then lets Gradio handle the click. Gradio's event
 * gets the Send's ticket through its js= hook and takes the same reply over (no second request to
 * the engine); its own rendering then replaces the preview. History, Stop, stats and the thinking
 * block are Gradio's as before. Without this script, or when the route refuses, Send works as it
 * always did.
 *
 * The other fields of a Send (conversation, sampling, system prompt, endpoint, edit mode) are not
 * all in the page (a closed accordion is not rendered), so a js-only Gradio event mirrors them from
 * Gradio's own store into `composer` whenever they change.
 */
(() => {
  "use strict";
  const ROUTE = "moet-panel/chat/send";
  const DEFER_MAX_MS = 50; // Gradio's handling of the click waits at most this for the first token (deferMs)
  const TAKEOVER_MAX_MS = 3000; // the preview goes at the latest this long after Gradio claimed the reply
  const THINKING_TAIL = 4000; // characters of thinking the preview draws
  const LEAVE = "#chat-stop, #chat-new, #chat-convs, #chat-delete, #chat-clear, #chat-regen, #chat-import";

  let composer = null; // {conv_id, editing, system, custom_url, temperature, top_p, min_p, max_tokens}
  let pendingTicket = ""; // for the Gradio event that our replayed click triggers
  let replaying = false;
  let active = null; // the Send in flight until Gradio has taken it over

  function newTicket() { // crypto.randomUUID needs a secure context; a LAN address over http is not one
    const b = crypto.getRandomValues(new Uint8Array(16));
    return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  }

  function routeUrl() {
    const root = (window.gradio_config && window.gradio_config.root) || location.href.replace(/[?#].*$/, "");
    return root.replace(/\/?$/, "/") + ROUTE;
  }

  function begin(btn) {
    const box = document.querySelector("#chat-input textarea");
    if (!composer || !box || btn.disabled || !box.value.trim() || !composer.conv_id) return false;
    const run = {
      ticket: newTicket(), btn, r: "", c: "", dispatched: false, answered: false, left: false,
      preview: null, observer: null, abort: new AbortController(),
    };
    active = run;
    showPreview(run, box.value); // the message shows at once; its first tokens fill in below it
    const body = {
      ticket: run.ticket, conv_id: composer.conv_id, text: box.value, edit: !!composer.editing,
      system_prompt: composer.system || "", custom_url: composer.custom_url || "",
      temperature: composer.temperature, top_p: composer.top_p, min_p: composer.min_p,
      max_tokens: composer.max_tokens || null,
    };
    fetch(routeUrl(), {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
      credentials: "same-origin", signal: run.abort.signal, priority: "high",
    }).then((r) => {
      run.answered = true;
      return r.ok && r.body ? read(run, r) : refused(run);
    }, () => refused(run));
    setTimeout(() => dispatch(run, run.ticket), window.moetChat.deferMs);
    return true;
  }

  function refused(run) { // the route said no (or is not there): Gradio sends, and shows why if it fails too
    dispatch(run, "");
    finish(run);
  }

  function dispatch(run, ticket) { // hand the click to Gradio (once)
    if (run.dispatched) return;
    run.dispatched = true;
    pendingTicket = ticket;
    replaying = true;
    try { run.btn.click(); } finally { replaying = false; }
  }

  async function read(run, response) {
    if (run.left) return finish(run); // the route has the reply now: leaving may close this stream
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += decoder.decode(value, {stream: true});
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (line.startsWith("data: ")) handle(run, JSON.parse(line.slice(6)));
        }
      }
    } catch (e) {
      // aborted at takeover, or the connection broke: Gradio's own stream carries the reply
    }
    if (!run.dispatched) dispatch(run, run.ticket);
    if (!run.observer) watchTakeover(run); // a short reply can end before Gradio claims it
  }

  function handle(run, ev) {
    if (ev.ev === "text") {
      run.r = ev.reset ? ev.r : run.r + ev.r;
      run.c = ev.reset ? ev.c : run.c + ev.c;
      paint(run);
      if (!run.dispatched) { // let the browser show the token first, then give Gradio the click
        requestAnimationFrame(() => setTimeout(() => dispatch(run, run.ticket), 0));
      }
    } else if (ev.ev === "claimed") {
      run.claimed = true;
      watchTakeover(run);
    }
  }

  function showPreview(run, text) {
    const wrap = document.querySelector("#chat-bot .bubble-wrap");
    if (!wrap) return;
    const el = document.createElement("div");
    el.className = "moet-preview";
    el.setAttribute("aria-hidden", "true"); // Gradio's chat log announces the reply a moment later
    el.innerHTML = '<div class="moet-preview-user"></div><div class="moet-preview-thinking" hidden>' +
      '<div class="moet-preview-title">Thinking</div><div class="moet-preview-r"></div></div>' +
      '<div class="moet-preview-answer"></div>';
    el.querySelector(".moet-preview-user").textContent = text;
    run.preview = el;
    run.parts = {
      thinking: el.querySelector(".moet-preview-thinking"), r: el.querySelector(".moet-preview-r"),
      answer: el.querySelector(".moet-preview-answer"),
    };
    wrap.appendChild(el);
    wrap.scrollTop = wrap.scrollHeight;
  }

  function paint(run) {
    if (run !== active || run.left || !run.preview) return;
    const r = run.r.length > THINKING_TAIL ? "…" + run.r.slice(-THINKING_TAIL) : run.r;
    run.parts.thinking.hidden = !r;
    run.parts.r.textContent = r;
    run.parts.answer.textContent = run.c;
    requestAnimationFrame(() => { // keep the newest text in view, without a forced layout now
      const wrap = run.preview && run.preview.parentElement;
      if (wrap) wrap.scrollTop = wrap.scrollHeight;
    });
  }

  function watchTakeover(run) { // Gradio's first frame of the claimed reply replaces the preview
    if (run.observer) return;
    const wrap = run.preview && run.preview.parentElement;
    if (!wrap || !run.r && !run.c) return finish(run); // nothing drawn yet: Gradio draws it
    run.observer = new MutationObserver((records) => {
      const mine = run.preview;
      if (!mine || records.some((m) => !mine.contains(m.target))) finish(run);
    });
    run.observer.observe(wrap, {childList: true, subtree: true, characterData: true});
    setTimeout(() => finish(run), TAKEOVER_MAX_MS);
  }

  function finish(run) { // stop following; the reply itself goes on (Stop is Gradio's)
    if (run.observer) run.observer.disconnect();
    if (run.preview) run.preview.remove();
    run.preview = null;
    if (run.answered) run.abort.abort(); // before that, the route may not have the reply yet
    if (active === run) active = null;
  }

  function leave() { // Stop, another conversation...: Gradio gets the Send first, as without this script
    const run = active;
    if (!run) return;
    run.left = true;
    dispatch(run, run.ticket);
    finish(run);
  }

  function swallow(ev) {
    ev.preventDefault();
    ev.stopImmediatePropagation();
  }

  function onSend(ev, btn) {
    if (replaying || !btn || !window.moetChat.enabled) return;
    if (active && !active.dispatched) return swallow(ev); // a second Send while the first starts
    pendingTicket = "";
    if (begin(btn)) swallow(ev);
  }

  document.addEventListener("click", (ev) => {
    const t = ev.target instanceof Element ? ev.target : null;
    if (!t) return;
    if (t.closest("#chat-send")) onSend(ev, t.closest("#chat-send"));
    else if (!replaying && t.closest(LEAVE)) leave();
  }, true);
  document.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter" || ev.shiftKey || ev.isComposing) return;
    const t = ev.target instanceof Element ? ev.target : null;
    if (t && t.closest("#chat-input textarea")) onSend(ev, document.querySelector("#chat-send"));
  }, true);

  window.moetChat = {
    enabled: true, // false: Send goes through Gradio alone (the benchmark compares both)
    deferMs: DEFER_MAX_MS,
    // js-only Gradio event: the Send's other inputs, whenever one changes
    setComposer(names, values) { composer = Object.fromEntries(names.map((n, i) => [n, values[i]])); },
    // js= hook of the Send events: the last input is the ticket
    withTicket(args) {
      const out = args.slice();
      out[out.length - 1] = pendingTicket;
      pendingTicket = "";
      return out;
    },
  };
})();
