"""Every admin page a newcomer opens, in a real headless browser at 1,024 and 1,440 px wide, on
the records ``manage.py demo`` seeds: nothing cut or pushed past the window's edge (the page is
no wider than the window), every text readable (WCAG AA contrast: 4.5:1, 3:1 for large text,
computed from the colours the browser rendered), a forgotten memory offering "Revert" and not
"Forget", the History button showing the memory's versions. A screenshot of each page at each
width goes to ``out/screenshots/`` (``SCREENSHOT_DIR`` elsewhere) for a reviewer to look at."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from selenium.webdriver.common.by import By

from agentmemory.models import CheckpointThread, Log, Memory

from .conftest import redis_alias
from .test_admin_browser import log_in, navigate

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = (1024, 1440)

#: Each text node's colour against the background it is drawn on (the nearest ancestor with an
#: opaque one), as WCAG 2.x computes contrast; the elements that fall short, described.
CONTRAST = """
function channel(c) { c /= 255; return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); }
function luminance(rgb) { return 0.2126 * channel(rgb[0]) + 0.7152 * channel(rgb[1]) + 0.0722 * channel(rgb[2]); }
function parse(text) { const m = text.match(/[\\d.]+/g) || []; return m.map(Number); }
function background(el) {
  for (let e = el; e; e = e.parentElement) {
    const c = parse(getComputedStyle(e).backgroundColor);
    if (c.length >= 3 && (c.length < 4 || c[3] > 0.9)) return c;
  }
  return [255, 255, 255];
}
const failing = [];
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
const seen = new Set();
while (walker.nextNode()) {
  const el = walker.currentNode.parentElement;
  if (!el || seen.has(el) || !walker.currentNode.textContent.trim()) continue;
  seen.add(el);
  const style = getComputedStyle(el);
  const box = el.getBoundingClientRect();
  if (style.visibility === 'hidden' || style.display === 'none' || box.width === 0) continue;
  if (el.closest('[aria-hidden=true], .hidden, option, script, style, noscript')) continue;
  const fg = parse(style.color), bg = background(el);
  const [a, b] = [luminance(fg), luminance(bg)].sort((x, y) => y - x);
  const ratio = (a + 0.05) / (b + 0.05);
  const size = parseFloat(style.fontSize), bold = parseInt(style.fontWeight) >= 700;
  const large = size >= 24 || (bold && size >= 18.66);
  if (ratio < (large ? 3 : 4.5)) {
    failing.push(`${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}.${el.className} ` +
      `"${el.textContent.trim().slice(0, 40)}": ${ratio.toFixed(2)} (${style.color} on rgb(${bg}))`);
  }
}
return failing;
"""

#: What is cut or scrolled sideways: the page past the window's edge, or a box (the changelist's
#: results, a pre) whose content is wider than it shows.
OVERFLOW = """
const cut = [];
const page = document.documentElement.scrollWidth - window.innerWidth;
if (page > 0) cut.push(`the page: ${page} px past the window's edge`);
for (const el of document.querySelectorAll('body *')) {
  if (el.closest('.visually-hidden')) continue;  // for screen readers, clipped on purpose
  const style = getComputedStyle(el);
  if (!['auto', 'scroll', 'hidden'].includes(style.overflowX) || el.clientWidth === 0) continue;
  const hidden = el.scrollWidth - el.clientWidth;
  if (hidden > 1) cut.push(`${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}.${el.className}: ${hidden} px hidden`);
}
return cut;
"""


@pytest.fixture
def seeded(live_server, browser):
    redis_alias()
    call_command("demo", "--username", "operator", "--password", "a long demo password")
    log_in(
        browser, f"{live_server.url}/admin/login/?next=/admin/", "operator", "a long demo password"
    )
    assert User.objects.filter(username="operator").exists()
    return live_server.url


def pages() -> dict[str, str]:
    forgotten = Memory.objects.get(session_id="demo-agent-2", key="scratchpad")
    live = Memory.objects.get(session_id="demo-agent-1", key="preferences")
    log = Log.objects.get(session_id="demo-agent-1", stream="openai-agents")
    thread = CheckpointThread.objects.get(thread_id="demo-trip")
    return {
        "memories": "/admin/agentmemory/memory/",
        "memory": f"/admin/agentmemory/memory/{live.pk}/change/",
        "forgotten-memory": f"/admin/agentmemory/memory/{forgotten.pk}/change/",
        "logs": "/admin/agentmemory/log/",
        "log": f"/admin/agentmemory/log/{log.pk}/change/",
        "threads": "/admin/agentmemory/checkpointthread/",
        "thread": f"/admin/agentmemory/checkpointthread/{thread.pk}/change/",
    }


def screenshots() -> Path:
    folder = Path(os.environ.get("SCREENSHOT_DIR") or ROOT / "out" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_every_page_fits_1024_px_and_every_text_is_readable(seeded, browser):
    problems = []
    for width in WIDTHS:
        browser.set_window_size(width, 900)
        for name, path in pages().items():
            browser.get(seeded + path)
            assert browser.execute_script("return document.readyState") == "complete"
            problems += [f"{name} at {width} px: {cut}" for cut in browser.execute_script(OVERFLOW)]
            problems += [f"{name}: {text}" for text in browser.execute_script(CONTRAST)]
            height = browser.execute_script("return document.documentElement.scrollHeight")
            browser.set_window_size(width, min(max(height, 600), 4000))
            browser.save_screenshot(str(screenshots() / f"admin-{name}-{width}.png"))
            browser.set_window_size(width, 900)
    assert not problems, "\n".join(sorted(set(problems)))


def test_a_forgotten_memory_offers_revert_and_history_shows_the_versions(seeded, browser):
    page = pages()
    browser.get(seeded + page["forgotten-memory"])
    assert "forgotten" in browser.find_element(By.ID, "am-status").text
    assert not browser.find_elements(By.ID, "am-forget")  # nothing to forget
    assert not browser.find_elements(By.ID, "am-expire")
    assert browser.find_elements(By.CSS_SELECTOR, "#am-version-1 input.am-revert")
    navigate(browser, browser.find_element(By.CSS_SELECTOR, ".object-tools a.historylink").click)
    assert browser.current_url.endswith(page["forgotten-memory"] + "#am-history")
    versions = browser.find_elements(By.CSS_SELECTOR, "#am-history tr.am-version")
    assert [row.get_attribute("id") for row in versions] == ["am-version-2", "am-version-1"]
    browser.get(seeded + page["memory"])
    assert browser.find_elements(By.ID, "am-forget")  # a live memory may be forgotten
