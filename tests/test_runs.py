"""Training runs: discovery, the results cache and resume, the onset, and the picture."""

import shutil

import matplotlib.image
import numpy as np
import pytest

from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import write_text_atomic
from collapsecheck.inputs.discovery import discover_run, find_checkpoints, step_number
from collapsecheck.measures.metrics import Estimate
from collapsecheck.measures.onset import collapse_onset, detect_onset, mi_drop_onset
from collapsecheck.reports.dump import REPORT_FILE
from collapsecheck.reports.plot import plot_run
from collapsecheck.runs.run import scan_run
from tests.conftest import HEALTHY, PROMPTS, RUN

# 16 prompts x 8 samples: enough to see the 15% templates of step 200 beyond noise
FAST = {"k": 8, "num_prompts": 16, "max_new_tokens": 64, "device": "cpu", "bootstrap": 200}


def copy_checkpoint(destination):
    shutil.copytree(HEALTHY, destination)
    return destination


def test_discovery_orders_by_step_and_skips_distractors(tmp_path):
    run = tmp_path / "run"
    copy_checkpoint(run / "checkpoint-1000")
    copy_checkpoint(run / "checkpoint-200")
    copy_checkpoint(run / "global_step_50" / "actor" / "huggingface")
    (run / "global_step_50" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"shard")
    copy_checkpoint(run / "step_7")
    copy_checkpoint(run / "final")
    (run / "logs").mkdir()
    (run / "logs" / "events.out").write_text("not a checkpoint")
    (run / "broken").mkdir()
    shutil.copy(HEALTHY / "config.json", run / "broken")
    (run / "notes.txt").write_text("a file, not a folder")
    found = discover_run(run)
    assert [c.name for c in found] == [
        "step_7",
        "global_step_50",
        "checkpoint-200",
        "checkpoint-1000",
        "final",
    ]
    assert [c.step for c in found] == [7, 50, 200, 1000, None]
    assert found[1].checkpoint.path == run / "global_step_50" / "actor" / "huggingface"
    assert find_checkpoints(run)[0] is None
    single, rest = find_checkpoints(run / "step_7")
    assert (single.kind, single.path, rest) == ("huggingface", run / "step_7", [])
    assert step_number("epoch2-step300") == 300


def test_a_folder_with_nothing_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CollapsecheckError, match="neither a checkpoint nor a run directory"):
        find_checkpoints(tmp_path / "empty")


def est(value, half=0.02):
    return Estimate(value, value - half, value + half)


def test_onset_rules_by_hand():
    assert collapse_onset(["grounded", "template_collapse", "grounded", "template_collapse",
                           "low_entropy_collapse"]) == 3  # fmt: skip
    assert collapse_onset(["grounded", "template_collapse", "inconclusive"]) is None
    assert mi_drop_onset([est(0.9), est(0.95), est(0.93), est(0.5)]) == (3, 1)
    assert mi_drop_onset([est(0.9), est(0.88), est(0.91)]) is None
    onset = detect_onset(
        ["10", "20", "30"], ["grounded", "grounded", "template_collapse"],
        [est(0.9), est(0.6), est(0.1)],
    )  # fmt: skip
    assert (onset.index, onset.rule) == (1, "mi_drop")
    assert detect_onset(["1", "2"], ["grounded"] * 2, [est(0.9), est(0.9)]) is None


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    cache = tmp_path_factory.mktemp("run-cache")
    return scan_run(str(RUN), str(PROMPTS), cache_root=str(cache), **FAST), cache


def test_onset_of_the_demo_run_is_where_templates_start(demo_run):
    run, _ = demo_run
    assert [s.checkpoint.step for s in run.steps] == [100, 200, 300, 400, 500]
    assert run.onset_step == 200
    assert run.to_dict()["onset_step"] == 200
    # the EMA runs along the steps: the last std is smoothed towards the earlier ones
    first, last = run.steps[0].report.metrics, run.steps[-1].report.metrics
    assert last["marginal_std_ema_seq"] != pytest.approx(last["marginal_std_seq"].value)
    assert first["marginal_std_ema_seq"] == pytest.approx(first["marginal_std_seq"].value)
    frame = run.to_frame()
    assert list(frame.index) == ["100", "200", "300", "400", "500"]
    assert frame["normalized_mi"].is_monotonic_decreasing


def test_interrupted_run_resumes_without_rescanning(demo_run, tmp_path):
    complete, _ = demo_run
    cache = tmp_path / "cache"
    started = []

    def interrupt_third_checkpoint(stage, total):
        if stage.startswith("sampling"):
            started.append(stage)
            if len(started) == 3:
                raise KeyboardInterrupt
        return lambda n: None

    with pytest.raises(KeyboardInterrupt):
        scan_run(RUN, PROMPTS, cache_root=cache, progress=interrupt_third_checkpoint, **FAST)
    finished = sorted(p.parent.name for p in cache.glob(f"*/{REPORT_FILE}"))
    assert len(finished) == 2
    assert not list(cache.rglob(".*"))  # no half-written temporary files

    stages = []
    resumed = scan_run(
        RUN, PROMPTS, cache_root=cache,
        progress=lambda stage, total: stages.append(stage) or (lambda n: None), **FAST,
    )  # fmt: skip
    assert [s.report.timing.get("cached", False) for s in resumed.steps] == [
        True, True, False, False, False,
    ]  # fmt: skip
    assert stages == ["run", "sampling, step 300", "scoring, step 300", "sampling, step 400",
                      "scoring, step 400", "sampling, step 500", "scoring, step 500"]  # fmt: skip
    for again, before in zip(resumed.steps, complete.steps, strict=True):
        assert again.report.metrics == before.report.metrics
        assert again.report.verdict == before.report.verdict


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "report.json"
    write_text_atomic(target, "old")

    with pytest.raises(TypeError):
        write_text_atomic(target, 12345)  # not text: the write fails part-way
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_plot_is_a_real_picture(demo_run, tmp_path):
    run, _ = demo_run
    path = plot_run(run, tmp_path / "run.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    height, width = image.shape[:2]
    assert width > 1200 and height > 500
    colours = np.unique(image.reshape(-1, image.shape[2]).round(2), axis=0)
    assert len(colours) > 50  # lines, bands, text: not a blank canvas
