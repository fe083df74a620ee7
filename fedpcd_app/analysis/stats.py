"""Statistics a reviewer accepts: paired confidence intervals, Holm's correction, sign tests,
and a checker of a results page's wording against them.

* :func:`paired_ci` — the mean of per-seed differences with its two-sided t-based confidence
  interval, ``mean ± t_{n−1, 1−(1−level)/2} · s / √n`` (s the sample std, ddof = 1).
* :func:`effect_size` — Cohen's d_z of paired differences, ``mean / s``.
* :func:`holm` — Holm's step-down adjusted p-values over one family of comparisons:
  sorted ascending p_(1) ≤ … ≤ p_(m), ``p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j))``.
  A comparison is *significant* at level a only when its adjusted p is below a.
* :func:`sign_test_p` — the two-sided exact sign test of "k of n seeds better": 5/5 seeds is
  p = 2 · 2⁻⁵ = 0.0625, so "better on every seed" of five seeds is not a significant result.
* :func:`check_wording` — the sentences of a results page (markdown) that claim significance
  or a win "on every seed" / "k/k seeds" without naming a corrected test (Holm) in the same
  sentence; the report's ``--check-wording PAGE.md`` prints them labelled *exploratory*.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence

import numpy as np

ALPHA = 0.05  # the level "significant" refers to, after the correction


def paired_ci(diffs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the per-seed differences: the t-based two-sided interval at
    ``level``; the bounds are NaN with fewer than 2 differences, equal to the mean without spread."""
    from scipy import stats

    if not 0 < level < 1:
        raise ValueError(f"confidence level {level} must lie in (0, 1), e.g. 0.95")
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(d.mean())
    if d.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1)) * float(d.std(ddof=1)) / math.sqrt(d.size)
    return mean, mean - half, mean + half


def has_spread(diffs: Sequence[float]) -> bool:
    """At least 2 differences that differ by more than round-off (1e-12 relative): the
    t-test and d_z are defined (equal differences up to float noise give none, not p ≈ 0)."""
    d = np.asarray(diffs, dtype=np.float64)
    return d.size >= 2 and float(np.ptp(d)) > 1e-12 * max(1.0, float(np.abs(d).max()))


def effect_size(diffs: Sequence[float]) -> float:
    """Cohen's d_z = mean / sample std of paired differences (NaN: < 2 seeds or no spread)."""
    d = np.asarray(diffs, dtype=np.float64)
    return float(d.mean()) / float(d.std(ddof=1)) if has_spread(d) else math.nan


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values, in the input order; NaN entries (undefined tests) stay NaN
    and are not counted in the family size."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, math.nan)
    idx = [i for i in range(p.size) if not math.isnan(p[i])]
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: p[i])):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        out[i] = running
    return out.tolist()


def sign_test_p(wins: int, n: int) -> float:
    """Two-sided exact sign test of ``wins`` successes in ``n`` (ties already dropped)."""
    if n <= 0:
        return math.nan
    k = max(wins, n - wins)
    tail = sum(math.comb(n, j) for j in range(k, n + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def ttest_p(diffs: Sequence[float]) -> float:
    """Two-sided paired t-test p-value (one-sample t-test of the differences against 0);
    NaN with fewer than 2 differences or no spread."""
    from scipy import stats

    d = np.asarray(diffs, dtype=np.float64)
    if not has_spread(d):
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.ttest_1samp(d, 0.0).pvalue)


# -- wording -------------------------------------------------------------------------------
# a claim: significance, or a win counted over seeds ("on every seed", "all 5 seeds", "5/5 seeds")
CLAIM = re.compile(r"significan|\bon (?:every|each|all) seeds?\b|\bevery seed\b|\ball (?:\d+|three|five|ten) "
                   r"(?:paired )?seeds\b|\b(\d+)\s*/\s*\1 (?:paired )?seeds\b|\b(\d+) of \2 seeds\b", re.I)
# the sentence names the corrected test it rests on
CORRECTED = re.compile(r"\bholm\b|p_holm|p_?\{?holm|corrected", re.I)
# the sentence denies or qualifies the claim
NEGATED = re.compile(r"\b(?:not|no|none|nor|never|without)\b[^.]{0,40}significan|\bnon-?significan|"
                     r"\binsignifican|exploratory|sign test|p\s*=\s*0\.0625", re.I)


def sentences(text: str) -> list[tuple[int, str]]:
    """(line number where it starts, sentence) of a markdown page: code blocks, indented
    code and table rows skipped."""
    paragraphs, in_code, buf = [], False, []
    for no, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code or line.startswith("    ") or line.lstrip().startswith("|") or not line.strip():
            if buf:
                paragraphs.append(buf)
                buf = []
            continue
        buf.append((no, line.strip()))
    if buf:
        paragraphs.append(buf)
    out = []
    for para in paragraphs:
        joined, starts = "", []  # starts: (offset in joined, line number)
        for no, line in para:
            starts.append((len(joined), no))
            joined += line + " "
        pos = 0
        for piece in re.split(r"(?<=[.!?])\s+(?=[A-Z*(\[])", joined):
            at = joined.index(piece, pos)
            pos = at + len(piece)
            if piece.strip():
                out.append((max(n for off, n in starts if off <= at), piece.strip()))
    return out


def check_wording(text: str) -> list[tuple[int, str]]:
    """The sentences (line number of their paragraph, sentence) that claim significance or
    a win on every seed without a corrected test (Holm) named in the same sentence: to be
    worded as exploratory."""
    return [(no, s) for no, s in sentences(text)
            if CLAIM.search(s) and not CORRECTED.search(s) and not NEGATED.search(s)]
