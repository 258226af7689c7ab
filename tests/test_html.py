"""--html: the page's parts (shared spans, centred matrices, summarised heatmaps) on hand-made
inputs, and the pages of scan, score, compare and a run through the command line: present,
self-contained, and linked from the Markdown summary. tests/browser opens them in Chromium."""

import re
from html.parser import HTMLParser

import numpy as np
import pytest
from scipy.special import logsumexp
from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.reports.figures import MAX_ROWS, binned, centered, heatmap
from collapsecheck.reports.gate import page_link
from collapsecheck.reports.template_spans import PHRASE, PLAIN, WORD, shared_spans
from tests.conftest import COLLAPSED, EXAMPLES, HEALTHY, PROMPTS, RUN

FAST = ["-p", str(PROMPTS), "-n", "8", "-k", "4", "--max-new-tokens", "64", "--device", "cpu",
        "--bootstrap", "200", "--fail-on", "none"]  # fmt: skip
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


class Page(HTMLParser):
    """What a page holds: its tags with their attributes, and its text."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag, **attrs):
        return [
            a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())
        ]


def read_page(path) -> tuple[str, Page]:
    text = path.read_text(encoding="utf-8")
    return text, Page(text)


def assert_self_contained(text: str, page: Page) -> None:
    """Nothing the page loads comes from elsewhere, and its policy forbids fetching."""
    for tag, attrs in page.tags:
        for name in ("src", "href"):
            value = attrs.get(name)
            if value is not None:
                assert value.startswith(("data:", "#")), f"<{tag} {name}={value[:60]}>"
    assert page.all("link") == []
    policy = page.all("meta", **{"http-equiv": "Content-Security-Policy"})
    assert policy and "default-src 'none'" in policy[0]["content"]
    assert "<script src" not in text


# -- the parts -------------------------------------------------------------------------


def joined(segments):
    return "".join(s.text for s in segments)


def test_shared_spans_mark_a_phrase_two_prompts_share_and_words_all_use():
    groups = [
        ["let me think step by step: up", "go up now"],
        ["so let me think step by step, left"],
        ["left is the goal"],
    ]
    marked = shared_spans(groups)
    for texts, traces in zip(groups, marked, strict=True):
        assert [joined(t) for t in traces] == texts  # the text is kept exactly, spaces too
    first = marked[0][0]
    assert [s.text for s in first if s.shared == PHRASE] == ["let me think step by step:"]
    assert all(s.shared == PLAIN for s in marked[0][1])  # nothing of it elsewhere
    # "left" is used by prompts 1 and 2 but not 0: no word is common to all three
    assert not any(s.shared == WORD for trace in marked for t in trace for s in t)
    assert all(s.shared == PLAIN for s in marked[2][0])


def test_shared_spans_mark_a_word_every_prompt_uses_and_leave_what_differs():
    marked = shared_spans([["goal 3,4 so right"], ["goal 0,1 so up"]])
    kinds = [[(s.text.strip(), s.shared) for s in t] for g in marked for t in g]
    assert kinds[0] == [("goal", WORD), ("3,4", PLAIN), ("so", WORD), ("right", PLAIN)]
    assert kinds[1] == [("goal", WORD), ("0,1", PLAIN), ("so", WORD), ("up", PLAIN)]


def test_centered_rows_have_a_mixture_of_zero_over_their_scored_cells():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(6, 4))
    scored = np.ones((6, 4), bool)
    scored[0, 3] = False
    cells = centered(values, scored)
    assert np.isnan(cells[0, 3])
    for row, mask in zip(cells, scored, strict=True):
        assert logsumexp(row[mask]) - np.log(mask.sum()) == pytest.approx(0.0, abs=1e-12)
    # a row shifted by a constant (a likelier trace under every prompt) draws the same
    assert np.allclose(centered(values + 5.0, scored)[1:], cells[1:])


def test_heatmap_groups_rows_by_prompt_and_averages_them_past_the_row_limit():
    row_prompt = np.array([1, 0, 1, 0])
    cells = np.arange(8.0).reshape(4, 2)
    drawn = heatmap(cells, row_prompt, np.array([1.0, 2.0, 3.0, 4.0]))
    assert drawn.row_prompt.tolist() == [0, 0, 1, 1]
    assert drawn.gain.tolist() == [2.0, 4.0, 1.0, 3.0] and drawn.note == ""
    many = np.repeat(np.arange(3), (MAX_ROWS // 3) + 1)
    values = np.where(many[:, None] == np.arange(3)[None, :], 1.0, -1.0)
    big = heatmap(values, many, np.ones(len(many)))
    assert big.cells.shape == (3, 3) and "averaged" in big.note
    assert np.array_equal(big.cells, np.where(np.eye(3, dtype=bool), 1.0, -1.0))


def test_binned_averages_blocks_of_a_large_matrix():
    cells = np.kron(np.eye(4), np.ones((25, 25)))  # 100 x 100, four diagonal blocks
    small = binned(cells, 4)
    assert small.shape == (4, 4) and np.array_equal(small, np.eye(4))
    assert binned(np.eye(3), 32).shape == (3, 3)


def test_page_link_names_the_file_and_in_github_actions_the_runs_artifacts(tmp_path):
    assert page_link(None, {}) is None
    assert page_link(tmp_path / "report.html", {}) == "**HTML report:** [report.html](report.html)"
    github = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "org/rl",
              "GITHUB_RUN_ID": "42"}  # fmt: skip
    line = page_link(tmp_path / "report.html", github)
    assert line.endswith("(https://github.com/org/rl/actions/runs/42#artifacts)")


# -- the pages, through the command line -----------------------------------------------


def prompt_rows(page: Page) -> list[dict]:
    return page.all("tr")[1:]


def test_scan_page_without_a_dump_draws_the_matrix_table_and_traces(tmp_path):
    out = tmp_path / "scan.html"
    summary = tmp_path / "summary.md"
    result = invoke("scan", COLLAPSED, *FAST, "--html", out, "--markdown", summary)
    assert result.exit_code == 0, result.output
    text, page = read_page(out)
    assert_self_contained(text, page)
    heatmaps = page.all("img", **{"class": "heatmap"})
    assert heatmaps and all(img["src"].startswith("data:image/png;base64,") for img in heatmaps)
    assert "template collapse" in "".join(page.text)
    assert len(page.all("details", **{"class": "prompt"})) == 8  # one per prompt
    links = [a["href"] for a in page.all("a")]
    assert links == [f"#prompt-{j}" for j in range(8)]
    assert {f"prompt-{j}" for j in range(8)} <= {a.get("id") for _, a in page.tags}
    assert page.all("mark", **{"class": "word"}) or page.all("mark", **{"class": "phrase"})
    assert "**HTML report:** [scan.html](scan.html)" in summary.read_text()


def test_page_draws_the_flow_matrices_only_where_the_flow_was_measured(tmp_path):
    flow, no_flow = tmp_path / "flow.html", tmp_path / "no-flow.html"
    assert invoke("scan", HEALTHY, *FAST, "--html", flow).exit_code == 0
    assert invoke("scan", HEALTHY, *FAST, "--no-flow", "--html", no_flow).exit_code == 0
    assert "Information flow: the action's matrices" in flow.read_text()
    assert "action's matrices" not in no_flow.read_text()
    assert len(read_page(flow)[1].all("img", **{"class": "heatmap"})) == 3
    assert len(read_page(no_flow)[1].all("img", **{"class": "heatmap"})) == 1
    # early answering's curve, where it was measured (SPEC "Early answering")
    assert len(read_page(flow)[1].all("img", **{"class": "curve"})) == 1
    assert "<h2>Early answering</h2>" in flow.read_text()
    assert read_page(no_flow)[1].all("img", **{"class": "curve"}) == []


def test_score_page_from_rollouts(tmp_path):
    out = tmp_path / "score.html"
    rollouts = EXAMPLES / "rollouts" / "gridworld.jsonl"
    result = invoke("score", rollouts, "--checkpoint", HEALTHY, "--device", "cpu",
                    "--bootstrap", "200", "--fail-on", "none", "--html", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    text, page = read_page(out)
    assert_self_contained(text, page)
    assert page.all("img", **{"class": "heatmap"}) and prompt_rows(page)


def test_compare_page_holds_both_and_the_paired_difference(tmp_path):
    for name, checkpoint in (("a", HEALTHY), ("b", COLLAPSED)):
        assert invoke("scan", checkpoint, *FAST, "--dump", tmp_path / name).exit_code == 0
    out = tmp_path / "compare.html"
    result = invoke("compare", tmp_path / "a", tmp_path / "b", "--html", out)
    assert result.exit_code == 1  # B lost input dependence
    text, page = read_page(out)
    assert_self_contained(text, page)
    words = "".join(page.text)
    assert "paired bootstrap over prompts" in words and "B - A" in words
    assert len(page.all("img", **{"class": "heatmap"})) >= 2
    ids = {a.get("id") for _, a in page.tags}
    assert {"a-prompt-0", "b-prompt-0"} <= ids  # the two reports' links stay apart


def test_compare_page_of_reports_without_their_dumps_says_there_is_no_matrix(tmp_path):
    for name, checkpoint in (("a", HEALTHY), ("b", COLLAPSED)):
        json_path = tmp_path / f"{name}.json"
        assert invoke("scan", checkpoint, *FAST, "--json", json_path).exit_code == 0
    out = tmp_path / "compare.html"
    invoke("compare", tmp_path / "a.json", tmp_path / "b.json", "--html", out)
    text, page = read_page(out)
    assert page.all("img", **{"class": "heatmap"}) == []
    assert text.count("no cross-scoring matrix to draw") == 2


def test_run_page_has_the_plot_the_run_table_and_a_heatmap_per_step(tmp_path):
    out = tmp_path / "run.html"
    result = invoke(
        "scan", RUN, *FAST, "--out", tmp_path / "cache", "--html", out, "--markdown",
        tmp_path / "run.md",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text, page = read_page(out)
    assert_self_contained(text, page)
    assert text.count("<svg") >= 1  # the run plot, inline
    steps = [a for t, a in page.tags if t == "figure" and "class" in a and "onset" in a["class"]]
    assert len(steps) == 1  # the onset outlined
    strip = re.search(r'<div class="steps">(.*?)</div>\s*<h2>', text, re.S).group(1)
    assert strip.count("<img") == 5  # one small heatmap per checkpoint
    # early answering along the run: one picture, a curve per step
    assert "<h2>Early answering along the run</h2>" in text
    assert len(page.all("img", **{"class": "curve"})) == 2  # the run's and the latest step's
    # where the input shows: the run's steps by tenths, and the latest step's tenths
    assert len(page.all("img", **{"class": "profile"})) == 2
    # the onset's step and kind (KINDS in measures/onset.py) in the console's words
    assert re.search(r"onset: step \d+ \((collapsed|decline begins)\)", "".join(page.text))
    assert "[run.html](run.html)" in (tmp_path / "run.md").read_text()


def test_a_shard_leaves_the_page_to_the_join(tmp_path):
    result = invoke("scan", RUN, *FAST, "--out", tmp_path, "--shard", "0/2", "--html",
                    tmp_path / "run.html")  # fmt: skip
    assert result.exit_code == 2
    assert "--html" in result.output and "without --shard" in result.output
