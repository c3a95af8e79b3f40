"""End to end in a real headless browser (Debian's Chromium driven by Selenium through
/usr/bin/chromedriver): an operator logs in, finds an agent's memory, opens it, reverts it to an
older version and sees the new version -- which the store then serves. Saves a screenshot
(``SCREENSHOT_DIR=docs`` refreshes the one the README shows)."""

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from agentmemory import MemoryStore

from .conftest import redis_alias

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def navigate(browser, act):
    """Do ``act()`` (a click, a submit) and wait for the page it loads: until the old page's
    root element is gone and the new document has loaded. Reading elements before that would
    read the old page."""
    old = browser.find_element(By.TAG_NAME, "html")
    act()
    wait = WebDriverWait(browser, 30)
    wait.until(ec.staleness_of(old))
    wait.until(lambda b: b.execute_script("return document.readyState") == "complete")


def log_in(browser, url: str, username: str, password: str) -> None:
    """Open the login page ``url`` and log in, waiting for the page the form loads. Each attempt
    finds the fields afresh: a page replaced between finding an element and using it (met once
    in a suite run: "Node with given id does not belong to the document") is tried again, not
    failed; any other error is raised."""

    def attempt(driver) -> bool:
        try:
            for name, value in (("username", username), ("password", password)):
                field = driver.find_element(By.NAME, name)
                field.clear()
                field.send_keys(value)
            navigate(driver, driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click)
        except StaleElementReferenceException:
            return False
        except WebDriverException as exc:
            if "does not belong to the document" not in str(exc):
                raise
            return False
        return True

    browser.get(url)
    WebDriverWait(browser, 30).until(attempt)


def test_an_operator_reverts_a_memory_in_the_browser(live_server, browser, tmp_path):
    redis_alias()
    store = MemoryStore()
    store.remember("agent-42", "preferences", {"language": "en", "tone": "casual"})
    store.remember("agent-42", "preferences", {"language": "fr", "tone": "formal"})
    store.remember("agent-42", "open-tasks", ["book flight"], ttl=3600)
    store.remember("agent-7", "preferences", {"language": "de"})
    User.objects.create_superuser("operator", password="a long demo password")

    log_in(
        browser,
        f"{live_server.url}/admin/login/?next=/admin/agentmemory/memory/",
        "operator",
        "a long demo password",
    )

    search = browser.find_element(By.ID, "searchbar")
    search.send_keys("agent-42/pref")
    navigate(browser, search.submit)
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1 and "preferences" in rows[0].text
    navigate(browser, rows[0].find_element(By.LINK_TEXT, "agent-42").click)

    assert "version 2" in browser.find_element(By.CSS_SELECTOR, ".am-panel h2").text
    navigate(browser, browser.find_element(By.CSS_SELECTOR, "#am-version-1 input.am-revert").click)
    assert "new version 3" in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    assert "version 3" in browser.find_element(By.CSS_SELECTOR, ".am-panel h2").text
    newest = browser.find_element(By.CSS_SELECTOR, "#am-history tbody tr")
    assert newest.get_attribute("id") == "am-version-3" and "revert" in newest.text
    assert '"language": "en"' in browser.find_element(By.NAME, "value").get_attribute("value")

    record = store.recall("agent-42", "preferences")
    assert (record.version, record.value) == (3, {"language": "en", "tone": "casual"})

    browser.set_window_size(1280, 1500)
    browser.execute_script("window.scrollTo(0, 0)")
    shot = tmp_path / "admin-revert.png"
    assert browser.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("SCREENSHOT_DIR"):
        target = Path(os.environ["SCREENSHOT_DIR"]) / "admin-revert.png"
        target.write_bytes(shot.read_bytes())
