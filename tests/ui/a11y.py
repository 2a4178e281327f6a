"""Accessibility/polish checks shared by the browser tests (the newcomer journey uses them too).

`unlabelled_controls(page)` lists visible interactive controls without an accessible name;
`horizontal_overflow(page)` reports how far the page or the main container scrolls sideways.
"""

from __future__ import annotations

from typing import Any

_UNLABELLED_JS = r"""
() => {
  const sel = 'input:not([type=hidden]), textarea, select, button, [role=button], [role=radio], [role=checkbox], '
    + '[role=tab], [role=combobox], [role=slider], [contenteditable=true]';
  const visible = el => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  const name = el => {
    const t = s => (s || '').replace(/\s+/g, ' ').trim();
    if (t(el.getAttribute('aria-label'))) return t(el.getAttribute('aria-label'));
    const lb = el.getAttribute('aria-labelledby');
    if (lb) { const n = lb.split(/\s+/).map(id => t(document.getElementById(id)?.innerText)).join(' ').trim(); if (n) return n; }
    if (el.id) { const l = document.querySelector(`label[for="${CSS.escape(el.id)}"]`); if (l && t(l.innerText)) return t(l.innerText); }
    const wrap = el.closest('label'); if (wrap && t(wrap.innerText)) return t(wrap.innerText);
    if (el.tagName === 'BUTTON' || el.getAttribute('role') === 'button' || el.getAttribute('role') === 'tab') {
      if (t(el.innerText)) return t(el.innerText);
    }
    if (t(el.getAttribute('title'))) return t(el.getAttribute('title'));
    if (el.tagName === 'INPUT' && ['button','submit'].includes(el.type) && t(el.value)) return t(el.value);
    return '';
  };
  const classes = el => el.className && typeof el.className === 'string'
    ? '.' + el.className.split(/\s+/).slice(0,2).join('.') : '';
  return [...document.querySelectorAll(sel)].filter(visible).filter(el => !name(el)).map(el =>
    `${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}${classes(el)} in ${el.closest('[id]')?.id || '?'}`);
}
"""

_OVERFLOW_JS = r"""
() => {
  const doc = document.documentElement;
  const main = document.querySelector('.gradio-container') || document.body;
  return {page: doc.scrollWidth - doc.clientWidth, main: main.scrollWidth - main.clientWidth};
}
"""


def unlabelled_controls(page: Any) -> list[str]:
    return list(page.evaluate(_UNLABELLED_JS))


def horizontal_overflow(page: Any) -> dict[str, int]:
    return dict(page.evaluate(_OVERFLOW_JS))
