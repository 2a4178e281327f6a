// No animation frame on an idle page (issue 49; docs/ui-and-safety.md, "The page feed").
// Gradio 6.31's StatusTracker counts a pending event's seconds with a requestAnimationFrame loop that ends only
// when its status leaves "pending". The page's own loading screen is such a tracker, and Gradio removes it in
// the same update that completes it: its loop never ends. Every tab of every page then asked for a frame every
// 16 ms, forever (the DevTools trace of an idle tab: ~60 frames/s, 60-70 ms of main thread a second).
// Gradio reads window.requestAnimationFrame once, when its module loads, so this runs first (in the page's
// <head>): that loop's step — recognised by its code, `()=>{set(t,(performance.now()-start)/1e3),running&&again()}`
// — runs from a one-second timer instead of a frame. A shown timer ("3.0s") counts in whole seconds; the leaked
// loop costs one short task a second and no frame. Every other frame request is untouched. Another Gradio
// version whose loop reads differently is left as it is (tests/ui/test_idle_page_browser.py then fails).
(() => {
  "use strict";
  const TIMER_STEP = /^\(\)=>\{[\w$]+\([\w$]+,\(performance\.now\(\)-[\w$]+\([\w$]+\)\)\/1e3\),[\w$]+&&[\w$]+\(\)\}$/;
  const frame = window.requestAnimationFrame.bind(window);
  const seen = { slowed: 0 };  // timer steps run from the one-second timer (tests)
  window.__moetFrames = seen;
  window.requestAnimationFrame = function requestAnimationFrame(step) {
    if (typeof step === "function" && step.length === 0 && TIMER_STEP.test(Function.prototype.toString.call(step))) {
      seen.slowed += 1;
      return -setTimeout(() => step(performance.now()), 1000);  // negative: never one of Chromium's frame ids
    }
    return frame(step);
  };
  const cancel = window.cancelAnimationFrame.bind(window);
  window.cancelAnimationFrame = function cancelAnimationFrame(id) {
    if (id < 0) clearTimeout(-id); else cancel(id);
  };
})();
