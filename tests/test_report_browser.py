"""The report in a real browser: headless Chromium opens it from file://, logs no error, shows
every figure at a non-zero size, shows the final table's rows, renders a screenshot, and
requests nothing but the file itself and inline ``data:`` resources.

Needs ``chromium``, ``chromium-driver`` (Debian: ``apt-get install chromium chromium-driver``)
and ``selenium``; without any of them the test is skipped and says which is missing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from report_dirs import NAMES, make_sweep

from rlscope.report.build import DEFAULT_METRICS, build_report

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _missing() -> str | None:
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install selenium)"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if shutil.which(path) is None:
            return f"{path} not found (apt-get install {package})"
    return None


@pytest.fixture
def driver() -> Iterator[Any]:
    missing = _missing()
    if missing:
        pytest.skip(f"browser test needs headless Chromium: {missing}")
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    try:
        d = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    except WebDriverException as e:
        pytest.skip(f"browser test needs headless Chromium: it did not start ({e.msg})")
    try:
        yield d
    finally:
        d.quit()


def _requested_urls(performance_log: list[dict[str, Any]]) -> list[str]:
    """Every URL the page asked the network stack for (DevTools Network events)."""
    urls = []
    for entry in performance_log:
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_report_in_headless_chromium(driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    sweep = make_sweep(tmp_path / "sweep")
    report = build_report(sweep)
    url = report.html.resolve().as_uri()
    driver.get(url)
    assert driver.execute_script("return document.readyState") == "complete"
    assert driver.title.startswith("rlscope sweep report")

    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe

    figures = driver.find_elements(By.CSS_SELECTOR, "figure.report-figure img")
    assert len(figures) == len(DEFAULT_METRICS)
    for img in figures:
        driver.execute_script("arguments[0].scrollIntoView()", img)
        assert img.is_displayed()
        assert img.size["width"] > 100 and img.size["height"] > 50
        # decoded: an SVG that failed to load has naturalWidth 0
        assert driver.execute_script("return arguments[0].complete && "
                                     "arguments[0].naturalWidth", img) > 0

    rows = driver.find_elements(By.CSS_SELECTOR, "#final-table tbody tr.final-row")
    assert len(rows) == len(NAMES)
    assert all(r.is_displayed() for r in rows)

    local = ("file:", "data:")
    resources = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert not [r for r in resources if not r.startswith(local)]
    requested = _requested_urls(driver.get_log("performance"))
    assert url in requested
    assert not [u for u in requested if not u.startswith(local)]

    shot = tmp_path / "report.png"
    assert driver.save_screenshot(str(shot))
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
