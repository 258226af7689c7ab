"""These tests need vLLM: `make test-vllm` installs its CPU build in an environment of its own
(.venv-vllm) and runs them there. Anywhere vLLM is missing they are reported as skipped."""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-vllm`")
