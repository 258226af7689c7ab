"""`collapsecheck watch`: a run that is still going, diagnosed checkpoint by checkpoint as its
trainer finishes writing each one, into the results cache, the page and TensorBoard; killed and
started again, it diagnoses no step twice and loses none."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from collapsecheck.config import GateSettings
from collapsecheck.inputs.completeness import (
    TRAINER_STATE,
    VERL_TRACKER,
    Completeness,
)
from collapsecheck.measures.regimes import VerdictThresholds
from collapsecheck.runs.watch import SampledFrom, Watch
from collapsecheck.settings import Settings, WatchSettings
from tests.conftest import COLLAPSED, HEALTHY, PROMPTS, ROOT

FAST = {"k": 4, "num_prompts": 6, "max_new_tokens": 48, "device": "cpu", "bootstrap": 100}
FAST_FLAGS = ["-p", str(PROMPTS), "-n", "6", "-k", "4", "--max-new-tokens", "48",
              "--device", "cpu", "--bootstrap", "100"]  # fmt: skip


def write_slowly(source: Path, target: Path, pause: float = 0.05) -> None:
    """A trainer's save, as slow as a big one: every file in two halves with a pause
    between, trainer_state.json last (as `Trainer._save_checkpoint` writes it)."""
    target.mkdir(parents=True)
    files = sorted(p for p in source.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == TRAINER_STATE)
    for path in files:
        data = path.read_bytes()
        (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
        with (target / path.relative_to(source)).open("wb") as stream:
            stream.write(data[: len(data) // 2])
            stream.flush()
            time.sleep(pause)
            stream.write(data[len(data) // 2 :])
        time.sleep(pause)


def mark_saved(folder: Path, step: int) -> None:
    """The file the Trainer writes last into checkpoint-N."""
    (folder / TRAINER_STATE).write_text(json.dumps({"global_step": step, "log_history": []}))


def trl_checkpoint(source: Path, target: Path, step: int) -> None:
    write_slowly(source, target)
    mark_saved(target, step)


def watcher(run_dir: Path, cache: Path, lines: list[str], **options) -> Watch:
    settings = Settings.build(**FAST)
    gate = GateSettings(fail_on="none").load()
    follow = WatchSettings(**{"idle": 3.0, "poll": 0.2, "settle": 0.5, **options})
    return Watch(run_dir, SampledFrom(PROMPTS), settings, follow, gate, VerdictThresholds(),
                 cache, lines.append)  # fmt: skip


# -- when a checkpoint is complete -------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_each_writers_rule(tmp_path):
    clock = Clock()
    rules = Completeness(settle=5, clock=clock)
    run = tmp_path / "run"
    # TRL: not before trainer_state.json, which the Trainer writes last
    trl = run / "checkpoint-10"
    shutil.copytree(HEALTHY, trl)
    assert not (trl / TRAINER_STATE).exists() and rules.rule(trl, run) == "settled"
    (trl / TRAINER_STATE).write_text("{}")
    assert rules.rule(trl, run) == "trainer_state" and rules.complete(trl, run)
    # veRL: the tracker file names the step once the save is whole
    verl = run / "global_step_20"
    shutil.copytree(HEALTHY, verl / "actor" / "huggingface")
    (run / VERL_TRACKER).write_text("10")
    assert rules.rule(verl, run) == "verl_tracker" and not rules.complete(verl, run)
    (run / VERL_TRACKER).write_text("20")
    assert rules.complete(verl, run)
    # any other folder: weights present and nothing changed for `settle` seconds
    plain = run / "final"
    shutil.copytree(HEALTHY, plain)
    assert not rules.complete(plain, run)  # first look
    clock.now = 4
    assert not rules.complete(plain, run)
    (plain / "config.json").write_text((plain / "config.json").read_text() + " ")
    clock.now = 8
    assert not rules.complete(plain, run)  # it changed: the wait starts again
    clock.now = 13
    assert rules.complete(plain, run)


def test_a_sharded_save_waits_for_every_shard_its_index_names(tmp_path):
    clock = Clock()
    rules = Completeness(settle=1, clock=clock)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"x")
    for now in (0, 5, 10):
        clock.now = now
        assert not rules.complete(folder, tmp_path)
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"y")
    clock.now, _ = 20, rules.complete(folder, tmp_path)
    clock.now = 30
    assert rules.complete(folder, tmp_path)


# -- the watch, in this process -----------------------------------------------------------


def test_checkpoints_written_slowly_are_diagnosed_once_each_as_they_land(tmp_path):
    """A trainer writes two checkpoints slowly, half a file at a time, into a run directory
    that does not exist when the watch starts; each is diagnosed once, after it is whole,
    with the numbers of a scan of the finished folder."""
    from collapsecheck import scan

    run, lines = tmp_path / "run", []

    def trainer():
        time.sleep(0.5)
        trl_checkpoint(HEALTHY, run / "checkpoint-100", 100)
        trl_checkpoint(COLLAPSED, run / "checkpoint-200", 200)

    writing = threading.Thread(target=trainer)
    writing.start()
    watch = watcher(run, tmp_path / "cache", lines, idle=4.0, every_step=True)
    assert watch.follow() == 0
    writing.join()
    said = "\n".join(lines)
    assert f"waiting for {run} to appear" in said
    assert said.count("step 100: grounded") == 1 and said.count("step 200: template_collapse") == 1
    assert "input shows nowhere" in said  # SPEC "Where the input shows", on the step's line
    assert "diagnosed" in said and "nothing new for 4 s: the watch ends" in said
    report = reports_by_folder(watch)["checkpoint-100"]
    assert report.metrics == scan(HEALTHY, PROMPTS, **FAST).metrics


def test_the_newest_first_when_the_trainer_is_faster_and_a_deleted_step_is_skipped(tmp_path):
    run, lines = tmp_path / "run", []
    for step, source in ((100, HEALTHY), (200, HEALTHY), (300, COLLAPSED)):
        shutil.copytree(source, run / f"checkpoint-{step}")
        mark_saved(run / f"checkpoint-{step}", step)
    watch = watcher(run, tmp_path / "cache", lines)

    def start(stage, total):  # the trainer's save_total_limit removes step 200 meanwhile
        if stage.endswith("step 300") and (run / "checkpoint-200").exists():
            shutil.rmtree(run / "checkpoint-200")
        return lambda n: None

    watch.progress = start
    assert watch.follow() == 0
    said = "\n".join(lines)
    assert "falling behind the trainer: steps 100, 200, 300 are waiting; diagnosing the " \
        "newest first (step 300)" in said  # fmt: skip
    assert said.index("step 300: template_collapse") < said.index("step 100: grounded")
    assert said.count(f"step 200: {run / 'checkpoint-200'} was deleted by the trainer") == 1
    assert [s.checkpoint.label for s in watch.run_report().steps] == ["100", "300"]


def test_a_step_deleted_before_its_model_loads_is_named_and_skipped(tmp_path):
    run, lines = tmp_path / "run", []
    for step in (100, 200):
        shutil.copytree(HEALTHY, run / f"checkpoint-{step}")
        mark_saved(run / f"checkpoint-{step}", step)
    watch = watcher(run, tmp_path / "cache", lines, every_step=True)

    def start(stage, total):
        if stage == "run" and watch.followed.done and (run / "checkpoint-200").exists():
            shutil.rmtree(run / "checkpoint-200")  # planned, then gone before loading
        return lambda n: None

    watch.progress = start
    assert watch.follow() == 0
    said = "\n".join(lines)
    assert f"step 200: {run / 'checkpoint-200'} was deleted by the trainer before its " \
        "diagnosis; skipped" in said  # fmt: skip
    assert [s.checkpoint.label for s in watch.run_report().steps] == ["100"]


def test_a_failed_gate_runs_on_fail_once_and_stops_the_watch(tmp_path):
    run, lines = tmp_path / "run", []
    for step, source in ((100, COLLAPSED), (200, COLLAPSED)):
        shutil.copytree(source, run / f"checkpoint-{step}")
        mark_saved(run / f"checkpoint-{step}", step)
    marker = tmp_path / "stop"
    command = f'echo "$COLLAPSECHECK_STEP $COLLAPSECHECK_RULE" >> {marker}'
    watch = watcher(run, tmp_path / "cache", lines, every_step=True, on_fail=command)
    watch.gate = GateSettings().load()  # the default gate: fail on a collapse
    assert watch.follow() == 0  # without --stop-on-fail the watch goes on to its end
    said = "\n".join(lines)
    assert "gate failed at step 100 (rule: regime)" in said
    assert "gate failed at step 200 (rule: regime)" in said
    assert marker.read_text() == "100 regime\n"  # once, at the first failure
    stopping = watcher(run, tmp_path / "cache2", [], stop_on_fail=True)
    stopping.gate = GateSettings().load()
    assert stopping.follow() == 1


def test_until_ends_the_watch_once_every_finished_step_is_diagnosed(tmp_path):
    run, lines = tmp_path / "run", []
    shutil.copytree(HEALTHY, run / "checkpoint-100")
    mark_saved(run / "checkpoint-100", 100)
    done = tmp_path / "training-done"
    done.write_text("")
    watch = watcher(run, tmp_path / "cache", lines, idle=600.0, until=done)
    started = time.monotonic()
    assert watch.follow() == 0
    assert time.monotonic() - started < 120
    said = "\n".join(lines)
    assert said.index("step 100: grounded") < said.index(f"the run ended ({done} exists)")


# -- TensorBoard ------------------------------------------------------------------------


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}  # fmt: skip


def test_tensorboard_scalars_land_beside_the_trainers_and_a_restart_adds_no_point(tmp_path):
    """Read back with TensorBoard's own reader: the collapse/ keys at each checkpoint's
    global step, in a run of their own beside the trainer's event file (found by auto)."""
    from torch.utils.tensorboard import SummaryWriter

    from collapsecheck.reports.tensorboard import TensorBoardWriter

    run, lines = tmp_path / "run", []
    for step, source in ((100, HEALTHY), (200, COLLAPSED)):
        shutil.copytree(source, run / f"checkpoint-{step}")
        mark_saved(run / f"checkpoint-{step}", step)
    trainer_logs = run / "runs" / "Nov25_06-00-00_host"
    trainer = SummaryWriter(str(trainer_logs))
    for step in (100, 200):
        trainer.add_scalar("train/reward", step / 1000, step)
    trainer.close()
    dashboard = TensorBoardWriter(None, run)  # --tensorboard auto
    for _ in range(2):  # the same command again: each step's point once
        watch = watcher(run, tmp_path / "cache", lines, idle=0.5)
        watch.after_step = lambda run_report, row, report: dashboard.write(row.step, report)
        assert watch.follow() == 0
    ours = {tag: sorted(points) for tag, points in scalars(trainer_logs / "collapsecheck").items()}
    assert [step for step, _ in ours["collapse/normalized_mi"]] == [100, 200]  # once each
    assert [value for _, value in ours["collapse/verdict_code"]] == [0.0, 2.0]
    assert ours["collapse/normalized_mi"][0][1] > 0.5 > ours["collapse/normalized_mi"][1][1]
    assert not any("_ema" in tag for tag in ours)
    tenths = [f"collapse/information_by_position/{d}" for d in range(10)]
    assert all([step for step, _ in ours[tag]] == [100, 200] for tag in tenths)
    assert ours["collapse/input_named_rate"][0][1] > 0.5 > ours["collapse/input_named_rate"][1][1]
    assert scalars(trainer_logs)["train/reward"][-1] == (200, pytest.approx(0.2))
    assert "step 100: grounded (diverse), from the results cache" in "\n".join(lines)


# -- killed and started again, as a separate process --------------------------------------


def test_sigkill_then_the_same_command_diagnoses_no_step_twice_and_loses_none(tmp_path):
    run = tmp_path / "run"
    for step, source in ((100, HEALTHY), (200, COLLAPSED)):
        shutil.copytree(source, run / f"checkpoint-{step}")
        mark_saved(run / f"checkpoint-{step}", step)
    command = [sys.executable, "-m", "collapsecheck", "watch", str(run), *FAST_FLAGS,
               "--out", str(tmp_path / "cache"), "--every-step", "--idle", "2", "--poll",
               "0.2", "--fail-on", "none", "--html", str(tmp_path / "watch.html")]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             text=True, env=env)  # fmt: skip
    seen = []
    for line in first.stderr:  # killed as step 200's scoring starts: sampled, not scored
        seen.append(line)
        if line.startswith("scoring, step 200: 0/"):
            first.send_signal(signal.SIGKILL)
            break
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    assert any(line.startswith("step 100: grounded") for line in seen)
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    said = again.stderr
    assert "step 100: grounded (diverse), from the results cache" in said  # not diagnosed twice
    assert "sampling, step 200" not in said  # its traces were kept: not sampled twice
    assert said.count("step 200: template_collapse, normalized MI") == 1  # diagnosed once
    # the step's line says the flow and when the action is decided (SPEC "Early answering")
    step_line = next(line for line in said.splitlines() if line.startswith("step 200: template"))
    assert re.search(r", flow [a-z ]+, early answer (decided at \d+%|post hoc|inconclusive)",
                     step_line), step_line  # fmt: skip
    assert "100" in again.stdout and "200" in again.stdout  # the run table, both steps
    page = (tmp_path / "watch.html").read_text()  # rewritten after every step
    assert "watching; latest: step 200" in page and "template_collapse" in page


def test_a_step_another_watcher_holds_is_waited_for_not_a_crash(tmp_path):
    """Two watchers on one results cache: the step's entry is held by the other (the lock
    every scan takes); this one says so once, waits, and goes on when it is free."""
    import fcntl

    from collapsecheck.files import LOCK_FILE
    from collapsecheck.inputs.checkpoint import detect_checkpoint
    from collapsecheck.inputs.discovery import RunCheckpoint
    from collapsecheck.runs.plan import plan_sampled

    run, cache, lines = tmp_path / "run", tmp_path / "cache", []
    folder = run / "checkpoint-100"
    shutil.copytree(HEALTHY, folder)
    mark_saved(folder, 100)
    watch = watcher(run, cache, lines, idle=1.0)
    row = RunCheckpoint(folder.name, 100, detect_checkpoint(folder))
    (unit,) = plan_sampled([row], PROMPTS, watch.settings, cache=cache).units
    unit.dump.mkdir(parents=True)
    with (unit.dump / LOCK_FILE).open("w") as held:  # the other watcher, mid-step

        def say(line):  # the other watcher lets go once this one has met its lock
            lines.append(line)
            if "another process is diagnosing" in line:
                fcntl.flock(held, fcntl.LOCK_UN)

        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        watch.say = say
        assert watch.follow() == 0
    said = "\n".join(lines)
    assert said.count("step 100: another process is diagnosing it") == 1
    assert said.count("step 100: grounded") == 1


def test_scan_of_a_finished_run_writes_its_steps_to_tensorboard(tmp_path):
    from typer.testing import CliRunner

    from collapsecheck.cli import app

    run = tmp_path / "run"
    for step, source in ((100, HEALTHY), (200, COLLAPSED)):
        shutil.copytree(source, run / f"global_step_{step}")
    logs = tmp_path / "tensorboard_log" / "project" / "experiment"
    args = ["scan", str(run), *FAST_FLAGS, "--fail-on", "none", "--tensorboard", str(logs)]
    for _ in range(2):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
    ours = scalars(logs / "collapsecheck")
    assert sorted(step for step, _ in ours["collapse/retrieval_skill"]) == [100, 200]
    one = CliRunner().invoke(app, ["scan", str(HEALTHY), *FAST_FLAGS, "--tensorboard", "x"])
    assert one.exit_code == 2 and "is one checkpoint" in " ".join(one.output.split())


# -- W&B, offline (these machines reach no W&B server) ------------------------------------

TRAINER_LOGGING = """
import wandb
run = wandb.init(entity="team", project="grpo", id="run-7",
                 settings=wandb.Settings(mode="offline", silent=True))
for step in range(1, 301):
    run.log({"train/reward": step / 300})
run.finish()
"""


def wandb_records(path: Path):
    """The records of a W&B transaction log (`run-ID.wandb`, LevelDB's log format: a 7-byte
    file header, 32 KiB blocks, each record chunk with a 7-byte header), read back with W&B's
    own record type."""
    import struct
    import zlib

    from wandb.proto.wandb_internal_pb2 import Record

    data, at, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while at + 7 <= len(data):
        if 32768 - at % 32768 < 7:
            at += 32768 - at % 32768
            continue
        crc, size, kind = struct.unpack("<IHB", data[at : at + 7])
        chunk, at = data[at + 7 : at + 7 + size], at + 7 + size
        if kind == 0:
            continue
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc
        pending += chunk
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(path: Path) -> list[dict]:
    return [
        {(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
         for item in record.history.item}
        for record in wandb_records(path) if record.WhichOneof("record_type") == "history"
    ]  # fmt: skip


def test_wandb_offline_beside_a_trainer_that_logs_there_itself(tmp_path, monkeypatch):
    """The trainer logs its own W&B run offline (in its own process) to step 300; the watch
    then logs the collapse keys into a run of the same id, each at its checkpoint's global
    step on the collapse/global_step axis, which W&B would otherwise drop as lagging."""
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")
    from collapsecheck.reports.weights_and_biases import WandbWriter

    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    trainer = subprocess.run([sys.executable, "-c", TRAINER_LOGGING], capture_output=True,
                             text=True, env={**os.environ, **env}, timeout=300)  # fmt: skip
    assert trainer.returncode == 0, trainer.stderr
    run, lines = tmp_path / "run", []
    for step, source in ((100, HEALTHY), (200, COLLAPSED)):
        shutil.copytree(source, run / f"checkpoint-{step}")
        mark_saved(run / f"checkpoint-{step}", step)
    board = WandbWriter("team/grpo/run-7", tmp_path / "cache")
    watch = watcher(run, tmp_path / "cache", lines, idle=0.5)
    watch.after_step = lambda run_report, row, report: board.write(row.step, report)
    assert watch.follow() == 0
    board.close()
    wandb.teardown()
    files = sorted((tmp_path / "wandb").glob("offline-run-*-run-7*/run-run-7.wandb"))
    assert len(files) == 2  # the trainer's and ours: the trainer's run is not touched
    theirs, ours = (wandb_history(f) for f in files)
    assert all("collapse/normalized_mi" not in row for row in theirs)
    assert [row["_step"] for row in theirs][-1] == 299
    logged = [row for row in ours if "collapse/normalized_mi" in row]
    assert sorted(row["collapse/global_step"] for row in logged) == [100, 200]
    by_step = {row["collapse/global_step"]: row for row in logged}
    assert by_step[100]["collapse/verdict_code"] == 0 and by_step[200]["collapse/verdict_code"] == 2
    metrics = [r.metric for r in wandb_records(files[1]) if r.WhichOneof("record_type") == "metric"]
    assert any(m.glob_name == "collapse/*" and m.step_metric == "collapse/global_step"
               for m in metrics)  # fmt: skip
    again = WandbWriter("team/grpo/run-7", tmp_path / "cache")  # a restarted watcher
    assert not again.write(100, reports_by_folder(watch)["checkpoint-100"])  # no second point


def test_a_runs_own_rollouts_are_scored_as_each_step_lands(tmp_path):
    """Without -p, the trainer's own rollouts (TRL's completions/): each step's file once it
    is complete (the next step's file is there, or it stopped changing), scored under the
    checkpoint that sampled it; the numbers of `scan RUN` on the finished run."""
    from collapsecheck.runs.run import score_run
    from collapsecheck.runs.watch import TrainerRollouts

    source = Path(__file__).parent / "fixtures" / "trl-grpo-completions"
    run, lines = tmp_path / "run", []
    for step in (2, 4):
        shutil.copytree(source / f"checkpoint-{step}", run / f"checkpoint-{step}")
    (run / "completions").mkdir()
    for step in (2, 4):
        name = f"completions_{step:05d}.parquet"
        shutil.copy(source / "completions" / name, run / "completions" / name)

    def trainer():  # the next step's completions land while the watch is running
        time.sleep(1.0)
        name = "completions_00006.parquet"
        shutil.copy(source / "completions" / name, run / "completions" / name)

    writing = threading.Thread(target=trainer)
    writing.start()
    watch = watcher(run, tmp_path / "cache", lines, idle=3.0, every_step=True)
    watch.traces = TrainerRollouts()
    watch.settings = Settings.build(device="cpu", bootstrap=100)
    assert watch.follow() == 0
    writing.join()
    said = "\n".join(lines)
    assert said.count("step 4: ") == 1 and "rollouts scored by checkpoint-2 (gap 1)" in said
    assert said.count("step 6: ") == 1 and "rollouts scored by checkpoint-4 (gap 1)" in said
    # TRL saves its arguments only as a pickle: scored at 1, said once for the whole watch
    assert said.count("nothing says the temperature these rollouts were sampled at") == 1
    assert "TRL samples at GRPOConfig.temperature, 1.0 by default" in said
    after = score_run(source, settings=watch.settings, cache_root=tmp_path / "after")
    expected = {s.checkpoint.label: s.report.metrics for s in after.steps}
    for step in watch.run_report().steps:
        assert step.report.metrics == expected[step.checkpoint.label], step.checkpoint.label


def reports_by_folder(watch: Watch) -> dict:
    return {unit.row.name: report for unit, report in watch.followed.done.values()}


def test_beside_a_real_trl_trainer_in_another_process(tmp_path):
    """TRL's GRPOTrainer saves checkpoint-2 and checkpoint-4 (its own save, trainer_state.json
    last) while the watch follows its output_dir from this process: each is diagnosed once,
    with the numbers a scan of the finished folder gives, and the watch ends at the DONE
    file the training script writes."""
    from collapsecheck import scan

    out, lines = tmp_path / "grpo", []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log, done = tmp_path / "training.log", tmp_path / "DONE"
    with log.open("w") as stream:  # a file, not a pipe: TRL's progress bars never block it
        training = subprocess.Popen(
            [sys.executable, "-m", "tests.trl_training_run", str(out), "4"], cwd=ROOT, env=env,
            stdout=stream, stderr=subprocess.STDOUT,
        )  # fmt: skip

        def trainer_ends():  # as the torchrun recipe does: `wait $TRAINER; touch DONE`
            training.wait(timeout=600)
            done.write_text("")

        ending = threading.Thread(target=trainer_ends)
        ending.start()
        watch = watcher(out, tmp_path / "cache", lines, idle=600.0, until=done, every_step=True)
        assert watch.follow() == 0
        ending.join()
    assert training.returncode == 0, log.read_text()[-3000:]
    said = "\n".join(lines)
    assert said.count("step 2: ") == 1 and said.count("step 4: ") == 1, said
    reports = reports_by_folder(watch)
    for name in ("checkpoint-2", "checkpoint-4"):
        alone = scan(out / name, PROMPTS, **FAST).metrics
        # the run report smooths the z-score's spread along the run (`_ema`): all else agrees
        assert unsmoothed(reports[name].metrics) == unsmoothed(alone), name


def unsmoothed(metrics: dict) -> dict:
    """The metrics but the run-smoothed ones, as text (so that NaN equals NaN)."""
    return {key: repr(value) for key, value in metrics.items() if "_ema" not in key}


def test_tensorboard_auto_takes_the_trainers_logging_dir_or_its_event_files(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    from collapsecheck.errors import CollapsecheckError
    from collapsecheck.reports.tensorboard import find_trainer_folder

    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(CollapsecheckError, match="no TensorBoard event files under"):
        find_trainer_folder(run)
    older, newer = run / "runs" / "a", run / "tensorboard_log" / "proj" / "exp"
    for folder in (older, newer):
        SummaryWriter(str(folder)).close()
        time.sleep(0.05)
    assert find_trainer_folder(run) == newer  # the one written last
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "named"))
    assert find_trainer_folder(run) == tmp_path / "named"


def test_verl_shards_are_read_once_the_tracker_names_their_step(tmp_path):
    """veRL's own FSDP shards (tests/fixtures/verl-0.9.1, written by its checkpoint manager)
    replayed half a file at a time into global_step_N/actor, then the run's
    latest_checkpointed_iteration.txt, as RayPPOTrainer._save_checkpoint writes it after the
    saves: each step is diagnosed once, only after the tracker names it (the settle rule,
    set to ten minutes here, never fires), with the numbers of the finished folder."""
    from collapsecheck import scan

    shards = Path(__file__).parent / "fixtures" / "verl-0.9.1" / "fsdp2" / "global_step_1"
    run, lines = tmp_path / "run", []
    tiny = {"k": 2, "num_prompts": 4, "max_new_tokens": 12, "whole_response": True,
            "device": "cpu", "bootstrap": 50}  # fmt: skip

    def trainer():
        for step in (1, 2):
            write_slowly(shards, run / f"global_step_{step}", pause=0.02)
            time.sleep(0.5)  # whole, but not yet named by the tracker: not read
            (run / VERL_TRACKER).write_text(str(step))

    writing = threading.Thread(target=trainer)
    writing.start()
    watch = watcher(run, tmp_path / "cache", lines, idle=3.0, settle=600.0, every_step=True)
    watch.settings = Settings.build(**tiny)
    assert watch.follow() == 0
    writing.join()
    said = "\n".join(lines)
    assert said.count("step 1: ") == 1 and said.count("step 2: ") == 1, said
    assert "step 2: template_collapse, from the results cache" in said  # the same weights
    expected = unsmoothed(scan(shards, PROMPTS, **tiny).metrics)
    for report in reports_by_folder(watch).values():
        assert unsmoothed(report.metrics) == expected


def test_a_bad_prompt_set_is_said_before_the_run_has_a_checkpoint(tmp_path):
    """No time lost: the run may be hours from its first checkpoint, the mistake is now."""
    from typer.testing import CliRunner

    from collapsecheck.cli import app

    started = time.monotonic()
    args = ["watch", str(tmp_path / "not-yet"), "-p", str(tmp_path / "missing.jsonl")]
    result = CliRunner().invoke(app, [*args, "--idle", "600"])
    assert result.exit_code == 2 and time.monotonic() - started < 60
    assert "prompt file not found" in result.output


def test_another_trainers_step_folders_are_scored_as_each_lands(tmp_path):
    """prime-rl's rollouts/step_N/ folders (tests/fixtures/trainer-dumps, written with
    verifiers' own records): step 5 once step 6's folder is there, step 6 once it stopped
    changing; each under the checkpoint of the policy version its episodes started under."""
    from collapsecheck.runs.watch import TrainerRollouts

    source = Path(__file__).parent / "fixtures" / "trainer-dumps" / "prime-rl" / "rollouts"
    run, lines = tmp_path / "run", []
    run.mkdir()
    (run / "step_3").symlink_to(HEALTHY, target_is_directory=True)
    shutil.copytree(source / "step_5", run / "rollouts" / "step_5")
    (run / "configs").mkdir()  # the `rl` launcher's resolved orchestrator config
    orchestrator = run / "configs" / "orchestrator.json"
    orchestrator.write_text(json.dumps({"train": {"sampling": {"temperature": 1.0}}}))

    def trainer():  # the next step's traces land while the watch is running (its `all/` only)
        time.sleep(1.0)
        shutil.copytree(
            source / "step_5" / "train" / "all", run / "rollouts" / "step_6" / "train" / "all"
        )

    writing = threading.Thread(target=trainer)
    writing.start()
    watch = watcher(run, tmp_path / "cache", lines, idle=3.0, every_step=True)
    watch.traces = TrainerRollouts()
    watch.settings = Settings.build(device="cpu", bootstrap=100)
    assert watch.follow() == 0
    writing.join()
    said = "\n".join(lines)
    for step in (5, 6):
        assert said.count(f"step {step}: ") == 1, said
    assert said.count("rollouts scored by step_3 (gap 0)") == 2, said
    read = f"rollouts sampled at temperature 1, as {orchestrator} (train.sampling.temperature) says"
    assert said.count(read) == 1, said


def test_the_watch_takes_the_run_scans_training_log_flags(tmp_path):
    from typer.testing import CliRunner

    from collapsecheck.cli import app

    run = tmp_path / "run"
    shutil.copytree(HEALTHY, run / "checkpoint-100")
    history = [{"step": 50, "reward": 0.25, "my/entropy": 0.4}, {"step": 100, "reward": 0.75}]
    state = {"global_step": 100, "log_history": history}
    (run / "checkpoint-100" / TRAINER_STATE).write_text(json.dumps(state))
    (tmp_path / "done").write_text("")
    common = ["watch", str(run), *FAST_FLAGS, "--out", str(tmp_path / "cache"), "--until",
              str(tmp_path / "done"), "--idle", "5", "--poll", "0.2",
              "--fail-on", "none"]  # fmt: skip

    def watched(*flags):
        out = tmp_path / f"run-{len(flags)}.json"
        result = CliRunner().invoke(app, [*common, *flags, "--json", str(out)])
        assert result.exit_code == 0, result.output
        return json.loads(out.read_text())

    keyed = watched("--train-key", "entropy=my/entropy")
    assert keyed["training_log"]["keys"] == {"reward": "reward", "entropy": "my/entropy"}
    assert keyed["steps"][0]["training_log"]["reward"]["mean"] == pytest.approx(0.5)
    assert watched("--no-train-log")["training_log"] is None
