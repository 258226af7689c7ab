"""A bounded fuzz run of the input parsers: whatever the bytes or the JSON, a parser returns or
raises CollapsecheckError (one clear line), never another exception."""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collapsecheck.config import find_config, gate_from_table
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import load_prompts
from collapsecheck.inputs.rollouts import RolloutOptions, read_rollouts
from collapsecheck.reports.report import Report

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
KNOWN_KEYS = [
    *("prompt", "messages", "response", "role", "content", "uid", "turns", "truncated"),
    *("verdict", "metrics", "regime", "partial", "reason", "value", "low", "high"),
    *("fail_on", "min", "max_drop", "entropy_low", "dependence_high", "thresholds"),
]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)
SUFFIXES = [".jsonl", ".txt", ".json", ".parquet", ""]


def parse_or_clear_error(parse, content: bytes, suffix: str):
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / f"input{suffix}"
        path.write_bytes(content)
        try:
            parse(path)
        except CollapsecheckError as error:
            assert str(error).strip() and "\n" not in str(error)


def json_lines(rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@FUZZ
@given(st.binary(max_size=300), st.sampled_from(SUFFIXES))
def test_prompt_files_from_random_bytes(content, suffix):
    parse_or_clear_error(load_prompts, content, suffix)


@FUZZ
@given(st.lists(JSON, max_size=5))
def test_prompt_files_from_random_json(rows):
    parse_or_clear_error(load_prompts, json_lines(rows), ".jsonl")


@FUZZ
@given(st.lists(JSON, max_size=5), st.sampled_from(["turn", "trajectory", "first"]))
def test_rollout_files_from_random_json(demo_tokenizer, rows, sampling):
    options = RolloutOptions(turn_sampling=sampling)
    parse_or_clear_error(
        lambda p: read_rollouts(p, demo_tokenizer, options), json_lines(rows), ".jsonl"
    )


@FUZZ
@given(st.binary(max_size=200))
def test_rollout_files_from_random_bytes(demo_tokenizer, content):
    parse_or_clear_error(
        lambda p: read_rollouts(p, demo_tokenizer, RolloutOptions()), content, ".jsonl"
    )


@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_config_files(content):
    def parse(path):
        gate_from_table(*find_config(path))

    parse_or_clear_error(parse, content, ".toml")


CONFIG_TABLES = st.dictionaries(
    st.sampled_from(
        ["fail_on", "min", "max_drop", "entropy_low", "dependence_high", "dependence_collapsed"]
    ),
    JSON | st.dictionaries(st.text(max_size=20), JSON, max_size=3),
    max_size=4,
)
METRIC = JSON | st.fixed_dictionaries({"value": JSON, "low": JSON, "high": JSON})
REPORTS = st.fixed_dictionaries(
    {
        "verdict": JSON
        | st.fixed_dictionaries(
            {"regime": JSON, "partial": JSON, "reason": JSON}, optional={"style": JSON}
        ),
    },
    optional={
        "metrics": JSON | st.dictionaries(st.text(max_size=8), METRIC, max_size=3),
        "thresholds": JSON | CONFIG_TABLES,
        "settings": JSON,
        "counts": JSON,
        "examples": JSON,
        "timing": JSON,
    },
)


@FUZZ
@given(CONFIG_TABLES)
def test_config_tables(table):
    try:
        gate_from_table(table, "collapsecheck.toml")
    except CollapsecheckError as error:
        assert "\n" not in str(error)


@FUZZ
@given(JSON | REPORTS)
def test_report_files(value):
    parse_or_clear_error(Report.load, json.dumps(value).encode(), ".json")


@pytest.mark.parametrize("content", [b"\xff\xfe", b"{}", b'{"verdict": {}}'])
def test_report_file_examples(content):
    parse_or_clear_error(Report.load, content, ".json")
