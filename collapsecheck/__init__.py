"""collapsecheck: detect template collapse in RL-trained LLM agents.

Samples K reasoning traces per prompt, cross-scores every trace under every prompt, and
reads mutual information, retrieval accuracy and conditional entropy into a regime verdict
(see SPEC.md and the RAGEN-2 paper, Wang et al., 2026).
"""

from collapsecheck.errors import CollapsecheckError
from collapsecheck.metrics import CrossLogProbs, Estimate, compute_metrics
from collapsecheck.reasoning import ReasoningSpec
from collapsecheck.report import Report
from collapsecheck.scan import scan, score
from collapsecheck.verdict import Thresholds, Verdict, decide
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
    "scan",
    "score",
]
