"""collapsecheck: detect template collapse in RL-trained LLM agents.

Samples K reasoning traces per prompt, cross-scores every trace under every prompt, and
reads mutual information, retrieval accuracy and conditional entropy into a regime verdict
(see SPEC.md and the RAGEN-2 paper, Wang et al., 2026).
"""

from collapsecheck.engines.reasoning import ReasoningSpec
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments import load_environment
from collapsecheck.measures.metrics import CrossLogProbs, Estimate, compute_metrics
from collapsecheck.measures.verdict import Thresholds, Verdict, decide
from collapsecheck.reports.report import Report
from collapsecheck.runs.diagnose import play, scan, score
from collapsecheck.runs.run import scan_run, score_run
from collapsecheck.version import __version__

__all__ = [
    "CollapsecheckError",
    "CrossLogProbs",
    "Estimate",
    "ReasoningSpec",
    "Report",
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
