"""The leaderboard page (issue #56 item 3) in a real headless browser: Debian's chromium driven by
Selenium (.ci/run installs both). It loads with no console error, sorting by a column reorders the
rows, a filter hides the others, a cell's link opens its rows, and the numbers shown equal
report.md's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.core.results import load_results
from bench.report.leaderboard_report import write_leaderboard

ROOT = Path(__file__).resolve().parents[3]
STUDIES = [ROOT / "results" / "ruler", ROOT / "results" / "training_free"]


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.fail(
            "the leaderboard page is tested in Debian's chromium: apt-get install chromium "
            "chromium-driver (.ci/run does)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def _markdown_rows(report: str) -> list[list[str]]:
    lines = report.split("## Ranked", 1)[1].split("## What", 1)[0].strip().splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("leaderboard")
    table = write_leaderboard(load_results(STUDIES), out, "test rows").table
    driver = _browser()
    try:
        driver.get((out / "index.html").as_uri())
        yield driver, table, (out / "report.md").read_text()
    finally:
        driver.quit()


def _visible_rows(driver) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "#board tbody tr")
    return [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows if r.is_displayed()]


def test_the_page_loads_without_a_console_error_and_shows_report_mds_numbers(page):
    driver, table, report = page
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    shown = _visible_rows(driver)
    assert len(shown) == len(table) > 10
    assert shown == _markdown_rows(report)  # cell for cell, in the same order


def _perplexity(cell: str) -> str:
    """The perplexity of a "ppl at L" cell ("5.84† #3–5": the value, the bad-at-L mark, the
    rank interval)."""
    return cell.split(" #")[0].rstrip("†")


def test_sorting_by_a_column_reorders_the_rows(page):
    from selenium.webdriver.common.by import By

    driver, table, report = page
    before = _visible_rows(driver)
    heads = driver.find_elements(By.CSS_SELECTOR, "#board thead th")
    names = [h.text for h in heads]
    column = names.index("ppl at L")
    heads[column].click()  # ascending by the number, missing values last
    values = [_perplexity(row[column]) for row in _visible_rows(driver)]
    numbers = [float(v) for v in values if v != "–"]
    assert numbers == sorted(numbers) and values[-1] == "–"
    assert _visible_rows(driver) != before  # control: the order did change
    heads[column].click()  # descending
    again = [float(_perplexity(r[column])) for r in _visible_rows(driver) if r[column] != "–"]
    assert again == sorted(again, reverse=True)
    heads[names.index("overall")].click()  # by the overall rank interval's start, unranked last
    overall = [r[names.index("overall")] for r in _visible_rows(driver)]
    starts = [int(x[1:].split("–")[0]) for x in overall if x.startswith("#")]
    assert starts == sorted(starts) and len(starts) < len(overall)
    assert all(not x.startswith("#") for x in overall[len(starts) :])


def test_filters_hide_the_other_rows_and_metrics(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver, table, _ = page
    method = Select(driver.find_element(By.ID, "f-method"))
    method.select_by_value("yarn")
    shown = _visible_rows(driver)
    names = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "#board thead th")]
    assert len(shown) == int((table["method"] == "yarn").sum()) > 0
    assert {row[names.index("method")] for row in shown} == {"yarn"}
    method.select_by_value("")  # control: all rows again
    assert len(_visible_rows(driver)) == len(table)
    recipe = Select(driver.find_element(By.ID, "f-recipe"))  # one recipe's block alone
    one = sorted(table["recipe_label"].unique())[0]
    recipe.select_by_value(one)
    assert len(_visible_rows(driver)) == int((table["recipe_label"] == one).sum()) < len(table)
    recipe.select_by_value("")
    metric = Select(driver.find_element(By.ID, "f-metric"))
    metric.select_by_value("passkey")
    heads = driver.find_elements(By.CSS_SELECTOR, "#board thead th")
    visible = [h.text for h in heads if h.is_displayed()]
    assert "passkey length" in visible and "passkey AUC" not in visible
    assert "perplexity AUC" not in visible and "RULER AUC" not in visible
    metric.select_by_value("")
    assert "perplexity AUC" in [h.text for h in heads if h.is_displayed()]


def test_a_cell_links_to_its_rows(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver, table, _ = page
    link = driver.find_element(By.CSS_SELECTOR, "#board tbody tr td a")
    target = link.get_attribute("href").rsplit("#", 1)[1]
    details = driver.find_element(By.ID, target)
    assert details.get_attribute("open") is None
    link.click()
    # the page opens the target on its hashchange event, which fires after the click returns
    WebDriverWait(driver, 10).until(lambda _: details.get_attribute("open") is not None)
    rows = details.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) > 0  # the rows the rules read for that series
