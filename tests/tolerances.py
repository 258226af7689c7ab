"""How closely two computations of the same float quantity must agree: derived once, here.

Two computations agree bit for bit only by construction: the same process and thread count,
the same inputs and kernels (a cache read back, a rerun in one process). Anything else rounds
its float32 sums in another order: another process (a Ray worker runs one BLAS thread),
another thread count, another CPU's vector width, another model class over the same weights
(Qwen3.5-MoE's two classes dispatch their experts differently), another batch or kernel.
docs/development.md "Comparing floats" says which tests use which.

- A log-probability (or a logit) from a float32 forward pass of a tiny model is the end of
  some hundred float32 roundings (eps 1.2e-7) of values of order 1: the hidden size's dot
  products, attention's softmax, the vocabulary's log-sum-exp. Two orders of them agree within
  `LOGPROB_ATOL` nats a token, the exactness docs/decisions.md states and
  tests/test_logit_head.py holds the two scorers to against a plain forward pass.
- A trace's log-probability is a sum of at most T tokens' (`sequence_atol`).
- Every report metric is a mean, a log-mean-exp, a quantile of bootstrap means or a difference
  of two of those over the cross-scoring matrix's entries, each moving the result by at most
  what its largest entry moves; so two reports agree within twice a trace's bound
  (`metric_atol`). Counted metrics (retrieval accuracy, rates) are exact unless two entries
  tie within that bound.
- A metric that divides by a spread of the entries (the z-scores divide each row's matched -
  marginal by its marginal_std + 1e-3) carries the quotient's relative error: the sum of its
  numerator's and denominator's, each within `metric_atol` of values of order one nat
  (`ratio_rtol`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

FLOAT32_EPS = float(np.finfo(np.float32).eps)
LOGPROB_ATOL = 1e-5  # nats a token (see above): about 100 roundings of FLOAT32_EPS


def sequence_atol(tokens: int) -> float:
    """Two float32 log-probabilities of one trace of at most `tokens` tokens, computed by two
    kernels or processes: each token's term within `LOGPROB_ATOL`."""
    return tokens * LOGPROB_ATOL


def metric_atol(tokens: int) -> float:
    """Two reports' metrics over the same traces of at most `tokens` tokens each, scored in two
    processes or with two thread counts: a difference of two statistics of the entries, each
    within `sequence_atol`."""
    return 2 * sequence_atol(tokens)


RATIO_METRICS = ("mi_zscore", "mi_zscore_seq")  # divided by a spread of the entries


def ratio_rtol(tokens: int) -> float:
    """Relative agreement of a ratio metric's two computations (module docstring)."""
    return 2 * metric_atol(tokens)


def assert_same_numbers(got: object, expected: object, tokens: int, where: str = "") -> None:
    """`got` equals `expected` in every key, string and count, and every float within
    `metric_atol(tokens)` (a ratio metric's within `ratio_rtol(tokens)` of its size; NaN where
    NaN): for reports computed in two processes over traces of at most `tokens` tokens."""
    if isinstance(expected, Mapping):
        assert isinstance(got, Mapping) and got.keys() == expected.keys(), where
        for key in expected:
            assert_same_numbers(got[key], expected[key], tokens, f"{where}.{key}")
    elif isinstance(expected, Sequence) and not isinstance(expected, str):
        assert isinstance(got, Sequence) and len(got) == len(expected), where
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_same_numbers(a, b, tokens, f"{where}[{index}]")
    elif isinstance(expected, float) and not isinstance(got, bool):
        assert isinstance(got, int | float), (where, got)
        ratio = any(f".{name}." in f"{where}." for name in RATIO_METRICS)
        atol, rtol = metric_atol(tokens), ratio_rtol(tokens) if ratio else 0.0
        same = (math.isnan(got) and math.isnan(expected)) or math.isclose(
            got, expected, rel_tol=rtol, abs_tol=atol
        )
        assert same, f"{where}: {got!r} vs {expected!r} (tolerance {atol:g}, relative {rtol:g})"
    else:
        assert got == expected, f"{where}: {got!r} vs {expected!r}"
