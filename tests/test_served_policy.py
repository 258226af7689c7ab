"""The policy where it is served (SPEC "The policy where it is served") without a server to
read: what a served scan refuses before any request, a URL where nothing listens or a server
that is not vLLM's (collapsecheck's own endpoint, served by uvicorn) in one line within
seconds, and the pieces read from a server's answers. Against a real vLLM server:
tests/vllm/test_served.py."""

from __future__ import annotations

import socket
import time

import pytest

from collapsecheck.engines.backends.served import position_logprob, served_sample
from collapsecheck.engines.backends.served_api import api_base, is_served
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.endpoint import Recorder, Serving, endpoint_app
from collapsecheck.runs.served_watch import seconds
from tests.conftest import PROMPTS
from tests.conftest import run_collapsecheck as collapsecheck

SCAN = ("-p", PROMPTS, "-n", "8", "-k", "4", "--max-new-tokens", "48", "--fail-on", "none")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_url_is_told_from_a_folder_and_read_as_a_base_url():
    assert is_served("http://h:8000/v1") and is_served("https://h/v1")
    assert not is_served("checkpoints/http") and not is_served(None)
    assert api_base("http://h:8000") == api_base("http://h:8000/v1/") == "http://h:8000/v1"
    assert [seconds(d) for d in ("30", "30s", "10m", "1.5h", "0s")] == [30, 30, 600, 5400, 0]
    for bad in ("soon", "-5s", "10d"):
        with pytest.raises(CollapsecheckError, match="a duration such as 30s"):
            seconds(bad)


def test_a_servers_choices_and_prompt_log_probabilities_are_read_by_token_id():
    """vLLM keeps the end-of-sequence token in a stopped choice's ids (no stop string): it is
    not part of the trace; a cut one is truncated; a position's entry is read by its token's
    id, and a missing one is one line."""
    stopped = {"token_ids": [5, 6, 1], "finish_reason": "stop", "stop_reason": None}
    assert served_sample(stopped).ids == (5, 6) and not served_sample(stopped).truncated
    cut = {"token_ids": [5, 6], "finish_reason": "length", "stop_reason": None}
    assert served_sample(cut).ids == (5, 6) and served_sample(cut).truncated
    with pytest.raises(CollapsecheckError, match="no token ids"):
        served_sample({"token_ids": None, "finish_reason": "stop"})
    entry = [None, {"6": {"logprob": -1.5, "rank": 3}, "42": {"logprob": -0.1, "rank": 1}}]
    assert position_logprob(entry, [3, 6], 1) == -1.5
    with pytest.raises(CollapsecheckError, match="no prompt log-probability for token 7"):
        position_logprob(entry, [3, 7], 1)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--temperature", "0.7"), "scored at temperature 1 only"),
        (("--rollouts", "r.jsonl"), "--rollouts needs a checkpoint's files"),
        (("--backend", "transformers"), "sampled and scored by its server"),
    ],
)
def test_what_a_served_scan_cannot_do_is_one_line_before_any_request(args, said, tmp_path):
    """Refused before any request: no server listens on the port, and the line is the
    refusal's, not a connection's."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = collapsecheck("scan", url, *SCAN, *args, "--json", tmp_path / "r.json")
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "r.json").exists()


def test_a_server_that_cannot_serve_is_one_line_within_seconds(tmp_path):
    """Nothing listening, and a server that is not vLLM's (collapsecheck's own endpoint: no
    /version, no prompt log-probabilities): one line each, exit 2, nothing written, without
    the retries a scan under way gets."""
    nobody = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    done = collapsecheck("scan", nobody, *SCAN, "--json", tmp_path / "r.json")
    assert done.returncode == 2 and "cannot reach the server" in done.stderr, done.stderr
    assert time.monotonic() - started < 30 and not (tmp_path / "r.json").exists()

    class Silent:
        name = "other"

        def answer(self, request):  # pragma: no cover - never reached: discovery stops first
            raise AssertionError("a request was answered")

    with Serving(endpoint_app(Silent(), Recorder())) as other:
        done = collapsecheck("scan", other.base_url, *SCAN, "--json", tmp_path / "r.json")
    assert done.returncode == 2 and "not a vLLM server" in done.stderr, done.stderr
    assert not (tmp_path / "r.json").exists()


def test_watch_every_goes_with_a_url_and_a_url_with_every(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    without = collapsecheck("watch", url, *SCAN)
    assert without.returncode == 2 and "--every DURATION goes with" in without.stderr
    folder = collapsecheck("watch", tmp_path, "--every", "10m", *SCAN)
    assert folder.returncode == 2 and "is a run directory" in folder.stderr
    unreadable = collapsecheck("watch", url, "--every", "soon", *SCAN)
    assert unreadable.returncode == 2 and "a duration such as 30s" in unreadable.stderr
