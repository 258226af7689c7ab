"""The HTML pages in a real browser: Debian's Chromium, driven headless by Playwright, with
every request that is not the page itself refused. The demo scan's page and the demo run's
page open without a console error, their pictures load, the per-prompt table sorts, a
prompt's number opens its traces; a screenshot of each is taken (into
$COLLAPSECHECK_SCREENSHOTS when set, which `make screenshots` uses for the README).

`make test-browser` installs Chromium (Debian's package) and Playwright; without Chromium
these tests fail rather than skip."""

import os
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright
from typer.testing import CliRunner

from collapsecheck.cli import app
from tests.conftest import COLLAPSED, EXAMPLES, HEALTHY, PROMPTS, ROOT

REWARD = EXAMPLES / "rewards" / "gridworld.py"
SCAN_ARGS = ["-p", str(PROMPTS), "-n", "16", "-k", "8", "--max-new-tokens", "64", "--device",
             "cpu", "--fail-on", "none", "--reward-fn", str(REWARD)]  # fmt: skip
# a vision-language policy that reads the text and ignores the board (docs/vision.md)
READS_TEXT = EXAMPLES / "checkpoints" / "vision" / "reads-text"
VISION_ARGS = ["-p", str(EXAMPLES / "prompts" / "visual-gridworld-mixed.jsonl"),
               *SCAN_ARGS[2:]]  # fmt: skip
# a policy whose reasoning names its state only at its end (SPEC "Where the input shows")
LATE = EXAMPLES / "checkpoints" / "where-input-shows" / "late"
LATE_ARGS = [*SCAN_ARGS[:7], "96", *SCAN_ARGS[8:]]
GRPO_RUN = EXAMPLES / "grpo-run"
DEMO_RUN = EXAMPLES / "demo-run"
# the README's headline command (`make grpo-run-scans`'s, paths as typed in the repository),
# answered from a copy of the scans the repository ships: the test never writes there
GRPO_ARGS = ["-p", "examples/prompts/gridworld.jsonl", "-n", "16", "-k", "8",
             "--max-new-tokens", "64", "--baseline", "examples/demo-run/global_step_200",
             "--reward-fn", "examples/rewards/gridworld.py", "--fail-on", "none"]  # fmt: skip


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Chromium is not installed: `make test-browser` installs Debian's chromium")
    return found


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


def shipped_copy(out: Path) -> Path:
    """The GRPO run's shipped results, copied under `out`."""
    copy = out / "grpo-run-scans"
    shutil.copytree(EXAMPLES / "grpo-run-scans", copy)
    return copy


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The demo scan's page (the collapsed checkpoint), the GRPO run's and the demo run's."""
    out = tmp_path_factory.mktemp("pages")
    runner = CliRunner()
    here = Path.cwd()
    os.chdir(ROOT)  # paths as a user in the repository types them (the pages' titles)
    try:
        for args in (
            ["scan", COLLAPSED.relative_to(ROOT), *SCAN_ARGS, "--html", out / "scan.html"],
            ["scan", GRPO_RUN.relative_to(ROOT), *GRPO_ARGS, "--out", shipped_copy(out),
             "--html", out / "grpo-run.html"],
            ["scan", DEMO_RUN.relative_to(ROOT), *SCAN_ARGS, "--out", out / "cache",
             "--html", out / "demo-run.html"],
            ["scan", READS_TEXT.relative_to(ROOT), *VISION_ARGS, "--html", out / "vision.html"],
            ["scan", LATE.relative_to(ROOT), *LATE_ARGS, "--html", out / "late.html"],
        ):  # fmt: skip
            result = runner.invoke(app, [str(a) for a in args])
            assert result.exit_code in (0, 1), result.output  # 1: the run's gate fails
        copied = sorted(p.name for p in (out / "grpo-run-scans").iterdir())
        assert copied == sorted(p.name for p in (EXAMPLES / "grpo-run-scans").iterdir()), (
            "the GRPO run was scanned again: regenerate the shipped results (make grpo-run-scans)"
        )
        compared = runner.invoke(app, [str(a) for a in [
            "compare", HEALTHY.relative_to(ROOT), COLLAPSED.relative_to(ROOT), *SCAN_ARGS[:8],
            "--no-gate", "--html", out / "compare.html"]])  # fmt: skip
        assert compared.exit_code == 0, compared.output
    finally:
        os.chdir(here)
    names = ("scan", "grpo-run", "demo-run", "vision", "compare", "late")
    return {name: out / f"{name}.html" for name in names}


class Opened:
    """A page opened offline: what its console said, and what it tried to fetch."""

    def __init__(self, browser, path: Path):
        self.page = browser.new_page(viewport={"width": 1300, "height": 1000})
        self.errors: list[str] = []
        self.refused: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        self.page.route("**/*", self._route)
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready=true]", timeout=15_000)

    def _console(self, message) -> None:
        if message.type in ("error", "warning"):
            self.errors.append(f"console {message.type}: {message.text}")

    def _route(self, route) -> None:
        if route.request.url == self.url:
            route.continue_()
        else:
            self.refused.append(route.request.url)
            route.abort()

    def screenshot(self, name: str, tmp_path: Path, selector: str | None = None) -> Path:
        """The page's first screen, or only what `selector` picks."""
        folder = Path(os.environ.get("COLLAPSECHECK_SCREENSHOTS", tmp_path))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        if selector is None:
            self.page.screenshot(path=str(path), full_page=False)
        else:
            self.page.locator(selector).screenshot(path=str(path))
        return path


def images_loaded(page) -> list[int]:
    return page.evaluate("Array.from(document.images).map(image => image.naturalWidth)")


def column_values(page, column: int) -> list[float]:
    cells = page.eval_on_selector_all(
        f"table.prompts tbody tr td:nth-child({column})", "cells => cells.map(c => c.dataset.value)"
    )
    return [float(v) for v in cells if v not in ("", None)]


def test_scan_page_opens_offline_without_errors_and_works(browser, pages, tmp_path):
    opened = Opened(browser, pages["scan"])
    page = opened.page
    assert opened.errors == [] and opened.refused == []
    shot = opened.screenshot("html-report-scan.png", tmp_path)
    assert shot.stat().st_size > 10_000
    widths = images_loaded(page)
    assert widths and all(w > 0 for w in widths)  # every picture decoded
    assert page.locator("img.heatmap").count() == 3  # X->Z and the flow's two
    assert page.locator("img.curve").count() == 1  # early answering's curve
    assert page.locator("img.curve").evaluate("img => img.naturalWidth") > 0
    assert page.locator("h2", has_text="Where the input shows: nowhere").count() == 1
    assert page.locator("img.profile").evaluate("img => img.naturalWidth") > 0
    assert page.locator("table.prompts tbody tr").count() == 16
    assert page.locator(".side .column").count() == 3
    assert page.locator(".side mark").count() > 0  # the shared spans are marked
    header = page.locator("table.prompts th", has_text="own MI")
    column = page.locator("table.prompts th").all_inner_texts().index("own MI") + 1
    header.click()
    ascending = column_values(page, column)
    assert ascending == sorted(ascending) and header.get_attribute("aria-sort") == "ascending"
    header.click()
    assert column_values(page, column) == sorted(ascending, reverse=True)
    first = page.locator("table.prompts tbody tr a").first
    target = first.get_attribute("href")[1:]
    assert not page.locator(f"details#{target}").evaluate("d => d.open")
    first.click()
    assert page.locator(f"details#{target}").evaluate("d => d.open")
    assert page.locator(f"details#{target} .trace").count() > 1
    assert opened.errors == []


@pytest.mark.parametrize("name, steps", [("grpo-run", 11), ("demo-run", 5)])
def test_run_page_opens_offline_with_its_plot_and_a_heatmap_per_step(
    browser, pages, tmp_path, name, steps
):
    opened = Opened(browser, pages[name])
    page = opened.page
    assert opened.errors == [] and opened.refused == []
    assert all(w > 0 for w in images_loaded(page))
    assert page.locator(".plot svg").count() == 1
    box = page.locator(".plot svg").bounding_box()
    assert box["width"] > 600 and box["height"] > 200  # drawn at a readable size
    assert page.locator(".steps figure").count() == steps  # the GRPO run: its baseline too
    assert page.locator(".steps figure.onset").count() == 1
    assert page.locator(".steps img").first.bounding_box()["width"] >= 60
    assert page.locator("img.heatmap").count() >= 1  # the latest checkpoint's matrix
    assert "onset: step" in page.inner_text("body")
    # the GRPO run has its start (--baseline): each step read under it (SPEC "Scored under
    # the start"), the start's own row first
    start_rows = page.locator("table.start tr")
    assert start_rows.count() == (steps + 1 if name == "grpo-run" else 0)
    where = page.locator("h2", has_text="Where the input shows along the run")
    assert where.count() == 1  # one picture: where the information sits at each step
    assert where.locator("xpath=following-sibling::img[1]").evaluate("i => i.naturalWidth") > 0
    if name == "grpo-run":
        assert start_rows.nth(1).inner_text().split("\t")[:2] == ["0", "the start"]
        assert "start mode" in start_rows.last.inner_text()
        assert start_rows.last.is_visible()
    shot = opened.screenshot(f"html-report-{name}.png", tmp_path)
    assert shot.stat().st_size > 10_000


def test_vision_page_shows_each_collapsed_prompts_board_beside_its_traces(browser, pages, tmp_path):
    """The policy that reads the text: the boards its traces were scored under are on the
    page, decoded, beside the traces; the image's share and its reading are in the numbers."""
    opened = Opened(browser, pages["vision"])
    page = opened.page
    assert opened.errors == [] and opened.refused == []
    boards = page.locator(".side .column img.picture")
    assert boards.count() == page.locator(".side .column").count() == 3
    assert boards.evaluate_all("images => images.map(i => i.naturalWidth)") == [84, 84, 84]
    assert boards.first.get_attribute("alt").endswith(".png")
    text = " ".join(page.inner_text("body").split())
    assert "the reasoning reads the text and ignores the image" in text
    shot = opened.screenshot("html-report-vision.png", tmp_path, ".side")
    assert shot.stat().st_size > 5_000
    assert opened.errors == []


@pytest.mark.parametrize("width", [1300, 600])
def test_compare_page_shows_a_and_b_side_by_side_on_a_laptop_stacked_on_a_phone(
    browser, pages, width, tmp_path
):
    """Found by a new user: at a 1300-pixel window B's column was off-screen to the right
    (A and B in one row, as wide as their console tables). Both are readable at once on a
    laptop, and one above the other on a narrow screen; nothing runs past the window."""
    opened = Opened(browser, pages["compare"])
    opened.page.set_viewport_size({"width": width, "height": 900})
    a, b = (opened.page.locator(".pair > .column").nth(i).bounding_box() for i in range(2))
    assert a["x"] >= 0 and b["x"] + b["width"] <= width  # both within the window
    if width >= 1000:
        assert b["x"] >= a["x"] + a["width"] and abs(a["y"] - b["y"]) < 1  # side by side
    else:
        assert b["y"] >= a["y"] + a["height"] and abs(a["x"] - b["x"]) < 1  # stacked
    scrolls = opened.page.evaluate("document.documentElement.scrollWidth")
    assert scrolls <= width  # the page itself does not scroll sideways
    assert opened.errors == [] and opened.refused == []
    opened.screenshot(f"compare-{width}.png", tmp_path)


def test_each_token_is_shaded_by_its_information_with_its_numbers_on_hover(
    browser, pages, tmp_path
):
    """The late policy (its musing first, then the state it reads): its state's digits are
    shaded blue, its musing not; hovering a token shows its information and the own
    prompt's posterior after it; the shaded tokens spell the reasoning."""
    opened = Opened(browser, pages["late"])
    page = opened.page
    assert opened.errors == [] and opened.refused == []
    section = page.locator("h2", has_text="Where the input shows: late")
    assert section.count() == 1
    first = section.locator("xpath=following-sibling::div[contains(@class,'trace')][1]")
    tokens = first.locator("span")
    texts = tokens.all_inner_texts()
    assert "".join(texts).startswith(("let me", "ok let", "i think"))
    shaded = first.locator("span[class^=p]").all_inner_texts()
    assert shaded and all(t.strip() in "0123456789,updownleftright:" for t in shaded), shaded
    musing = len(texts) // 3  # the musing, well before the state
    assert tokens.nth(musing).get_attribute("class") is None
    blue = first.locator("span[class^=p]").first
    blue.hover()
    title = blue.get_attribute("title")
    assert title.endswith("%") and " nats, own " in title and float(title.split()[0]) > 0
    colour = blue.evaluate("t => getComputedStyle(t).backgroundColor")
    assert colour != "rgba(0, 0, 0, 0)"
    assert page.locator("details.prompt .trace span[class^=p]").count() > 16  # by prompt too
    opened.screenshot("html-report-tokens.png", tmp_path, "section.where")
    assert opened.errors == []


def test_an_agents_page_shows_input_dependence_by_turn_and_its_episodes(browser, tmp_path):
    """SPEC "Agents across turns": the undoing demo agent's page, its by-turn table and its
    episodes as strips, each undone step marked."""
    out = tmp_path / "agents.html"
    result = CliRunner().invoke(app, [str(a) for a in [
        "scan", EXAMPLES / "agents" / "undoer", "--env",
        f"{EXAMPLES / 'environments' / 'gridworld.py'}:make", "--context-window", "1",
        "--max-turns", "6", "-n", "4", "-k", "2", "--max-new-tokens", "48", "--device", "cpu",
        "--bootstrap", "100", "--fail-on", "none", "--html", out]])  # fmt: skip
    assert result.exit_code == 0, result.output
    opened = Opened(browser, out)
    page = opened.page
    assert opened.errors == [] and opened.refused == []
    section = page.locator("section.across-turns")
    assert section.locator("h2").inner_text() == "Agents across turns"
    assert "episodes: looping" in page.locator(".verdict").inner_text()
    assert section.locator("table.by-turn tr").count() >= 3  # a header and each turn
    assert section.locator("table.strips tr").count() == 4
    undone = section.locator("table.strips td.undo")
    assert undone.count() > 0 and undone.first.locator(".mark").inner_text() == "undone"
    assert undone.first.is_visible()
    shot = opened.screenshot("html-report-agents.png", tmp_path, "section.across-turns")
    assert shot.stat().st_size > 5_000
