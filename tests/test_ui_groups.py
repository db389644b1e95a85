"""The MLflow UI groups a sweep's seeds by their lsexp.group tag: a real `mlflow server` on a real 2 x 3
sweep, driven in headless Chromium (Debian's chromium package) by Playwright.

Run with `pytest -m browser`; LSEXP_SCREENSHOTS=<folder> keeps the screenshots (table.png, charts.png).
Without chromium or Playwright the test is skipped, saying why; with LSEXP_REQUIRE_BROWSER=1 (CI) it fails.
"""

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port, made_once, run_cli, stop_group
from helpers.mlflow_store import FAST, runs, store
from helpers.required import unavailable

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"


def _unavailable(reason: str):
    unavailable("LSEXP_REQUIRE_BROWSER", reason)


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """(the UI's address, the experiment id) of a served store holding a 2 strategies x 3 seeds sweep."""
    if not Path(CHROMIUM).exists():
        _unavailable("Debian's chromium is not installed (apt-get install chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        _unavailable('Playwright is not installed (pip install -e ".[ui]")')

    def make(root):
        out = run_cli("-m", "loss_scale=fixed_drop,dynamic", "train.seed=range(1,4)", "amp=O2",
                      "train.max_steps=8", f"tracking.uri={store(root)}", *FAST, cwd=root)
        assert out.returncode == 0, out.stderr

    root = made_once(tmp_path_factory, "ui_sweep", make)
    _, experiment, _ = runs(store(root))
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                               store(root), "--host", "127.0.0.1", "--port", str(port)], cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=5)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise AssertionError("mlflow server did not come up")
                time.sleep(0.5)
        yield url, experiment.experiment_id
    finally:
        stop_group(server)


def test_the_runs_table_grouped_by_lsexp_group_has_one_entry_per_group_with_its_seeds(ui, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import expect, sync_playwright

    url, experiment_id = ui
    shots = Path(os.environ.get("LSEXP_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{url}/#/experiments/{experiment_id}/runs")
            # how a user turns it on: Group by, then the tag; the menu is opened again if it did not open
            option = page.get_by_text("lsexp.group", exact=True)
            for _ in range(3):
                page.get_by_role("button", name="Group by").click()
                page.keyboard.type("lsexp.group")
                try:
                    option.wait_for(timeout=20_000)
                    break
                except PlaywrightTimeoutError:
                    page.keyboard.press("Escape")
            option.click()
            page.keyboard.press("Escape")
            for group in ("loss_scale=dynamic", "loss_scale=fixed_drop"):
                expect(page.get_by_text(f"Group: {group}", exact=True)).to_be_visible(timeout=30_000)
            lines = [t.strip() for t in page.locator("body").inner_text().splitlines() if t.strip()]
            for group, strategy in (("loss_scale=dynamic", "dynamic"),
                                    ("loss_scale=fixed_drop", "fixed_drop")):
                at = lines.index(f"Group: {group}")
                # the group's count, then its three seeds' runs inside it
                assert lines[at + 1] == "3", lines[at:at + 12]
                inside = [t for t in lines[at + 2:at + 12] if t.startswith(strategy + " seed=")]
                assert sorted(inside) == [f"{strategy} seed={s}" for s in (1, 2, 3)], lines[at:at + 12]
            assert "Additional runs" in lines  # the sweep's parent, which has no group
            page.screenshot(path=str(shots / "table.png"))

            # the chart view draws a group as one line (its seeds aggregated), for loss and the log2 scale
            page.locator("label").filter(has=page.get_by_role("radio", checked=False)).first.click()
            for chart in ("loss", "loss_scale_log2"):
                page.get_by_text(chart, exact=True).first.scroll_into_view_if_needed()
                for group in ("loss_scale=dynamic", "loss_scale=fixed_drop"):  # a legend entry per group
                    expect(page.get_by_text(f"{group} ({chart})", exact=True)).to_be_visible(timeout=30_000)
                assert page.get_by_text(f"dynamic seed=1 ({chart})").count() == 0, "a seed drawn on its own"
            page.get_by_text("loss", exact=True).first.scroll_into_view_if_needed()
            page.screenshot(path=str(shots / "charts.png"))
        finally:
            browser.close()
    assert (shots / "table.png").stat().st_size > 0 and (shots / "charts.png").stat().st_size > 0
