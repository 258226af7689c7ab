"""Model backends: each implements `collapsecheck.backends.base.Backend`."""

from collapsecheck.backends.base import Backend, Sample, SamplingParams, ScoreRequest

__all__ = ["Backend", "Sample", "SamplingParams", "ScoreRequest"]
