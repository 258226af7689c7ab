"""SPEC "Where the input shows": each reasoning token's share of matched - marginal and the own
prompt's posterior, checked against plain transformers forward passes per (prompt, trace) and
a reference written here from the SPEC's formulas (never the project's own scorer); the sum
rule on the full matrix and with sampled negatives; the per-token operation of every backend;
policies trained so that the input shows early, late or nowhere; the routes that report it."""

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from collapsecheck import scan, score
from collapsecheck.cli import app
from collapsecheck.engines.backends.base import no_progress
from collapsecheck.engines.backends.function import FunctionBackend
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.scan_dump import read_dump_samples, read_jsonl
from collapsecheck.integrations.any_trainer import diagnose_batch
from collapsecheck.measures.metrics import matched_and_marginal, sampling_correction
from collapsecheck.measures.token_information import (
    POSITIONS,
    ReasoningTokenLogProbs,
    compute_where,
    row_summaries,
    token_information,
)
from collapsecheck.reports.compare import compare_reports
from collapsecheck.reports.report import Report
from collapsecheck.settings import LoadSettings
from tests.conftest import COLLAPSED, EXAMPLES, HEALTHY, PROMPTS
from tests.test_scoring import branching_requests, cut_reasoning_requests, reference
from tests.tolerances import LOGPROB_ATOL, sequence_atol

DEMOS = EXAMPLES / "checkpoints" / "where-input-shows"
SCAN = dict(num_prompts=16, k=8, max_new_tokens=96, device="cpu", bootstrap=300)
runner = CliRunner()


# -- a reference from the SPEC's formulas, in plain Python --------------------------------


def spec_reference(logprobs, weights, own_column, own_group, n):
    """information(t) and posterior(t) of one row, term by term as SPEC writes them:
    `logprobs[j][t - 1]` is l_j(t)."""
    columns, length = len(logprobs), len(logprobs[0])
    c = [[math.fsum(logprobs[j][: t + 1]) for t in range(length)] for j in range(columns)]

    def log_mixture(t):  # log sum_j w_j exp C_j(t); C_j(0) = 0
        terms = [math.log(weights[j]) + (c[j][t - 1] if t else 0.0) for j in range(columns)]
        top = max(terms)
        return top + math.log(math.fsum(math.exp(x - top) for x in terms))

    information, posterior = [], []
    for t in range(1, length + 1):
        step = (log_mixture(t) - math.log(n)) - (log_mixture(t - 1) - math.log(n) if t > 1 else 0)
        information.append(logprobs[own_column][t - 1] - step)
        own = math.fsum(weights[j] * math.exp(c[j][t - 1]) for j in own_group)
        everything = math.fsum(weights[j] * math.exp(c[j][t - 1]) for j in range(columns))
        posterior.append(own / everything)
    return np.array(information), np.array(posterior)


def random_rows(rng, rows, n, lengths, scored=None):
    logprobs = [rng.normal(-2.0, 1.5, size=(n if scored is None else scored, t)) for t in lengths]
    return logprobs


def test_each_token_and_posterior_follow_the_spec_on_the_full_matrix():
    rng = np.random.default_rng(0)
    n, lengths = 5, [7, 1, 12, 3, 9, 4]
    logprobs = random_rows(rng, len(lengths), n, lengths)
    row_prompt = np.array([0, 1, 2, 3, 4, 0])
    columns = [np.arange(n)] * len(lengths)
    tokens = token_information(ReasoningTokenLogProbs(logprobs, columns, row_prompt, n))
    sums = np.array([[row.sum(axis=1)[j] for j in range(n)] for row in logprobs])
    matched, marginal = matched_and_marginal(
        sums, row_prompt, np.arange(n), np.ones_like(sums, bool)
    )
    for r, row in enumerate(logprobs):
        information, posterior = tokens.of_row(r)
        expected = spec_reference(row.tolist(), [1.0] * n, row_prompt[r], [row_prompt[r]], n)
        np.testing.assert_allclose(information, expected[0], atol=1e-10)
        np.testing.assert_allclose(posterior, expected[1], atol=1e-12)
        assert information.sum() == pytest.approx(matched[r] - marginal[r], abs=1e-10)
    one_token = tokens.of_row(1)[0]  # a row of one token: all its information in one token
    assert len(one_token) == 1
    summaries = row_summaries(tokens, row_prompt, n)
    assert np.flatnonzero(summaries.by_position[1]).tolist() == [5]  # floor(10 * 0.5 / 1)


def test_with_sampled_negatives_the_tokens_sum_to_the_estimate_before_its_correction():
    """Columns: the own prompt (weight 1) and m sampled others standing for all P = N - 1
    (weight P / m each): the tokens sum to matched minus the marginal before the log's bias
    correction (SPEC "Sampled negatives and swaps")."""
    rng = np.random.default_rng(1)
    n, m, lengths = 9, 3, [6, 5, 8]
    row_prompt = np.array([2, 5, 7])
    columns = [np.sort(np.r_[p, rng.choice(np.setdiff1d(np.arange(n), p), m, replace=False)])
               for p in row_prompt]  # fmt: skip
    logprobs = random_rows(rng, len(lengths), n, lengths, scored=m + 1)
    tokens = token_information(ReasoningTokenLogProbs(logprobs, columns, row_prompt, n))
    sums = np.full((len(lengths), n), np.nan)
    for r, (row, cols) in enumerate(zip(logprobs, columns, strict=True)):
        sums[r, cols] = row.sum(axis=1)
    scored = np.isfinite(sums)
    matched, marginal = matched_and_marginal(sums, row_prompt, np.arange(n), scored)
    own = np.arange(n)[None, :] == row_prompt[:, None]
    shift = np.nanmax(sums, axis=1)
    terms = np.where(scored, np.exp(np.nan_to_num(sums) - shift[:, None]), 0.0)
    weight = np.where(own, 1.0, (n - 1) / m)
    total = (np.where(scored, terms, 0) * weight).sum(axis=1)
    correction = sampling_correction(terms, scored & ~own, np.full(len(lengths), n - 1), total)
    for r, row in enumerate(logprobs):
        information, posterior = tokens.of_row(r)
        own_column = int(np.flatnonzero(columns[r] == row_prompt[r])[0])
        weights = np.where(columns[r] == row_prompt[r], 1.0, (n - 1) / m).tolist()
        expected = spec_reference(row.tolist(), weights, own_column, [own_column], n)
        np.testing.assert_allclose(information, expected[0], atol=1e-10)
        np.testing.assert_allclose(posterior, expected[1], atol=1e-12)
        uncorrected = marginal[r] - correction[r]
        assert information.sum() == pytest.approx(matched[r] - uncorrected, abs=1e-10)


def test_identical_prompts_count_as_the_own_prompt_in_the_posterior():
    """Columns 1 and 3 are one context (a group): a row of prompt 1 reads column 3 as its
    own in the posterior, as retrieval credits it; its information is still l_1 against
    the mixture of all columns."""
    rng = np.random.default_rng(2)
    n, row = 4, rng.normal(-1.0, 1.0, size=(4, 6))
    tokens = token_information(ReasoningTokenLogProbs(
        [row], [np.arange(n)], np.array([1]), n, column_group=np.array([0, 1, 2, 1]),
    ))  # fmt: skip
    information, posterior = tokens.of_row(0)
    expected = spec_reference(row.tolist(), [1.0] * n, 1, [1, 3], n)
    np.testing.assert_allclose(information, expected[0], atol=1e-10)
    np.testing.assert_allclose(posterior, expected[1], atol=1e-12)
    alone = token_information(ReasoningTokenLogProbs([row], [np.arange(n)], np.array([1]), n))
    assert (posterior > alone.of_row(0)[1]).all()


def test_the_profile_names_where_the_information_sits_with_intervals():
    """Hand-made rows whose information sits in their last tenth read `late`; their
    posteriors pass one half there."""
    rng = np.random.default_rng(3)
    n, length = 6, 20
    logprobs, row_prompt = [], []
    for r in range(4 * n):
        own = r % n
        row = np.full((n, length), -1.0) + rng.normal(0, 0.01, size=(n, length))
        row[:, -2:] = -6.0
        row[own, -2:] = -0.01  # the last two tokens name the own prompt
        logprobs.append(row)
        row_prompt.append(own)
    row_prompt = np.array(row_prompt)
    tokens = token_information(ReasoningTokenLogProbs(logprobs, [np.arange(n)] * len(logprobs),
                                                      row_prompt, n))  # fmt: skip
    section, metrics = compute_where(row_summaries(tokens, row_prompt, n), resamples=200)
    assert section.regime == "late", section.reason
    values = [p.value for p in section.by_position]
    assert values[-1] > 0.9 * sum(values)
    assert metrics["input_named_rate"].value == 1.0
    assert metrics["input_named_at"].value == pytest.approx(19 / 20)
    assert "within 90-100% of the reasoning" in section.reason


# -- the backends' per-token operation ------------------------------------------------------


@pytest.mark.parametrize("scorer", ["cached", "naive"])
@pytest.mark.parametrize("requests", [branching_requests, cut_reasoning_requests])
def test_the_transformers_scorers_per_token_values_match_a_plain_forward_pass(
    random_checkpoint, scorer, requests
):
    backend = TransformersBackend.from_checkpoint(
        random_checkpoint, LoadSettings(device="cpu", batch_tokens=64), scorer
    )
    asked = requests()
    summed = backend.loglikelihood(asked, no_progress, temperature=0.7)
    per_token = backend.loglikelihood_per_token(asked, no_progress, temperature=0.7)
    np.testing.assert_array_equal(per_token.sums, summed)  # the sums stay what they were
    for index, request in enumerate(asked):
        values = per_token.of_request(index)
        assert len(values) == len(request.continuation) - request.scored_from
        assert values.sum() == pytest.approx(summed[index], abs=1e-9)
        one_by_one = token_reference(backend.model, request, 0.7)
        np.testing.assert_allclose(values, one_by_one, atol=LOGPROB_ATOL)
    whole = reference(backend.model, asked[-1], 0.7)  # one forward pass, not one per token
    assert sum(one_by_one) == pytest.approx(whole, abs=sequence_atol(len(one_by_one)))


def token_reference(model, request, temperature=1.0):
    ids = torch.tensor([request.context + request.continuation])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].double() / temperature, -1)
    start = len(request.context) + request.scored_from
    return [logprobs[t - 1, ids[0, t]].item() for t in range(start, ids.shape[1])]


def test_a_callers_function_gives_sums_or_per_token_values(demo_tokenizer):
    requests = branching_requests()[:6]
    tokens = [np.linspace(-1, -0.1, len(r.continuation) - r.scored_from) for r in requests]
    width = max(len(t) for t in tokens) + 3

    def padded(contexts, continuations):  # veRL's (pairs, response length) log-probs
        out = np.zeros((len(continuations), width))
        for i, c in enumerate(continuations):
            out[i, : len(c)] = np.linspace(-1, -0.1, len(c))
        return out

    def ragged(contexts, continuations):
        return [np.linspace(-1, -0.1, len(c)).tolist() for c in continuations]

    def sums(contexts, continuations):
        return [float(np.linspace(-1, -0.1, len(c)).sum()) for c in continuations]

    for function in (padded, ragged):
        got = FunctionBackend(function, demo_tokenizer).loglikelihood_per_token(
            requests, no_progress
        )
        for index, expected in enumerate(tokens):
            np.testing.assert_allclose(got.of_request(index), expected)
        np.testing.assert_allclose(got.sums, [t.sum() for t in tokens])
    summed = FunctionBackend(sums, demo_tokenizer).loglikelihood_per_token(requests, no_progress)
    assert not summed.per_token
    np.testing.assert_allclose(summed.sums, [t.sum() for t in tokens])
    with pytest.raises(CollapsecheckError, match="per-token values for pair 1"):
        FunctionBackend(lambda c, x: [[0.0]] * len(x), demo_tokenizer).loglikelihood_per_token(
            requests, no_progress
        )
    with pytest.raises(CollapsecheckError, match=r"\(pairs, width >= "):
        FunctionBackend(lambda c, x: np.zeros((len(x), 1)), demo_tokenizer).loglikelihood(
            requests, no_progress
        )


# -- a real scan against plain forward passes ----------------------------------------------


@pytest.fixture(scope="module")
def grounded_dump(tmp_path_factory):
    dump = tmp_path_factory.mktemp("grounded")
    report = scan(HEALTHY, PROMPTS, dump=dump, negatives="all", **{**SCAN, "k": 4})
    return dump, report


def test_a_scans_tokens_match_plain_forward_passes_of_every_prompt(grounded_dump):
    """Every 7th scored row: its reasoning under every prompt by one plain forward pass per
    (prompt, trace), then information and posterior by the SPEC's formulas, against the
    dump's token_information.npz; and the ten tenths sum to mi_seq_estimate."""
    dump, report = grounded_dump
    model = AutoModelForCausalLM.from_pretrained(HEALTHY, dtype=torch.float32).eval()
    prompts, traces = read_jsonl(dump / "prompts.jsonl"), read_jsonl(dump / "traces.jsonl")
    with np.load(dump / "cross_logprobs.npz") as npz:
        row_trace, row_prompt = npz["row_trace_index"], npz["row_prompt_index"]
    with np.load(dump / "token_information.npz") as npz:
        information, posterior, offsets = npz["information"], npz["own_posterior"], npz["offsets"]
        text = npz["token_text"]
    n = len(prompts)
    assert len(offsets) == len(row_trace) + 1 and len(text) == len(information)
    for r in range(0, len(row_trace), 7):
        trace = traces[int(row_trace[r])]
        pre, z = trace["prefix_ids"], trace["reasoning_ids"]
        assert "".join(text[offsets[r] : offsets[r + 1]]) == trace["reasoning"]
        under = []
        for prompt in prompts:
            ids = torch.tensor([prompt["ids"] + pre + z])
            with torch.no_grad():
                logprobs = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
            start = len(prompt["ids"]) + len(pre)
            under.append([logprobs[t - 1, ids[0, t]].item() for t in range(start, ids.shape[1])])
        own = int(row_prompt[r])
        expected = spec_reference(under, [1.0] * n, own, [own], n)
        span = slice(offsets[r], offsets[r + 1])
        np.testing.assert_allclose(information[span], expected[0], atol=1e-4)
        np.testing.assert_allclose(posterior[span], expected[1], atol=1e-4)
    tenths = [p.value for p in report.token_information.by_position]
    assert len(tenths) == POSITIONS
    assert sum(tenths) == pytest.approx(report.value("mi_seq_estimate"), abs=1e-9)
    saved = json.loads((dump / "report.json").read_text())["token_information"]
    assert len(saved["information_by_position"]) == POSITIONS


def test_a_prompt_file_with_copies_gives_the_tokens_of_the_file_written_once(tmp_path):
    rows = PROMPTS.read_text().splitlines()[:8]
    once, twice = tmp_path / "once.jsonl", tmp_path / "twice.jsonl"
    once.write_text("\n".join(rows) + "\n")
    twice.write_text("\n".join(rows + rows[2:5]) + "\n")
    a = scan(HEALTHY, once, dump=tmp_path / "a", **{**SCAN, "num_prompts": None, "k": 4})
    b = scan(HEALTHY, twice, dump=tmp_path / "b", **{**SCAN, "num_prompts": None, "k": 4})
    assert b.counts["prompts"] == 8
    with (
        np.load(tmp_path / "a" / "token_information.npz") as x,
        np.load(tmp_path / "b" / "token_information.npz") as y,
    ):
        np.testing.assert_array_equal(x["own_posterior"], y["own_posterior"])
        np.testing.assert_array_equal(x["information"], y["information"])
    assert a.token_information == b.token_information


# -- policies trained so that the input shows early, late, nowhere -------------------------


@pytest.fixture(scope="module")
def demos():
    return {name: scan(DEMOS / name, PROMPTS, **SCAN) for name in ("early", "late", "nowhere")}


def test_the_trained_policies_read_where_their_input_shows(demos):
    early, late, nowhere = (demos[name] for name in ("early", "late", "nowhere"))
    first_third = lambda r: sum(p.value for p in r.token_information.by_position[:3])  # noqa: E731
    last_third = lambda r: sum(p.value for p in r.token_information.by_position[-4:])  # noqa: E731
    assert early.token_information.regime == "early", early.token_information.reason
    assert first_third(early) > 0.9 * early.value("mi_seq_estimate")
    assert early.value("input_named_at") < 0.35
    assert late.token_information.regime == "late", late.token_information.reason
    assert last_third(late) > 0.9 * late.value("mi_seq_estimate")
    assert late.value("input_named_at") > 0.65
    assert min(early.value("input_named_rate"), late.value("input_named_rate")) > 0.9
    assert nowhere.verdict.is_collapse
    assert nowhere.token_information.regime == "nowhere", nowhere.token_information.reason
    assert nowhere.value("input_named_rate") < 0.1
    assert late.token_information.short(late.metrics).startswith("late (")
    assert nowhere.token_information.short(nowhere.metrics) == "nowhere"


def test_compare_says_where_a_and_b_differ(demos, tmp_path):
    for name in ("early", "late"):
        scan(DEMOS / name, PROMPTS, dump=tmp_path / name, **SCAN)
    a, b = (
        Report.load(tmp_path / "early" / "report.json"),
        Report.load(tmp_path / "late" / "report.json"),
    )
    comparison = compare_reports(a, b, resamples=300)
    assert comparison.paired
    assert "where the input shows moved beyond noise (A early, B late)" in comparison.reason
    assert comparison.deltas["information_by_position/0"].high < 0
    assert comparison.deltas["input_named_at"].low > 0.3
    # --no-gate: at this N and K, B's MI may differ from A's beyond noise (the gate's business)
    result = runner.invoke(app, ["compare", str(tmp_path / "early"), str(tmp_path / "late"),
                                 "--no-gate", "--json", str(tmp_path / "c.json")])  # fmt: skip
    assert result.exit_code == 0, result.output
    deltas = json.loads((tmp_path / "c.json").read_text())["metrics"]
    assert deltas["input_named_at"]["a"]["value"] < deltas["input_named_at"]["b"]["value"]


# -- the routes -----------------------------------------------------------------------------


def test_the_console_markdown_and_scalars_say_where_the_input_shows(tmp_path):
    summary = tmp_path / "summary.md"
    result = runner.invoke(app, ["scan", str(DEMOS / "late"), "-p", str(PROMPTS), "-n", "16",
                                 "-k", "8", "--max-new-tokens", "96", "--fail-on", "none",
                                 "--markdown", str(summary),
                                 "--json", str(tmp_path / "r.json")])  # fmt: skip
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("where the input shows:"))
    assert "late" in line and "of traces name their prompt" in line
    assert "**Where the input shows: `late`**" in summary.read_text()
    report = Report.load(tmp_path / "r.json")
    scalars = report.scalars()
    assert {f"collapse/information_by_position/{d}" for d in range(10)} <= set(scalars)
    assert scalars["collapse/input_named_rate"] == report.value("input_named_rate")


def test_no_token_information_skips_it_and_the_cache_keys_on_it(tmp_path):
    skipped = scan(HEALTHY, PROMPTS, no_token_information=True, **{**SCAN, "k": 2})
    assert skipped.token_information.regime == "not_measured"
    assert skipped.token_information.reason == "--no-token-information"
    assert math.isnan(skipped.value("input_named_rate"))
    measured = scan(HEALTHY, PROMPTS, **{**SCAN, "k": 2})
    assert measured.value("mi_seq_estimate") == skipped.value("mi_seq_estimate")
    assert measured.token_information.regime != "not_measured"


def test_diagnose_batch_reads_per_token_values_from_the_trainers_function(tmp_path):
    """veRL's actor gives per-token log-probs (pairs, response length): the section is
    measured and equals `score`'s; a function of sums leaves it not measured, saying why."""
    scan(HEALTHY, PROMPTS, dump=tmp_path, **{**SCAN, "k": 4, "num_prompts": 6})
    sampled = read_dump_samples(tmp_path)
    prompt_ids = [list(r.ids) for r in sampled.rendered]
    response_ids = [[list(s.ids) for s in group] for group in sampled.samples]
    tokenizer = AutoTokenizer.from_pretrained(HEALTHY)
    model = AutoModelForCausalLM.from_pretrained(HEALTHY, dtype=torch.float32).eval()

    def per_token(contexts, continuations):
        width = max(len(c) for c in continuations)
        out = torch.zeros(len(contexts), width)
        with torch.no_grad():
            for i, (context, continuation) in enumerate(zip(contexts, continuations, strict=True)):
                logits = model(torch.tensor([context + continuation])).logits[
                    0, len(context) - 1 : -1
                ]
                picked = torch.log_softmax(logits.float(), -1).gather(
                    1, torch.tensor(continuation)[:, None]
                )
                out[i, : len(continuation)] = picked[:, 0]
        return out.numpy()

    settings = {"device": "cpu", "bootstrap": 300}
    report = diagnose_batch(prompt_ids, response_ids, per_token, tokenizer, **settings)
    reference = score(HEALTHY, tmp_path, **settings)
    assert report.token_information.regime == reference.token_information.regime != "not_measured"
    for mine, theirs in zip(report.token_information.by_position,
                            reference.token_information.by_position, strict=True):  # fmt: skip
        assert mine.value == pytest.approx(theirs.value, abs=1e-3)
    sums = diagnose_batch(
        prompt_ids, response_ids, lambda c, x: per_token(c, x).sum(axis=1), tokenizer, **settings
    )
    assert sums.token_information.regime == "not_measured"
    assert "one sum per pair" in sums.token_information.reason


def test_the_run_frame_and_watch_lines_carry_it(tmp_path):
    from collapsecheck import scan_run

    run = scan_run(EXAMPLES / "demo-run", PROMPTS, **{**SCAN, "k": 4}, training_log=False,
                   cache_root=tmp_path)  # fmt: skip
    frame = run.to_frame()
    assert {"where_input_shows", "input_named_rate", "information_by_position/9"} <= set(frame)
    first, last = frame.iloc[0], frame.iloc[-1]
    assert first["input_named_rate"] > 0.9 > 0.2 > last["input_named_rate"]
    assert last["where_input_shows"] == "nowhere"


def test_a_collapsed_policys_tokens_carry_next_to_nothing():
    report = scan(COLLAPSED, PROMPTS, **SCAN)
    assert report.token_information.regime == "nowhere"
    assert abs(sum(p.value for p in report.token_information.by_position)) < 0.2
