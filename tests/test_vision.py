"""Vision-language policies: prompts with images read and checked before any model loads, the
cached scorer exact against a plain forward pass with Qwen2-VL's 3D positions, the demo
policies' verdicts, and the image's share on hand-made matrices."""

import json
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.engines.backends.base import SamplingParams, ScoreRequest
from collapsecheck.engines.backends.registry import load_backend
from collapsecheck.inputs.checkpoint import require_checkpoint
from collapsecheck.inputs.images import image_runs, swap_reason, with_images_of
from collapsecheck.inputs.prompts import load_prompts, render_prompts
from collapsecheck.measures.image_share import (
    READINGS,
    image_reading,
    image_share_metrics,
    paired_image_share_differences,
)
from collapsecheck.measures.metrics import CrossLogProbs, Estimate
from collapsecheck.progress import no_progress
from collapsecheck.settings import LoadSettings, PromptSettings
from tests.conftest import EXAMPLES, HEALTHY, ROOT
from tests.tolerances import LOGPROB_ATOL, sequence_atol

# a random-initialised tiny Qwen2-VL-shaped checkpoint (scripts/make_vlm_fixtures.py)
TINY = ROOT / "tests" / "fixtures" / "qwen2-vl-tiny"
# the same tiny shapes in each Qwen-VL generation (scripts/make_vlm_fixtures.py): Qwen2.5-VL's
# windowed vision tower, Qwen3-VL's deepstack features fed into the first layers, and its
# mixture-of-experts language model
FAMILIES = {
    "qwen2_vl": TINY,
    "qwen2_5_vl": ROOT / "tests" / "fixtures" / "qwen2.5-vl-tiny",
    "qwen3_vl": ROOT / "tests" / "fixtures" / "qwen3-vl-tiny",
    "qwen3_vl_moe": ROOT / "tests" / "fixtures" / "qwen3-vl-moe-tiny",
}
# the demo policies it trains from the same shapes: one reads the board, one ignores it
VISION = EXAMPLES / "checkpoints" / "vision"
PROMPTS = EXAMPLES / "prompts" / "visual-gridworld.jsonl"
FAST = ["-p", str(PROMPTS), "-n", "16", "-k", "8", "--max-new-tokens", "40", "--device", "cpu",
        "--bootstrap", "300", "--fail-on", "none"]  # fmt: skip
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def backend():
    settings = LoadSettings(device="cpu")
    return load_backend(require_checkpoint(TINY, None), settings)  # the route a scan takes


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    """Each generation's tiny checkpoint, loaded as a scan loads it, with four prompts."""
    checkpoint = require_checkpoint(FAMILIES[request.param], None)
    backend = load_backend(checkpoint, LoadSettings(device="cpu"))
    prompts = load_prompts(PROMPTS, num_prompts=4)
    return backend, render_prompts(prompts, backend.tokenizer, PromptSettings(), backend.vision)


@pytest.fixture(scope="module")
def rendered(backend):
    prompts = load_prompts(PROMPTS, num_prompts=4)
    return render_prompts(prompts, backend.tokenizer, PromptSettings(), backend.vision)


# -- prompts with images -------------------------------------------------------------


def prompt_file(tmp_path, image):
    row = {"messages": [{"role": "user", "content": [
        {"type": "image", "image": image}, {"type": "text", "text": "your move?"}]}]}  # fmt: skip
    path = tmp_path / "prompts.jsonl"
    shutil.copy(PROMPTS.parent / "boards" / "00.png", tmp_path / "board.png")
    path.write_text(json.dumps({**row}) + "\n" + json.dumps(row).replace(image, "board.png") + "\n")
    return path


@pytest.mark.parametrize(
    "image, said",
    [
        ("missing.png", "missing.png: No such file or directory"),
        ("https://example.com/board.png", "reads images from files only"),
        ("prompts.jsonl", "not an image PIL can read"),
    ],
)
def test_a_bad_image_is_one_line_naming_the_row_before_any_model_loads(tmp_path, image, said):
    path = prompt_file(tmp_path, image)
    result = invoke("scan", TINY, "-p", path, "-k", "2", "--max-new-tokens", "8")
    assert result.exit_code == 2
    assert f"{path}:1" in result.output and said in result.output
    assert "Traceback" not in result.output and "sampling" not in result.output


def test_a_vision_language_family_the_backend_does_not_know_is_one_line(tmp_path):
    """A LLaVA-style checkpoint (a vision tower, no Qwen-VL positions) is refused before any
    weight loads, never scored with the wrong positions."""
    checkpoint = tmp_path / "llava"
    shutil.copytree(TINY, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(config | {"model_type": "llava"}))
    result = invoke("scan", checkpoint, *FAST)
    assert result.exit_code == 2, result.output
    assert f"{checkpoint}: a llava vision-language checkpoint" in " ".join(result.output.split())


def test_a_text_only_checkpoint_refuses_prompts_with_images():
    result = invoke("scan", HEALTHY, *FAST)
    assert result.exit_code == 2
    assert "the prompt holds images but the checkpoint is a text-only model" in result.output


def test_a_text_only_chat_template_beside_a_vision_checkpoint_is_one_line_naming_it(tmp_path):
    """Issue 41: a template that concatenates each message's content as a string fails on
    image parts; that is the template's and the row's fault (exit 2), not an internal error."""
    checkpoint = tmp_path / "text-template"
    shutil.copytree(TINY, checkpoint)
    (checkpoint / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
        "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    result = invoke("scan", checkpoint, *FAST)
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"{PROMPTS}:1: {checkpoint / 'chat_template.jinja'} cannot render this row" in said
    assert "can only concatenate str" in said and "does the template render them?" in said
    assert "internal error" not in said and "Traceback" not in said


def test_image_tokens_hold_the_images_slot_and_swap_in_place(rendered, backend):
    runs = [image_runs(r.ids) for r in rendered]
    per_image = backend.vision.placeholders(backend.vision.slots.images[-1])
    assert per_image == 9  # an 84 x 84 board: 6 x 6 patches merged 2 x 2
    assert [[(length, slot) for _, length, slot in r] for r in runs] == [
        [(9, -1)],
        [(9, -2)],
        [(9, -3)],
        [(9, -4)],
    ]
    swapped = with_images_of(rendered[0].ids, rendered[2].ids)
    assert [t for t in swapped if t >= 0] == [t for t in rendered[0].ids if t >= 0]
    assert image_runs(swapped) == [(runs[0][0][0], 9, -3)]
    # the demo prompts share their text: X->Z measures the image alone
    assert "same text" in swap_reason([r.ids for r in rendered])


# -- the backend: exact with Qwen2-VL's 3D positions ---------------------------------


def requests_for(rendered, vocab: int):
    """Every continuation under every prompt: plain ones, and stems with branches (actions
    after a reasoning) that the cached scorer lays out with its 4D mask."""
    rng = np.random.default_rng(0)
    stems = [tuple(int(t) for t in rng.integers(6, vocab, size=n)) for n in (5, 9, 14)]
    out = []
    for prompt in rendered:
        for stem in stems:
            out.append(ScoreRequest(prompt.ids, stem, 1))
            for branch in (3, 6):
                tail = tuple(int(t) for t in rng.integers(6, vocab, size=branch))
                out.append(ScoreRequest(prompt.ids, stem + tail, len(stem) + 1, len(stem)))
        swapped = with_images_of(prompt.ids, rendered[0].ids)
        out.append(ScoreRequest(swapped, stems[0], 0))
    return out


def test_cached_scorer_equals_a_plain_forward_pass_within_1e_4_nats(family):
    backend, rendered = family
    requests = requests_for(rendered, len(backend.tokenizer))
    cached = backend.loglikelihood(requests, no_progress)
    backend.scorer = "naive"
    try:
        naive = backend.loglikelihood(requests, no_progress)
    finally:
        backend.scorer = "cached"
    assert np.abs(cached - naive).max() < 1e-4
    assert np.ptp(naive[:: len(requests) // len(rendered)]) > 1e-3  # the images matter
    image_token = backend.model.config.image_token_id
    assert any(image_token in r.continuation for r in requests)  # sampled, it stays text


def test_per_token_values_of_both_scorers_agree_and_sum_to_their_sums(family):
    """SPEC "Where the input shows" with images: each scored token's log-probability from the
    cached scorer (3D positions, 4D-masked branches) against the plain pass, within float32's
    rounding, and the sums `loglikelihood` gives unchanged."""
    backend, rendered = family
    requests = requests_for(rendered, len(backend.tokenizer))
    cached = backend.loglikelihood_per_token(requests, no_progress)
    np.testing.assert_array_equal(cached.sums, backend.loglikelihood(requests, no_progress))
    backend.scorer = "naive"
    try:
        naive = backend.loglikelihood_per_token(requests, no_progress)
    finally:
        backend.scorer = "cached"
    assert np.abs(cached.values - naive.values).max() < LOGPROB_ATOL
    np.testing.assert_array_equal(cached.offsets, naive.offsets)
    for index, request in enumerate(requests):
        assert len(naive.of_request(index)) == len(request.continuation) - request.scored_from
        assert naive.of_request(index).sum() == pytest.approx(naive.sums[index], abs=1e-9)


def test_the_plain_pass_is_the_models_own_forward_with_its_own_positions(family):
    """No positions given: the model computes its 3D positions from the image tokens (and
    Qwen3-VL its deepstack features from the pixels)."""
    backend, rendered = family
    image_token = backend.model.config.image_token_id
    requests = requests_for(rendered, len(backend.tokenizer))
    # a sampled image token the model itself would read as an image: not here
    request = next(r for r in requests if image_token not in r.continuation)
    row = request.context + request.continuation
    ids = torch.tensor([row]).masked_fill(torch.tensor([row]) < 0, image_token)
    slot = row[next(i for i, t in enumerate(row) if t < 0)]
    pixels, grid = backend.vision.pixels(slot)
    backend.model.model.rope_deltas = None
    with torch.inference_mode():
        logits = backend.model(
            input_ids=ids, pixel_values=pixels, image_grid_thw=grid,
            mm_token_type_ids=(ids == image_token).int(),
        ).logits[0, :-1].double()  # fmt: skip
    targets = torch.tensor(row[1:])
    own = torch.log_softmax(logits, -1).gather(1, targets[:, None].clamp(min=0))[:, 0]
    expected = float(own[len(request.context) + request.scored_from - 1 :].sum())
    backend.scorer = "naive"
    try:
        (value,) = backend.loglikelihood([request], no_progress)
    finally:
        backend.scorer = "cached"
    assert value == pytest.approx(expected, abs=1e-4)


def test_sampling_is_seeded_per_prompt(backend, rendered):
    params = SamplingParams(k=3, max_new_tokens=24, seed=5)
    first = backend.generate([r.ids for r in rendered[:2]], params, no_progress)
    again = backend.generate([r.ids for r in rendered[:2]], params, no_progress)
    assert first == again and len(first) == 2 and all(len(g) == 3 for g in first)


@pytest.mark.parametrize("checkpoint", [*FAMILIES.values(), VISION / "grounded"])
def test_prompts_decoded_together_draw_the_traces_each_draws_alone(checkpoint):
    """--sample-batch does not change the numbers: several prompts of two lengths with their
    images, left-padded into one prefill, sample what each samples on its own (the random tiny model
    and a trained policy)."""
    mixed = load_prompts(EXAMPLES / "prompts" / "visual-gridworld-mixed.jsonl", num_prompts=3)
    prompts = load_prompts(PROMPTS, num_prompts=3) + mixed  # two lengths: padding is used
    params = SamplingParams(k=3, max_new_tokens=24, seed=11)
    drawn = []
    for per_batch in (1, 6):
        backend = load_backend(require_checkpoint(checkpoint, None),
                               LoadSettings(device="cpu", sample_batch=3 * per_batch))  # fmt: skip
        ids = [r.ids for r in render_prompts(prompts, backend.tokenizer, PromptSettings(),
                                             backend.vision)]  # fmt: skip
        drawn.append(backend.generate(ids, params, no_progress))
    assert drawn[0] == drawn[1]
    with torch.inference_mode():
        _, together, _, _ = backend.prefill_together(ids)
        alone = torch.cat([backend._prefill(prompt)[1] for prompt in ids])
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=0)


@pytest.mark.parametrize("checkpoint", [FAMILIES["qwen3_vl"], VISION / "grounded"])
def test_prompts_with_the_same_image_and_text_share_one_prefill(checkpoint):
    """SPEC "Sampling": identical prompts with their images (one episode's context K
    times), each with its own seed, are prefilled once and draw what each draws alone."""
    prompts = load_prompts(EXAMPLES / "prompts" / "visual-gridworld-mixed.jsonl", num_prompts=2)
    backend = load_backend(require_checkpoint(checkpoint, None), LoadSettings(device="cpu"))
    ids = [r.ids for r in render_prompts(prompts, backend.tokenizer, PromptSettings(),
                                         backend.vision)]  # fmt: skip
    shared, seeds = [ids[0], ids[1], ids[0], ids[0]], [3, 4, 5, 6]
    params = SamplingParams(k=2, max_new_tokens=24)
    together = backend.generate(shared, params, no_progress, seeds=seeds)
    alone = [backend.generate([p], params, no_progress, seeds=[s])[0]
             for p, s in zip(shared, seeds, strict=True)]  # fmt: skip
    assert together == alone
    assert together[0] != together[2]  # one context, two seeds: two draws


# -- a scan, end to end ---------------------------------------------------------------


def test_a_scan_of_a_vision_language_checkpoint_runs_end_to_end(tmp_path):
    """Random weights: no verdict to expect, but every stage runs on images, the flow too,
    and the report says why the image's share was not measured."""
    out = tmp_path / "report.json"
    args = ["-n", "6", "-k", "3", "--reasoning-regex", "^(.{4})", "--action-regex", "(.{2})$"]
    result = invoke("scan", TINY, *FAST[:2], *args, "--max-new-tokens", "12", "--device", "cpu",
                    "--bootstrap", "100", "--fail-on", "none", "--json", out, "--html",
                    tmp_path / "page.html")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["counts"]["scored_traces"] > 0 and report["flow"]["regime"] != "not_measured"
    assert report["settings"]["images"] == {
        "prompts_with_images": 6,
        "image_share": "every prompt has the same text: X->Z already measures the image alone",
    }
    assert report["settings"]["image_processor"].startswith("Qwen2VLImageProcessor")
    assert "image: share not measured" in result.output
    page = (tmp_path / "page.html").read_text()
    assert "[image 00.png] your move?" in page
    assert page.count('<img class="picture" src="data:image/png;base64,') == 3  # side by side


# -- the demo policies -----------------------------------------------------------------

DEMO = ["-p", str(PROMPTS), "-n", "16", "-k", "8", "--max-new-tokens", "64", "--device", "cpu",
        "--bootstrap", "300", "--fail-on", "none", "--reward-fn",
        str(EXAMPLES / "rewards" / "gridworld.py")]  # fmt: skip


@pytest.mark.parametrize(
    "policy, regime", [("grounded", "grounded"), ("template", "template_collapse")]
)
def test_the_vision_demo_policies_get_their_verdicts(tmp_path, policy, regime):
    """The board is only in the image and the text is the same for every prompt: the policy
    that names the cells it sees is grounded, the one whose reasoning ignores the image is a
    template collapse; the flow (reasoning -> action) is measured for both."""
    out = tmp_path / "report.json"
    result = invoke("scan", VISION / policy, *DEMO, "--json", out)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["verdict"]["regime"] == regime, report["verdict"]["reason"]
    assert report["flow"]["regime"] != "not_measured"
    assert report["snr"] is not None  # the rewards of the visual gridworld were read


SHARE_KEYS = ("normalized_mi", "image_share")
MIXED = ["-p", str(EXAMPLES / "prompts" / "visual-gridworld-mixed.jsonl"), *DEMO[2:]]


@pytest.mark.parametrize(
    "policy, reading",
    [("reads-text", "text_only"), ("grounded", "image"), ("template", "no_dependence")],
)
def test_the_image_share_tells_a_policy_that_reads_the_text_from_one_that_reads_the_board(
    tmp_path, policy, reading
):
    """Each board's state is in its text too: the policy trained on the text (with another
    state's board in the image) carries almost nothing through the image; the one trained on
    the board carries almost everything through it; the template one has no dependence
    to share."""
    out = tmp_path / "report.json"
    result = invoke("scan", VISION / policy, *MIXED, "--json", out)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["settings"]["images"]["image_share"] == "measured"
    metrics = {name: Estimate(**report["metrics"][name]) for name in SHARE_KEYS}
    assert image_reading(metrics) == reading, metrics
    assert READINGS[reading] in " ".join(result.output.split())


def test_compare_says_when_b_leans_less_on_the_image(tmp_path):
    """The board-reading policy against the text-reading one, on boards whose text holds the
    state too: the share's drop is paired over prompts, beyond noise, and said."""
    out = tmp_path / "compare.json"
    args = [a for a in MIXED if a not in ("--fail-on", "none")]
    result = invoke("compare", VISION / "grounded", VISION / "reads-text", *args,
                    "--out", tmp_path / "cache", "--json", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    compared = json.loads(out.read_text())
    assert compared["paired"] and not compared["lost_input_dependence"]
    drop = compared["metrics"]["image_share"]["delta"]
    assert drop["high"] < -0.5, drop
    assert "B's reasoning leans less on the image than A's beyond noise" in compared["reason"]


# -- the image's share, on hand-made matrices ------------------------------------------


def hand_made(n: int = 4, k: int = 3):
    rng = np.random.default_rng(1)
    row_prompt = np.repeat(np.arange(n), k)
    full = rng.normal(-30.0, 1.0, size=(n * k, n))
    full[np.arange(n * k), row_prompt] += 6.0  # the reasoning names its prompt
    return CrossLogProbs(full, full / 10, row_prompt), row_prompt


def test_image_share_is_one_when_the_image_carries_everything():
    scores, _ = hand_made()
    metrics = image_share_metrics(scores, scores.sum.copy(), resamples=200)
    assert metrics["image_share"].value == pytest.approx(1.0)
    assert metrics["image_share"].low == pytest.approx(1.0)


def test_image_share_is_zero_when_swapping_the_image_changes_nothing():
    scores, row_prompt = hand_made()
    own = scores.sum[np.arange(len(row_prompt)), row_prompt]
    swapped = np.repeat(own[:, None], scores.num_prompts, axis=1)
    metrics = image_share_metrics(scores, swapped, resamples=200)
    assert metrics["image_share"].value == pytest.approx(0.0, abs=1e-12)
    assert metrics["mi_image_seq_estimate"].value == pytest.approx(0.0, abs=1e-12)


def test_the_paired_difference_of_the_share_is_b_minus_a_under_the_same_resamples():
    scores, row_prompt = hand_made()
    own = scores.sum[np.arange(len(row_prompt)), row_prompt]
    ignored = np.repeat(own[:, None], scores.num_prompts, axis=1)  # the image changes nothing
    reads_image, reads_text = (scores, scores.sum.copy()), (scores, ignored)
    deltas = paired_image_share_differences(reads_image, reads_text, resamples=200)
    assert deltas["image_share"].value == pytest.approx(-1.0)
    assert deltas["image_share"].low == pytest.approx(-1.0)
    assert deltas["image_share"].high == pytest.approx(-1.0)
    same = paired_image_share_differences(reads_image, reads_image, resamples=200)
    assert same["mi_image_seq_estimate"].low == same["mi_image_seq_estimate"].high == 0.0


def test_image_share_is_undefined_without_input_dependence():
    scores, _ = hand_made()
    flat = CrossLogProbs(np.full_like(scores.sum, -30.0), scores.mean, scores.row_prompt)
    assert np.isnan(image_share_metrics(flat, flat.sum.copy(), resamples=50)["image_share"].value)


def test_diagnose_batch_takes_prompt_ids_whose_image_tokens_hold_slots(backend, rendered):
    """A trainer passes each prompt's ids with its images' tokens holding their slots, and a
    log-likelihood function that maps the slots to its own images (here: the backend's)."""
    from collapsecheck.integrations.any_trainer import diagnose_batch

    def loglikelihood(contexts, continuations):
        pairs = zip(contexts, continuations, strict=True)
        requests = [ScoreRequest(tuple(c), tuple(r)) for c, r in pairs]
        return list(backend.loglikelihood(requests, no_progress))

    params = SamplingParams(k=3, max_new_tokens=10, seed=2)
    samples = backend.generate([r.ids for r in rendered], params, no_progress)
    responses = [[list(s.ids) for s in group] for group in samples]
    report = diagnose_batch(
        [list(r.ids) for r in rendered], responses, loglikelihood, backend.tokenizer,
        whole_response=True, no_flow=True, bootstrap=50,
    )  # fmt: skip
    assert report.counts["prompts"] == 4
    matrix = report.evidence.matrix
    row, trace = 0, report.evidence.reasoning[0]
    own = int(matrix.row_prompt[row])
    ids = next(s.ids for s in samples[own] if backend.decode(s.ids) == trace)
    expected = backend.loglikelihood([ScoreRequest(rendered[1].ids, ids)], no_progress)[0]
    assert matrix.sum[row, 1] == pytest.approx(expected, abs=sequence_atol(10))  # other batches
    assert backend.decode(rendered[0].ids).count("<image>") == 1


def verl_parquet(tmp_path, placeholders: int):
    """A veRL-style prompt set written by `datasets` (as veRL's data scripts write theirs):
    chat messages with `<image>` placeholders, and an `images` column of Image features."""
    from datasets import Dataset, Features, Image, Sequence, Value

    boards = [str(PROMPTS.parent / "boards" / f"{i:02d}.png") for i in range(3)]
    content = "<image>" * placeholders + "your move?"
    rows = {
        "prompt": [[{"role": "user", "content": content}] for _ in boards],
        "images": [[board] for board in boards],
        "data_source": ["visual-gridworld"] * 3,
    }
    features = Features({
        "prompt": [{"role": Value("string"), "content": Value("string")}],
        "images": Sequence(Image()),
        "data_source": Value("string"),
    })  # fmt: skip
    path = tmp_path / "train.parquet"
    Dataset.from_dict(rows, features=features).to_parquet(str(path))
    return path


def test_verl_parquet_with_an_images_column_renders_each_board(tmp_path, backend):
    prompts = load_prompts(verl_parquet(tmp_path, 1))
    rendered = render_prompts(prompts, backend.tokenizer, PromptSettings(), backend.vision)
    slots = [[slot for _, _, slot in image_runs(r.ids)] for r in rendered]
    assert len({s[0] for s in slots}) == 3 and all(len(s) == 1 for s in slots)
    # the same boards as the JSONL prompt set's: the same slots, whatever file they came from
    jsonl = render_prompts(load_prompts(PROMPTS, num_prompts=3), backend.tokenizer,
                           PromptSettings(), backend.vision)  # fmt: skip
    assert [image_runs(r.ids)[0][2] for r in jsonl] == [s[0] for s in slots]


def test_verl_placeholders_without_their_images_are_one_line(tmp_path):
    path = verl_parquet(tmp_path, 2)
    result = invoke("scan", TINY, "-p", path, "-k", "2", "--max-new-tokens", "8")
    assert result.exit_code == 2
    assert (
        f"{path}: row 1" in result.output and "2 <image> placeholders but 1 images" in result.output
    )


def test_score_reads_rollouts_whose_prompts_hold_images(tmp_path):
    """`score` on a rollout file of a vision-language policy: each row's prompt names its
    board (relative to the rollout file), its responses are scored under every board."""
    shutil.copytree(PROMPTS.parent / "boards", tmp_path / "boards")
    rows = []
    for line in PROMPTS.read_text().splitlines()[:4]:
        prompt = json.loads(line)["messages"]
        for move in ("up", "left"):
            response = f"<think>the board, so {move}</think><answer>{move}</answer>"
            rows.append({"prompt": prompt, "response": response, "reward": float(move == "up")})
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report.json"
    result = invoke("score", rollouts, "--checkpoint", TINY, "--device", "cpu",
                    "--bootstrap", "100", "--fail-on", "none", "--json", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["counts"]["prompts"] == 4 and report["counts"]["scored_traces"] == 8
    assert report["settings"]["images"]["prompts_with_images"] == 4


@pytest.mark.parametrize(
    "whole, share, reading",
    [
        ((0.8, 0.7, 0.9), (0.05, -0.02, 0.1), "text_only"),
        ((0.8, 0.7, 0.9), (0.95, 0.85, 1.1), "image"),
        ((0.8, 0.7, 0.9), (0.5, 0.1, 0.9), "both"),
        ((0.8, 0.7, 0.9), (0.1, -0.1, 0.3), "both"),  # too wide to say it ignores the image
        ((0.3, 0.06, 0.5), (0.95, 0.85, 1.1), "image"),  # a small dependence, still read
        ((0.02, 0.0, 0.04), (0.05, -0.02, 0.1), "no_dependence"),  # template collapse
        ((0.3, 0.01, 0.6), (0.95, 0.85, 1.1), "no_dependence"),  # maybe negligible
    ],
)
def test_the_reading_of_the_share_needs_its_whole_interval_on_one_side(whole, share, reading):
    metrics = {"normalized_mi": Estimate(*whole), "image_share": Estimate(*share)}
    assert image_reading(metrics) == reading


# -- the dump keeps the images -----------------------------------------------------------


def moved_prompt_set(tmp_path):
    """The first six boards' prompts, copied with their boards to a folder of their own."""
    folder = tmp_path / "prompts"
    shutil.copytree(PROMPTS.parent / "boards", folder / "boards")
    path = folder / "boards.jsonl"
    path.write_text("\n".join(PROMPTS.read_text().splitlines()[:6]) + "\n")
    return path


def scan_tiny(prompts, *args):
    return invoke("scan", TINY, "-p", prompts, "-k", "3", "--max-new-tokens", "12",
                  "--reasoning-regex", "^(.{4})", "--device", "cpu", "--bootstrap", "100",
                  "--fail-on", "none", *args)  # fmt: skip


def test_a_dump_keeps_its_images_and_scores_again_without_the_prompt_files(tmp_path):
    """The dump holds every image by its hash, so `score DUMP` reproduces the scan's matrix
    after the prompt file and its boards are gone."""
    prompts, dump = moved_prompt_set(tmp_path), tmp_path / "dump"
    assert scan_tiny(prompts, "--dump", dump).exit_code == 0
    rows = [json.loads(line) for line in (dump / "prompts.jsonl").read_text().splitlines()]
    assert [row["images"][0]["source"] for row in rows] == [
        str(prompts.parent / "boards" / f"{i:02d}.png") for i in range(6)
    ]
    assert len(list((dump / "images").iterdir())) == 6
    shutil.rmtree(prompts.parent)
    result = invoke("score", dump, "--checkpoint", TINY, "--reasoning-regex", "^(.{4})",
                    "--device", "cpu", "--bootstrap", "100", "--fail-on", "none",
                    "--dump", tmp_path / "rescored")  # fmt: skip
    assert result.exit_code == 0, result.output
    first = np.load(dump / "cross_logprobs.npz")["sum"]
    second = np.load(tmp_path / "rescored" / "cross_logprobs.npz")["sum"]
    np.testing.assert_allclose(second, first, atol=1e-4)


def test_a_dump_without_its_images_is_one_line(tmp_path):
    """A dump whose ids hold image slots but which keeps no images (written before dumps
    kept them, or with images/ deleted) cannot be scored again: one line, exit 2."""
    dump = tmp_path / "dump"
    assert scan_tiny(moved_prompt_set(tmp_path), "--dump", dump).exit_code == 0
    shutil.rmtree(dump / "images")
    result = invoke("score", dump, "--checkpoint", TINY, "--device", "cpu")
    assert result.exit_code == 2
    assert f"{dump / 'prompts.jsonl'}:1: image {dump / 'images'}" in result.output
    lines = (dump / "prompts.jsonl").read_text().splitlines()
    old = [{k: v for k, v in json.loads(line).items() if k != "images"} for line in lines]
    (dump / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in old))
    result = invoke("score", dump, "--checkpoint", TINY, "--device", "cpu")
    assert result.exit_code == 2
    assert "hold images the dump does not keep" in result.output


def test_an_image_changed_in_place_is_not_answered_from_the_results_cache(tmp_path):
    """The prompt file holds only the images' paths: the cache key holds their contents."""
    prompts, cache = moved_prompt_set(tmp_path), tmp_path / "cache"
    first = scan_tiny(prompts, "--out", cache)
    assert first.exit_code == 0, first.output
    cached = scan_tiny(prompts, "--out", cache, "--html", tmp_path / "page.html")
    assert "answered from the results cache" in cached.output
    # the page of a cached scan draws the boards the cache entry keeps
    assert (tmp_path / "page.html").read_text().count('<img class="picture"') == 3
    shutil.copy(prompts.parent / "boards" / "07.png", prompts.parent / "boards" / "03.png")
    again = scan_tiny(prompts, "--out", cache)
    assert again.exit_code == 0, again.output
    assert "answered from the results cache" not in again.output


def test_the_gate_fails_a_policy_whose_image_share_is_below_its_minimum(tmp_path):
    config = tmp_path / "gate.toml"
    config.write_text("[min]\nimage_share = 0.5\n")
    result = invoke("scan", VISION / "reads-text", *MIXED, "--config", config)
    assert result.exit_code == 1, result.output
    assert "gate failed (rule: min image_share): image_share = 0.000, minimum 0.5" in " ".join(
        result.output.split()
    )
    # the prompts share one text: no share was measured, and the rule cannot be read
    unmeasured = scan_tiny(moved_prompt_set(tmp_path), "--config", config)
    assert unmeasured.exit_code == 2
    assert "min.image_share: this report has no metric image_share" in unmeasured.output


# -- TRL's formats ---------------------------------------------------------------------


BOARDS = [PROMPTS.parent / "boards" / f"{i:02d}.png" for i in range(4)]
SYSTEM = "grid agent. the board is in the image."  # the JSONL prompt set's system message


def trl_prompt_set(tmp_path, structured: bool):
    """A prompt set as TRL's vision-language datasets hold one, written by `datasets`: either
    string messages and an `image` column (TRL puts the image before the user's text), or
    messages with `{"type": "image"}` parts and an `images` column filling them in order."""
    from datasets import Dataset, Features, Image, Sequence, Value

    if structured:
        parts = [{"type": "image", "text": None}, {"type": "text", "text": "your move?"}]
        system = [{"type": "text", "text": SYSTEM}]
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": parts}]
        part = {"type": Value("string"), "text": Value("string")}
        rows = {"prompt": [prompt] * 4, "images": [[str(b)] for b in BOARDS]}
        features = {"prompt": [{"role": Value("string"), "content": [part]}],
                    "images": Sequence(Image())}  # fmt: skip
    else:
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "your move?"}]
        rows = {"prompt": [prompt] * 4,
                "image": [str(b) for b in BOARDS]}  # fmt: skip
        features = {"prompt": [{"role": Value("string"), "content": Value("string")}],
                    "image": Image()}  # fmt: skip
    path = tmp_path / "train.parquet"
    Dataset.from_dict(rows, features=Features(features)).to_parquet(str(path))
    return path


@pytest.mark.parametrize("structured", [False, True], ids=["image-column", "image-parts"])
def test_trl_vision_datasets_render_each_row_with_its_board(tmp_path, backend, structured):
    prompts = load_prompts(trl_prompt_set(tmp_path, structured))
    rendered = render_prompts(prompts, backend.tokenizer, PromptSettings(), backend.vision)
    # the same boards as the JSONL prompt set's (image first, then the text): the same ids
    jsonl = render_prompts(load_prompts(PROMPTS, num_prompts=4), backend.tokenizer,
                           PromptSettings(), backend.vision)  # fmt: skip
    assert [r.ids for r in rendered] == [r.ids for r in jsonl]


def test_trl_completion_logs_of_a_vision_run_are_one_line(tmp_path):
    """TRL 1.16 logs a vision-language run's prompts with `strip_images_from_messages`: the
    image parts keep no image and no column holds them, so they cannot be scored."""
    import pandas as pd
    from PIL import Image as PILImage
    from trl.data_utils import prepare_multimodal_messages
    from trl.trainer.utils import strip_images_from_messages

    prompts = [
        prepare_multimodal_messages(
            [{"role": "user", "content": "your move?"}], [PILImage.open(board)]
        )
        for board in BOARDS
    ]
    completion = [{"role": "assistant", "content": "<think>up</think><answer>up</answer>"}]
    table = {
        "step": [2] * 4,
        "prompt": [strip_images_from_messages(m) for m in prompts],
        "completion": [strip_images_from_messages(completion)] * 4,
        "answered": [1.0] * 4,
        "advantage": [0.0] * 4,
    }
    path = tmp_path / "completions" / "completions_00002.parquet"
    path.parent.mkdir()
    pd.DataFrame(table).to_parquet(path)
    result = invoke("score", path, "--checkpoint", TINY, "--device", "cpu")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "an image part names no image file and the row has no image left" in said


# -- veRL's rollout dumps of a vision-language run -------------------------------------


def verl_dump(tmp_path, backend, prompt_file):
    """A veRL rollout dump (`trainer.rollout_data_dir`) as veRL writes one for a vision run:
    each input decoded with special tokens skipped, so the image's tokens are gone."""
    prompts = load_prompts(prompt_file, num_prompts=4)
    rendered = render_prompts(prompts, backend.tokenizer, PromptSettings(), backend.vision)
    lines = []
    for r in rendered:
        decoded = backend.tokenizer.decode([t for t in r.ids if t >= 0], skip_special_tokens=True)
        for move in ("up", "left"):
            output = f"<think>the board, so {move}</think><answer>{move}</answer>"
            row = {"input": decoded, "output": output, "score": float(move == "up"), "step": 1}
            lines.append(json.dumps(row))
    path = tmp_path / "rollouts" / "1.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    return path


def test_verl_inputs_of_a_vision_run_are_matched_to_their_rows_and_boards(tmp_path, backend):
    mixed = EXAMPLES / "prompts" / "visual-gridworld-mixed.jsonl"
    out = tmp_path / "report.json"
    result = invoke("score", verl_dump(tmp_path, backend, mixed), "--checkpoint", TINY,
                    "--prompts", mixed, "--device", "cpu", "--bootstrap", "100",
                    "--fail-on", "none", "--json", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["settings"]["prompt_matching"].startswith("4 of 4 inputs matched a row")
    assert report["settings"]["images"]["prompts_with_images"] == 4  # scored under the boards


def test_verl_inputs_that_several_boards_decode_to_are_not_matched_to_one(tmp_path, backend):
    """Every board's prompt decodes to the same text once veRL drops the image's tokens:
    which board an input had is unknown, so none is picked, and the note says why."""
    result = invoke("score", verl_dump(tmp_path, backend, PROMPTS), "--checkpoint", TINY,
                    "--prompts", PROMPTS, "--device", "cpu", "--fail-on", "none")  # fmt: skip
    said = " ".join(result.output.split())
    assert result.exit_code == 2  # one decoded input left: nothing to cross-score
    assert "decode as several rows that differ in what decoding drops" in said, said
