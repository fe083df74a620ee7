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
* :func:`tost_p` — paired equivalence (two one-sided t-tests) within a declared margin; a
  "tie" or "equivalent" rests on it, else a non-significant result is *inconclusive*.
* :func:`verdict` — the word a comparison may carry: fewer than :data:`MIN_SEEDS` paired seeds
  is "exploratory, n seeds" (no significance column), else significant / equivalent / inconclusive.
* :func:`sentences` — a results page's sentences (code, indented blocks and tables skipped), which
  the claim checker (:mod:`fedpcd_app.analysis.claims`, ``report --check-wording PAGE.md``) parses
  into claims and checks against each pair's row; :func:`_close` — a number as cited (its decimals)
  against a value. (The word-level checker of issue 42 is gone: issue 52 found that it read words,
  not claims.)
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence

import numpy as np

ALPHA = 0.05  # the level "significant" refers to, after the correction
MIN_SEEDS = 5  # paired seeds a comparison needs before it may be called significant (fewer: exploratory)


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


def tost_p(diffs: Sequence[float], margin: float) -> float:
    """Paired two one-sided tests (TOST) of equivalence within ``±margin``: the larger of the
    one-sided t-test p-values of H0 mean ≤ −margin and H0 mean ≥ +margin (``scipy.stats.ttest_1samp``
    with ``alternative``); below :data:`ALPHA`, the difference lies within the margin. NaN with
    fewer than 2 differences, no spread or no margin (> 0)."""
    from scipy import stats

    d = np.asarray(diffs, dtype=np.float64)
    if not has_spread(d) or not margin > 0:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        low = float(stats.ttest_1samp(d, -margin, alternative="greater").pvalue)
        high = float(stats.ttest_1samp(d, margin, alternative="less").pvalue)
    return max(low, high)


def verdict(n: int, p_holm: float, tost: float = math.nan) -> str:
    """The one word a comparison may be given: ``exploratory, n seeds`` below :data:`MIN_SEEDS`
    paired seeds (no significance is claimed), else ``significant`` (Holm-adjusted p below
    :data:`ALPHA`), ``equivalent`` (the TOST p below it at the declared margin), or
    ``inconclusive`` (neither: the interval says how little is known)."""
    if n < MIN_SEEDS:
        return f"exploratory, {n} seed{'' if n == 1 else 's'}"
    if not math.isnan(p_holm) and p_holm < ALPHA:
        return "significant"
    if not math.isnan(tost) and tost < ALPHA:
        return "equivalent"
    return "inconclusive"


# -- pages: sentences and cited numbers (fedpcd_app.analysis.claims reads them) ------------------------
def sentences(text: str) -> list[tuple[int, str]]:
    """(line number where it starts, sentence) of a markdown page: code blocks, indented
    code and table rows skipped; a list item starts a new sentence."""
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
        if re.match(r"\s*(?:[-*+]|\d+\.)\s", line) and buf:  # a list item starts a sentence of its own
            paragraphs.append(buf)
            buf = []
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
        for piece in re.split(r"(?:(?<=[.!?])|(?<=[.!?]\*\*))\s+(?=[A-Z*(\[])", joined):
            at = joined.index(piece, pos)
            pos = at + len(piece)
            if piece.strip():
                out.append((max(n for off, n in starts if off <= at), piece.strip()))
    return out


def _close(cited: str, value: float, op: str = "=") -> bool:
    """A cited number (its precision as written) is ``value``: equal once ``value`` is rounded
    to the cited decimals (scientific notation: to its significant digits); ``<`` / ``≤``: below it."""
    try:
        c = float(cited)
    except ValueError:
        return False
    if math.isnan(value):
        return False
    if op in "<≤":
        return value < c or (op == "≤" and value <= c)
    if "e" in cited.lower():
        digits = len(cited.lower().split("e")[0].replace(".", "").lstrip("0")) or 1
        return float(f"{value:.{digits - 1}e}") == c
    decimals = len(cited.split(".")[1]) if "." in cited else 0
    return abs(round(value, decimals) - c) < 10 ** -(decimals + 6) or (decimals == 0 and abs(value - c) < 0.5)
