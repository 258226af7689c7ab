"""The rollout dumps of trainers that do not install here, each written as its own code writes
it (scripts/make_trainer_dumps.py, which names the source file and commit it follows), read by
`score` and checked against a plain forward pass of the same token ids: one batch sampled from
the demo policy, written the way each trainer writes it."""

import json
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.rollouts import RolloutOptions, parse_rollouts
from collapsecheck.inputs.safe_load import load_pickle, load_torch
from collapsecheck.inputs.trainer_rollouts import rollout_files, trainer_rollouts
from tests.conftest import HEALTHY, PROMPTS, ROOT

DUMPS = ROOT / "tests" / "fixtures" / "trainer-dumps"
BATCH = json.loads((DUMPS / "batch.json").read_text())
SLIME = DUMPS / "slime" / "rollout_data"


def score(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "collapsecheck", "score", *map(str, args), "--fail-on", "none"],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(HEALTHY, dtype=torch.float32).eval()


def plain_logprob(model, context: list[int], continuation: list[int]) -> float:
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
    picked = logprobs[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
    return float(picked[len(context) - 1 :].sum())


def check_against_plain_forward(dump, model, rows_checked=(0, 3, -1)):
    """For a few rows, the entries of the dump's matrix under the trace's own prompt and under
    another scored one equal a plain forward pass of the trace's reasoning under that
    column's prompt ids (1e-4 nats)."""
    prompts = [json.loads(line)["ids"] for line in (dump / "prompts.jsonl").open()]
    traces = [json.loads(line) for line in (dump / "traces.jsonl").open()]
    with np.load(dump / "cross_logprobs.npz") as npz:
        matrix, rows = npz["sum"], npz["row_trace_index"]
    for r in rows_checked:
        trace = traces[rows[r]]
        own = trace["prompt_index"]
        other = next(j for j in range(len(prompts)) if j != own and np.isfinite(matrix[r, j]))
        for j in (own, other):
            expected = plain_logprob(
                model, prompts[j] + trace["prefix_ids"], trace["reasoning_ids"]
            )
            assert abs(matrix[r, j] - expected) < 1e-4, (r, j, matrix[r, j], expected)
    return prompts, traces


def sampled_exactly(prompts, traces):
    """The dump scored the ids the batch sampled: its prompts' ids and each response's ids
    (the stop token dropped, as sampling drops it)."""
    assert prompts == [group["ids"] for group in BATCH]
    for trace in traces:
        sampled = BATCH[trace["prompt_index"]]["responses"][trace["sample_index"]]
        assert trace["response_ids"] == sampled[: len(trace["response_ids"])]
        assert len(sampled) - len(trace["response_ids"]) in (0, 1)


# -- slime -----------------------------------------------------------------------------------


def test_slimes_rollout_dump_is_scored_as_the_ids_it_sampled(tmp_path, model):
    result = score(SLIME / "3.pt", "-c", HEALTHY, "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "slime rollout 3: 24 samples" in said and "weights of iter_2" in said
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["counts"]["prompts"] == len(BATCH)
    assert report["settings"]["trainer_rollouts"]["step"] == 3
    assert report["snr"]["rewards"] == "rollouts, per response"
    sampled_exactly(*check_against_plain_forward(tmp_path, model))


def test_slimes_dict_reward_aborted_samples_and_evaluation_dump():
    read = trainer_rollouts(SLIME / "4.pt")
    assert read.trainer == "slime" and read.step == 4 and len(read.rows) == len(BATCH) * 4 - 1
    assert "left out 1 aborted sample(s)" in " ".join(read.notes)
    assert "'score' is read unless --reward-field KEY" in " ".join(read.notes)
    assert {r["score"] for _, r, _ in read.rows} <= {-1.0, 1.0}
    evaluation = trainer_rollouts(SLIME / "eval_3.pt")
    assert evaluation.step is None and "weights of iter_3" in evaluation.notes[0]
    groups = parse_rollouts(SLIME / "eval_3.pt", RolloutOptions()).groups
    assert len(groups) == len(BATCH)  # grouped by the prompt's ids: no group_index in evals


def test_a_slime_folder_lists_training_rollouts_paired_with_the_iteration_before():
    files = rollout_files(SLIME)
    assert [(f.step, f.policy_step, f.trainer) for f in files] == [(3, 2, "slime"), (4, 3, "slime")]


# -- reading dumps as data, never as code ----------------------------------------------------


class RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.marker)],))


def test_a_dump_that_would_run_a_command_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    pickled, saved = tmp_path / "global_step_1_training_input.pkl", tmp_path / "rollout_data"
    pickled.write_bytes(pickle.dumps({"samples": [RunsACommand(marker)]}))
    saved.mkdir()
    torch.save({"rollout_id": 1, "samples": [RunsACommand(marker)]}, saved / "1.pt")
    with pytest.raises(CollapsecheckError, match=r"needs subprocess\.call to be read"):
        load_pickle(pickled)
    with pytest.raises(CollapsecheckError, match=r"needs \w+\.call to be read"):
        load_torch(saved / "1.pt")  # named as torch's pickler wrote it
    result = score(saved / "1.pt", "-c", HEALTHY)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{saved / '1.pt'}: the file needs " in " ".join(result.stderr.split())
    assert not marker.exists()


# -- SkyRL -----------------------------------------------------------------------------------

SKYRL_EVALS = DUMPS / "skyrl" / "dumped_evals"


def test_skyrls_evaluation_step_folder_is_scored_as_the_context_it_decoded(tmp_path, model):
    step = SKYRL_EVALS / "global_step_2_evals"
    result = score(step, "-c", HEALTHY, "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "SkyRL evaluation of step 2 (gridworld_far, gridworld_near): 24 samples" in said
    # the far source's per-token score lists sum to the sample's reward
    table = [json.loads(line) for line in (tmp_path / "per_prompt.jsonl").open()]
    rewards = [row["reward_mean"] for row in table]
    assert all(0.0 <= reward <= 1.0 for reward in rewards) and max(rewards) > 0
    prompts, traces = check_against_plain_forward(tmp_path, model)
    # sorted by file name: far (the last three prompts) before near
    order = [3, 4, 5, 0, 1, 2]
    assert prompts == [BATCH[i]["ids"] for i in order]
    for trace in traces:
        sampled = BATCH[order[trace["prompt_index"]]]["responses"][trace["sample_index"]]
        assert trace["response_ids"] == sampled[: len(trace["response_ids"])]


def test_skyrls_evaluations_pair_with_the_checkpoint_of_their_own_step():
    (found,) = rollout_files(SKYRL_EVALS)
    assert (found.step, found.policy_step, found.trainer) == (2, 2, "skyrl")
    one = trainer_rollouts(SKYRL_EVALS / "global_step_2_evals" / "gridworld_near.jsonl")
    assert len(one.rows) == 12 and all(r["rendered"] for _, r, _ in one.rows)


# -- RAGEN -----------------------------------------------------------------------------------

RAGEN = DUMPS / "ragen" / "val_rollouts_20261125_101500.jsonl"


def test_ragens_trajectories_are_scored_turn_by_turn_in_their_saved_context(tmp_path, model):
    from transformers import AutoTokenizer

    result = score(RAGEN, "-c", HEALTHY, "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "RAGEN trajectories: 12 trajectories, 24 turns" in said
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["settings"]["multi_turn"]["pairs"] == 24
    # RAGEN's own writer (scripts/make_ragen_trajectories.py) writes total_reward 0 throughout
    assert "every trajectory's total_reward is 0, so none is read as a reward" in said
    assert report["snr"] is None
    prompts, _ = check_against_plain_forward(tmp_path, model)
    tokenizer = AutoTokenizer.from_pretrained(HEALTHY)
    rows = [json.loads(line) for line in RAGEN.open()]

    def rendered(messages):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])

    contexts = {rendered(row["messages"][:i]) for row in rows for i in (1, 3)}
    assert {tuple(p) for p in prompts} == contexts  # each turn in the conversation before it


def test_ragens_total_rewards_are_each_trajectorys_reward_when_written(tmp_path):
    rows = [json.loads(line) for line in RAGEN.open()]
    for n, row in enumerate(rows):
        row["metadata"]["total_reward"] = float(n % 3)
    path = tmp_path / "val_rollouts_fixed.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    read = trainer_rollouts(path)
    assert [row["reward"] for _, row, _ in read.rows] == [float(n % 3) for n in range(len(rows))]
    assert not any("total_reward is 0" in note for note in read.notes)


def test_ragens_pickled_dataproto_is_refused_naming_the_converter(tmp_path):
    pickled = tmp_path / "val_rollouts.pkl"
    pickled.write_bytes(pickle.dumps({"batch": None}))
    result = score(pickled, "-c", HEALTHY)
    assert result.returncode == 2 and "scripts/convert_to_jsonl.py" in result.stderr


SKYRL_BATCHES = DUMPS / "skyrl" / "dumped_data"


@pytest.mark.parametrize("step", [2, 3])  # skyrl-train 0.3.1's pickle, and skyrl 0.4.0's
def test_skyrls_training_batch_pickle_is_read_as_data_and_scored_as_its_ids(tmp_path, model, step):
    """Written by SkyRL's own TrainingInputBatch.save (scripts/make_skyrl_batches.py); step 3
    is padded with two rows, which are left out."""
    path = SKYRL_BATCHES / f"global_step_{step}_training_input.pkl"
    result = score(path, "-c", HEALTHY, "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert f"SkyRL training batch of step {step}: 24 responses" in said
    sampled_exactly(*check_against_plain_forward(tmp_path, model))
    slime = tmp_path / "slime"
    assert score(SLIME / "3.pt", "-c", HEALTHY, "--dump", slime).returncode == 0
    with (
        np.load(tmp_path / "cross_logprobs.npz") as ours,
        np.load(slime / "cross_logprobs.npz") as theirs,
    ):
        assert np.array_equal(ours["sum"], theirs["sum"], equal_nan=True)  # the same ids, two ways


# -- prime-rl --------------------------------------------------------------------------------

PRIME_STEP = DUMPS / "prime-rl" / "rollouts" / "step_5"


def test_prime_rls_step_folder_is_scored_as_the_ids_its_traces_recorded(tmp_path, model):
    result = score(PRIME_STEP, "-c", HEALTHY, "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "prime-rl traces of step 5 (train/effective/traces.jsonl): 24 traces" in said
    assert "v3 (24); 1 of 24 episodes spanned more than one version" in said
    sampled_exactly(*check_against_plain_forward(tmp_path, model))


def test_prime_rls_all_subset_leaves_errored_episodes_out_and_groups_interleaved_lines():
    read = trainer_rollouts(PRIME_STEP / "train" / "all" / "traces.jsonl")
    assert len(read.rows) == 24 and "left out 1 errored episode(s)" in read.notes[-1]
    groups = {}
    for _, row, _ in read.rows:
        groups.setdefault(row["group"], set()).add(tuple(row["prompt_ids"]))
    assert len(groups) == len(BATCH) and all(len(ids) == 1 for ids in groups.values())
    (found,) = rollout_files(DUMPS / "prime-rl" / "rollouts")
    assert (found.step, found.policy_step, found.trainer) == (5, 3, "prime-rl")  # started at v3


# -- their checkpoints -----------------------------------------------------------------------


def layout(root, files):
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    return root


@pytest.mark.parametrize(
    "files, folder, says",
    [
        ([".metadata", "common.pt", "__0_0.distcp", "metadata.json"], "iter_0000099",
         "a Megatron torch_dist checkpoint (slime's --save iter_NNNNNNN/): convert it with "
         "slime's tools/convert_torch_dist_to_hf.py"),
        (["latest_checkpointed_iteration.txt", "iter_0000099/.metadata"], "save",
         "slime's (Megatron's) --save folder"),
        (["mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
          "metric.json"], "_actor/global_step20",
         "a DeepSpeed checkpoint (OpenRLHF's _actor/global_stepN/): write Hugging Face weights "
         "with `python zero_to_fp32.py"),
        (["_actor/latest", "_actor/zero_to_fp32.py", "_actor/global_step20/metric.json"],
         "checkpoints_ppo_ray", "OpenRLHF's checkpoint folder (DeepSpeed states in _actor/)"),
        (["trainer/.metadata", "trainer/__0_0.distcp", "orchestrator/progress.pt"], "step_40",
         "a prime-rl trainer checkpoint"),
    ],
)  # fmt: skip
def test_a_trainers_checkpoint_folder_that_is_not_hugging_face_says_what_to_run(
    tmp_path, files, folder, says
):
    path = layout(tmp_path / folder, files)
    result = subprocess.run(
        [sys.executable, "-m", "collapsecheck", "scan", str(path), "-p", str(PROMPTS)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stderr
    assert says in said and "no checkpoint here" not in said and "Traceback" not in said


# -- ROLL ------------------------------------------------------------------------------------

ROLL = DUMPS / "roll" / "rollout_dump_data.step_7.jsonl"


def test_rolls_column_dump_is_scored_in_each_responses_chat(tmp_path, model):
    result = score(ROLL, "-c", HEALTHY, "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "ROLL rollouts of step 7: 24 responses, each in its messages" in said
    # the messages rendered by the chat template are the contexts the batch was sampled in
    sampled_exactly(*check_against_plain_forward(tmp_path, model))
    (found,) = rollout_files(ROLL.parent)
    assert (found.step, found.policy_step, found.trainer) == (7, 6, "roll")


# -- AReaL -----------------------------------------------------------------------------------

AREAL = DUMPS / "areal" / "rollout"


def test_areals_version_folder_is_scored_and_says_what_its_versions_cannot_tell(tmp_path, model):
    result = score(AREAL / "4", "-c", HEALTHY, "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "AReaL rollout of version 4: 12 samples of 3 prompts" in said
    assert "the share of samples no single checkpoint sampled is unknown" in said
    prompts, _ = check_against_plain_forward(tmp_path, model)
    assert prompts == [BATCH[g]["ids"] for g in (0, 2, 1)]  # files 0.jsonl (0, 2), 1.jsonl (1)
    files = rollout_files(AREAL)
    assert [(f.step, f.policy_step, f.trainer) for f in files] == [(4, 3, "areal"), (5, 4, "areal")]


def test_rolls_agentic_trajectories_are_scored_turn_by_turn(tmp_path, model):
    path = DUMPS / "roll-agentic" / "rollout_dump_data.step_7.jsonl"
    result = score(path, "-c", HEALTHY, "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "ROLL agentic trajectories of step 7: 12 trajectories, 24 turns" in said
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["snr"]["rewards"] == "rollouts, per trajectory"
    prompts, _ = check_against_plain_forward(tmp_path, model)
    first_turns = {tuple(p) for p in prompts} & {tuple(group["ids"]) for group in BATCH}
    assert len(first_turns) == len(BATCH)  # each first turn in the context it was sampled in


# -- verl-agent ------------------------------------------------------------------------------


def test_verl_agents_step_rows_are_read_as_turns_and_its_copies_said():
    read = trainer_rollouts(DUMPS / "verl-agent" / "3.jsonl")
    assert read.trainer == "verl" and len(read.rows) == 25
    assert read.notes[0].startswith("1 row(s) repeat an earlier row exactly")
    inputs = {row["prompt"] for _, row, _ in read.rows}
    assert len(inputs) == 12  # the first steps of a group share their input; later ones differ
    assert sum(i.startswith("prior to this step") for i in inputs) == len(BATCH)


# -- a run's own dumps, paired with the checkpoint that sampled each step --------------------


def scan_run(*args):
    return subprocess.run(
        [sys.executable, "-m", "collapsecheck", "scan", *map(str, args), "--fail-on", "none"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_scan_run_finds_prime_rls_rollouts_beside_and_pairs_each_step(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for step in (3, 4):  # the samples of step 5 started under version 3: checkpoint step_3
        (run / f"step_{step}").symlink_to(HEALTHY, target_is_directory=True)
    shutil.copytree(DUMPS / "prime-rl" / "rollouts", run / "rollouts")
    result = scan_run(run, "--json", tmp_path / "run.json")
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "the trainer's own rollouts (prime-rl" in said
    (step,) = json.loads((tmp_path / "run.json").read_text())["steps"]
    assert step["rollouts"]["checkpoint"] == "step_3" and step["rollouts"]["gap"] == 0


def test_scan_run_with_areals_version_folders_pairs_version_v_with_step_v_minus_one(tmp_path):
    run = tmp_path / "checkpoints"
    run.mkdir()
    for step in (3, 4):  # AReaL's own checkpoint names
        (run / f"epoch0epochstep{step}globalstep{step}").symlink_to(
            HEALTHY, target_is_directory=True
        )
    result = scan_run(run, "--rollouts", AREAL, "--json", tmp_path / "run.json")
    assert result.returncode == 0, result.stderr
    steps = json.loads((tmp_path / "run.json").read_text())["steps"]
    paired = [
        (s["rollouts"]["step"], s["rollouts"]["checkpoint_step"], s["rollouts"]["gap"])
        for s in steps
    ]
    assert paired == [(4, 3, 0), (5, 4, 0)]


def test_areals_older_text_dumps_are_read_record_by_record(tmp_path, model):
    folder = DUMPS / "areal-0.5" / "generated" / "2"
    result = score(folder, "-c", HEALTHY, "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert (
        "AReaL generated of version 2 (text dumps, before v0.5.2): 24 samples of 6 prompts" in said
    )
    sampled_exactly(*check_against_plain_forward(tmp_path, model))
    broken = tmp_path / "generated" / "2"
    broken.mkdir(parents=True)
    (broken / "q.txt").write_text((folder / "grid-0.txt").read_text()[:-40])
    cut = score(broken, "-c", HEALTHY)
    assert cut.returncode == 2 and "not an AReaL record" in cut.stderr


def test_areal_samples_whose_head_version_is_set_and_older_are_counted(tmp_path):
    folder = tmp_path / "rollout" / "6"
    folder.mkdir(parents=True)
    lines = (AREAL / "5" / "1.jsonl").read_text().splitlines()[:4]
    rows = [json.loads(line) | {"head_version": head, "tail_version": 6}
            for line, head in zip(lines, [5, -1, 6, 5], strict=True)]  # fmt: skip
    (folder / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = trainer_rollouts(folder)
    assert read.notes[1].startswith("2 sample(s) record tokens of an older version than 6")


def test_score_of_a_folder_of_steps_says_to_score_one_step_or_scan_the_run():
    result = score(SLIME, "-c", HEALTHY)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and f"{SLIME}: a folder of slime rollout steps (2)" in said
    assert f"--rollouts {SLIME}" in said


def test_a_run_holding_two_rollout_folders_reads_one_and_names_the_other(tmp_path):
    from collapsecheck.runs.pairing import find_run_rollouts

    shutil.copytree(SKYRL_EVALS, tmp_path / "dumped_evals")
    shutil.copytree(SKYRL_BATCHES, tmp_path / "dumped_data")
    found = find_run_rollouts(tmp_path, None)
    assert found.folder == tmp_path / "dumped_evals" and found.others == (tmp_path / "dumped_data",)
    assert f"also in the run, not read: {tmp_path / 'dumped_data'}" in found.describe()


# -- a vision run's slime dump ---------------------------------------------------------------

VISION_POLICY = ROOT / "examples" / "checkpoints" / "vision" / "grounded"


def test_slimes_vision_dump_reads_its_images_and_scores_as_the_scan_that_sampled_it(tmp_path):
    """The dump holds a scan's samples of the vision demo policy (make_trainer_dumps.py's
    write_vision_batch), written by slime's own code with the raw PIL images: read as data,
    each image's expanded tokens back in its slot, it scores exactly as that scan did."""
    import collapsecheck

    scanned, scored = tmp_path / "scan", tmp_path / "score"
    collapsecheck.scan(
        VISION_POLICY, ROOT / "examples" / "prompts" / "visual-gridworld.jsonl", dump=scanned,
        num_prompts=4, k=2, max_new_tokens=24, device="cpu", bootstrap=50,
    )  # fmt: skip
    result = score(DUMPS / "slime-vision" / "rollout_data" / "6.pt", "-c", VISION_POLICY,
                   "--dump", scored)  # fmt: skip
    assert result.returncode == 0, result.stderr
    ours = [json.loads(line) for line in (scored / "prompts.jsonl").open()]
    theirs = [json.loads(line) for line in (scanned / "prompts.jsonl").open()]
    assert [p["ids"] for p in ours] == [p["ids"] for p in theirs]
    assert [[i["sha256"] for i in p["images"]] for p in ours] == [
        [i["sha256"] for i in p["images"]] for p in theirs
    ]  # the PNG made of the pickled pixels is the board's own file, byte for byte
    with np.load(scored / "cross_logprobs.npz") as a, np.load(scanned / "cross_logprobs.npz") as b:
        assert np.allclose(a["sum"], b["sum"], atol=1e-5, equal_nan=True)


def test_a_scans_dump_in_a_folder_named_like_a_step_is_still_a_dump(tmp_path):
    """Its traces.jsonl is not prime-rl's (that sits at step_N/{train,eval}/{subset}/)."""
    import collapsecheck

    dump = tmp_path / "step_5"
    collapsecheck.scan(HEALTHY, PROMPTS, dump=dump, num_prompts=3, k=2, max_new_tokens=24,
                       device="cpu", bootstrap=50)  # fmt: skip
    assert trainer_rollouts(dump / "traces.jsonl") is None
    result = score(dump, "-c", HEALTHY)
    assert result.returncode == 0, result.stderr
