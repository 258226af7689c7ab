"""collapsecheck: detect template collapse in RL-trained LLM agents.

Samples K reasoning traces per prompt, cross-scores every trace under every prompt, and
reads mutual information, retrieval accuracy and conditional entropy into a regime verdict
(see SPEC.md and the RAGEN-2 paper, Wang et al., 2026).

The public names below are imported on first use (PEP 562): `import collapsecheck` and the
command line's start-up load no model library, numpy or scipy until a name that needs them is
asked for (docs/decisions.md, "Start-up").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from collapsecheck.version import __version__

if TYPE_CHECKING:
    from collapsecheck.engines.reasoning import ReasoningSpec
    from collapsecheck.errors import CollapsecheckError
    from collapsecheck.inputs.environments import load_environment
    from collapsecheck.measures.metrics import CrossLogProbs, Estimate, compute_metrics
    from collapsecheck.measures.verdict import Support, Thresholds, Verdict, decide
    from collapsecheck.reports.report import Report
    from collapsecheck.runs.diagnose import play, scan, score
    from collapsecheck.runs.run import scan_run, score_run

# public name -> the module that defines it
_EXPORTS = {
    "ReasoningSpec": "collapsecheck.engines.reasoning",
    "CollapsecheckError": "collapsecheck.errors",
    "load_environment": "collapsecheck.inputs.environments",
    "CrossLogProbs": "collapsecheck.measures.metrics",
    "Estimate": "collapsecheck.measures.metrics",
    "compute_metrics": "collapsecheck.measures.metrics",
    "Support": "collapsecheck.measures.verdict",
    "Thresholds": "collapsecheck.measures.verdict",
    "Verdict": "collapsecheck.measures.verdict",
    "decide": "collapsecheck.measures.verdict",
    "Report": "collapsecheck.reports.report",
    "play": "collapsecheck.runs.diagnose",
    "scan": "collapsecheck.runs.diagnose",
    "score": "collapsecheck.runs.diagnose",
    "scan_run": "collapsecheck.runs.run",
    "score_run": "collapsecheck.runs.run",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'collapsecheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [  # the names of _EXPORTS and the version (tests/test_startup.py holds them equal)
    "CollapsecheckError",
    "CrossLogProbs",
    "Estimate",
    "ReasoningSpec",
    "Report",
    "Support",
    "Thresholds",
    "Verdict",
    "__version__",
    "compute_metrics",
    "decide",
    "load_environment",
    "play",
    "scan",
    "scan_run",
    "score",
    "score_run",
]
