"""A memcheck report opened in a real headless browser (Debian's Chromium, as the admin's test):
the report of a run with a planted bug (--unsafe) shows the anomaly's section, and its pictures
-- the plots and the anomaly's timeline -- render. Saves a screenshot (``SCREENSHOT_DIR=docs``
refreshes the one the memcheck docs show)."""

from __future__ import annotations

import os
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def rendered(browser, element) -> bool:
    """Whether an <img> loaded and decoded (a broken or missing picture has no natural width)."""
    return browser.execute_script(
        "return arguments[0].complete && arguments[0].naturalWidth > 0", element
    )


def test_the_report_of_a_run_with_lost_updates_shows_them_in_the_browser(browser, tmp_path):
    folder = tmp_path / "report"
    with pytest.raises(SystemExit):
        call_command(
            "memcheck",
            *("--ops", "600", "--unsafe", "--faults", "none", "--workloads", "register,list"),
            *("--report", str(folder)),
            stdout=StringIO(),
            stderr=StringIO(),
        )
    browser.get((folder / "index.html").as_uri())
    WebDriverWait(browser, 30).until(
        lambda b: b.execute_script("return document.readyState") == "complete"
    )
    assert "anomalies" in browser.find_element(By.ID, "verdict").text
    # The first failed check (lost updates, as a rule; which checks catch the unlocked path
    # varies with the backend's timing) links to its section.
    failed = browser.find_element(By.CSS_SELECTOR, "#checks a.fail")
    assert failed.text.startswith("FAIL")
    check = failed.get_attribute("href").rsplit("#anomalies-", 1)[1]
    section = browser.find_element(By.ID, f"anomalies-{check}")
    assert check in section.text
    anomaly = browser.find_element(By.CSS_SELECTOR, ".anomaly")
    assert anomaly.text
    pictures = [
        browser.find_element(By.ID, "plot-throughput"),
        browser.find_element(By.ID, "plot-latency"),
        anomaly.find_element(By.CSS_SELECTOR, "img.timeline"),
    ]
    WebDriverWait(browser, 30).until(lambda b: all(rendered(b, img) for img in pictures))

    browser.set_window_size(1280, 1700)
    browser.execute_script(f"document.getElementById('anomalies-{check}').scrollIntoView()")
    shot = tmp_path / "memcheck-report.png"
    assert browser.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("SCREENSHOT_DIR"):
        (Path(os.environ["SCREENSHOT_DIR"]) / "memcheck-report.png").write_bytes(shot.read_bytes())
