"""The shipped demo checkpoints land in their known regimes, in the order of degradation."""

import pytest

from collapsecheck import scan
from tests.conftest import EXAMPLES, PROMPTS

# checkpoint -> (regime, style, partial); the template share of each run step is in
# scripts/make_fixtures.py
KNOWN = {
    "demo-run/global_step_100": ("grounded", "diverse", False),
    "demo-run/global_step_200": ("grounded", "diverse", False),
    "demo-run/global_step_300": ("template_collapse", None, True),
    "demo-run/global_step_400": ("template_collapse", None, False),
    "demo-run/global_step_500": ("template_collapse", None, False),
    "checkpoints/grounded-compressed": ("grounded", "compressed", False),
    "checkpoints/low-entropy-collapse": ("low_entropy_collapse", None, False),
}
RUN_ORDER = [name for name in KNOWN if name.startswith("demo-run")]


@pytest.fixture(scope="session")
def demo_reports():
    return {
        name: scan(EXAMPLES / name, PROMPTS, k=8, num_prompts=16, max_new_tokens=64, device="cpu")
        for name in KNOWN
    }


@pytest.mark.parametrize("name", list(KNOWN))
def test_each_demo_checkpoint_gets_its_known_regime(demo_reports, name):
    verdict = demo_reports[name].verdict
    assert (verdict.regime, verdict.style, verdict.partial) == KNOWN[name], verdict.reason


def test_normalized_mi_falls_along_the_demo_run(demo_reports):
    values = [demo_reports[name].value("normalized_mi") for name in RUN_ORDER]
    assert values == sorted(values, reverse=True), values
    assert values[0] - values[-1] > 0.7


def test_template_collapse_keeps_entropy_high_and_echo_does_not(demo_reports):
    template = demo_reports["demo-run/global_step_500"]
    echo = demo_reports["checkpoints/low-entropy-collapse"]
    assert template.value("conditional_entropy_seq_est") > 3.0
    assert echo.value("conditional_entropy_seq_est") < 1.0
    assert template.value("distinct_reasoning_rate") > 0.8
    assert echo.value("distinct_reasoning_rate") < 0.3


def test_report_as_a_pandas_frame(demo_reports):
    frame = demo_reports["demo-run/global_step_100"].to_frame()
    assert list(frame.columns) == ["value", "low", "high"]
    assert frame.loc["normalized_mi", "value"] > 0.9
    assert frame.loc["normalized_mi", "low"] <= frame.loc["normalized_mi", "value"]
    assert frame.loc["mi_upper_bound", "value"] == pytest.approx(2.772588722239781)
