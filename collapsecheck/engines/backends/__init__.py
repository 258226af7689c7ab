"""Model backends: each implements `collapsecheck.engines.backends.base.Backend`."""

from collapsecheck.engines.backends.base import Backend, Sample, SamplingParams, ScoreRequest

__all__ = ["Backend", "Sample", "SamplingParams", "ScoreRequest"]
