"""The browser pass (`make test-browser`): one JupyterLab server and one headless Chromium per worker.

Skipped, with the reason, where Playwright or a system Chromium is missing: a learner's `make test`
needs no browser.
"""

import json
import os
import sys
from datetime import datetime
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from driver import REPO, LabServer, copy_checkout, find_chromium, open_lab

SHOTS = os.environ.get("NANOENGINE_SHOTS", os.path.join("build", "browser"))


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    server = LabServer(copy_checkout(tmp_path_factory.mktemp("checkout")), tmp_path_factory.mktemp("jupyter"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra: make setup")
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no system Chromium: apt-get install -y chromium (or set CHROMIUM to its path)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium)
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def page(browser, lab):
    """One JupyterLab tab per worker, kept across tests as a learner keeps theirs open from chapter to
    chapter: loading JupyterLab's front end takes 7-30 s on a busy 2-core machine, opening a notebook in
    it a few seconds. Each test opens its notebook in it and closes it again."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    yield open_lab(context.new_page(), lab)
    context.close()


@pytest.fixture(scope="session")
def shots():
    os.makedirs(SHOTS, exist_ok=True)
    return SHOTS


def recorded_seconds(notebook: Path) -> float:
    """How long the notebook's cells took in its stored run (the execution times nbconvert records)."""

    def seconds(cell):
        times = cell.get("metadata", {}).get("execution", {})
        start, end = times.get("iopub.execute_input"), times.get("shell.execute_reply")
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() if start and end else 0.0

    return sum(map(seconds, json.loads(notebook.read_text())["cells"]))


def pytest_collection_modifyitems(items):
    """The longest notebook first, the rest as collected. In chapter order it came last, and its worker ran it alone
    for 40 s while the other's core stood idle. Only the longest moves: two heavy notebooks at once slow each
    other down (decoding on this CPU is bound by memory), so the others keep the order that pairs heavy with light."""
    notebooks = {
        item: REPO / "notebooks" / item.callspec.params["notebook"]
        for item in items
        if hasattr(item, "callspec") and "notebook" in item.callspec.params
    }
    if notebooks:
        longest = max(notebooks, key=lambda item: recorded_seconds(notebooks[item]))
        items.remove(longest)
        items.insert(0, longest)


def pytest_terminal_summary(terminalreporter):
    if os.path.isdir(SHOTS) and os.listdir(SHOTS):
        terminalreporter.write_line(f"widget screenshots: {os.path.abspath(SHOTS)}")
