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
* :func:`check_wording` — the comparative sentences of a results page (significant, beats,
  leads, trails, best, tie, equivalent, k/k or every seed) that the page's CSVs' numbers do not
  support (:func:`wording_problems`); the report's ``--check-wording PAGE.md`` prints them and
  exits 1.
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


# -- wording ---------------------------------------------------------------------------------
# A comparative claim, by kind: significance, a direction (beats, leads, ...), "best", a tie or an
# equivalence, a win counted over seeds ("on every seed", "all 5 seeds", "5/5 seeds", "5 of 5 seeds").
SIGNIFICANT = re.compile(r"significan", re.I)
DIRECTION = re.compile(r"\b(?:beats?|beating|outperform(?:s|ed|ing)?|leads?|leading|trails?|trailing|ahead of|"
                       r"behind|superior|inferior)\b", re.I)
BEST = re.compile(r"\bthe best (?:method|rule|algorithm|aggregator)\b|\bbest overall\b|\bis (?:the )?best\b", re.I)
TIE = re.compile(r"\b(?:ties?|tied|tying|equivalent|equivalence|on par)\b", re.I)
COUNT = re.compile(r"\bon (?:every|each|all) seeds?\b|\bevery seed\b|\ball (?:\d+|three|five|ten) "
                   r"(?:paired )?seeds\b|\b(\d+)\s*/\s*\1 (?:paired )?seeds\b|\b(\d+) of \2 (?:paired )?seeds\b", re.I)
CLAIM = re.compile("|".join(r.pattern for r in (SIGNIFICANT, DIRECTION, BEST, TIE, COUNT)), re.I)
CORRECTED = re.compile(r"\bholm\b|p_holm|p_?\{?holm|corrected", re.I)
# the sentence denies a significance claim ("not significant", "none is significant")
NOT_SIGNIFICANT = re.compile(r"\b(?:not|no|none|nor|never|without)\b[^.;]{0,40}significan|\bnon-?significan|"
                             r"\binsignifican", re.I)
NOT_TIE = re.compile(r"\b(?:not|no|none|nor|never|without)\b[^.;]{0,30}(?:tie|equivalen)|\bnon-?equivalen|"
                     r"\btie-?break|\bties? (?:go|goes|break|breaks)\b|\bmeans\b|\bneeds? (?:the )?TOST\b|"
                     r"\bTOST p of equivalence\b|\b\d+ tied\b", re.I)  # denial/definition/rule/count
# the sentence words its direction or count as exploratory / inconclusive (no finding claimed)
QUALIFIED = re.compile(r"exploratory|inconclusive|\bnot significant|\bno evidence\b|\bnot a finding\b", re.I)
NUM = r"(\d+(?:\.\d+)?(?:e-?\d+)?)"
P_HOLM = re.compile(r"p_?\{?holm\}?\s*(=|<|≤|>|≥)\s*" + NUM + r"((?:\s*(?:,|and|/)\s*" + NUM + r")*)", re.I)
P_TOST = re.compile(r"(?:p_tost|tost p|tost,? p)\s*(=|<|≤)\s*" + NUM, re.I)
SIGN_P = re.compile(r"p\s*=\s*" + NUM + r"[^.;)]{0,12}sign[- ]test|sign[- ]test[^.;)]{0,20}?p\s*=\s*" + NUM, re.I)
DIFF = re.compile(r"([+−-])\s?(\d+\.\d+)\s*pp\b")


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
        for piece in re.split(r"(?<=[.!?])\s+(?=[A-Z*(\[])", joined):
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


def _num(row: dict, key: str) -> float:
    try:
        return float(row.get(key, ""))
    except (TypeError, ValueError):
        return math.nan


def _cited_p_holm(sentence: str) -> list[tuple[str, str]]:
    """(operator, number) of every p_holm the sentence cites (``p_holm = 0.020, 0.014`` gives two)."""
    out = []
    for m in P_HOLM.finditer(sentence):
        out.append((m.group(1), m.group(2)))
        out += [(m.group(1), x) for x in re.findall(NUM, m.group(3) or "")]
    return out


def _holm_of(row: dict) -> float:
    """The adjusted p a page's words rest on: the page-wide family's (``p_holm_page``) when the
    CSV has it, else the table's (``p_holm``)."""
    return _num(row, "p_holm_page") if "p_holm_page" in row else _num(row, "p_holm")


def _supporting(sentence: str, rows: Sequence[dict]) -> list[dict]:
    """The rows whose adjusted p the sentence cites (``p_holm = x`` or ``< x``) that are
    significant (below :data:`ALPHA`, at least :data:`MIN_SEEDS` paired seeds) and, when the
    sentence cites a difference in pp, whose mean difference (signed) is one of those."""
    cited = [(op, x) for op, x in _cited_p_holm(sentence) if op in "=<≤"]
    diffs = [("-" if s in "−-" else "+") + v for s, v in DIFF.findall(sentence)]
    out = []
    for row in rows:
        p, n = _holm_of(row), int(_num(row, "num_seeds")) if not math.isnan(_num(row, "num_seeds")) else 0
        if math.isnan(p) or p >= ALPHA or n < MIN_SEEDS or not any(_close(x, p, op) for op, x in cited):
            continue
        mean = 100 * _num(row, "mean_difference")
        if diffs and not any(_close(d.lstrip("+"), mean) for d in diffs):
            continue
        out.append(row)
    return out


def wording_problems(text: str, rows: Sequence[dict] | None = None) -> list[tuple[int, str, str]]:
    """(line, sentence, why) of each comparative sentence of a page that its CSVs' numbers do
    not support (``rows``: the rows of the page's paired CSVs, ``report_paired*.csv``):

    * *significant* needs a cited p_holm (``p_holm = x``) equal to a row's adjusted p (the
      page-wide family's, ``p_holm_page``, when the CSV has it) that is below :data:`ALPHA` over at
      least :data:`MIN_SEEDS` paired seeds, and a cited difference in pp, if any, equal to that
      row's (signed);
    * beats / outperforms / leads / trails / ahead of / behind, and "k/k seeds" / "every seed",
      need the same support, or the sentence words them as exploratory / inconclusive; a cited
      sign-test p must be the exact sign test of the count claimed;
    * "the best method" needs the support (no qualifier excuses it);
    * tie / tied / equivalent / on par needs a cited TOST p (``p_tost = x``) equal to a row's
      ``tost_p`` below :data:`ALPHA` (else: "inconclusive", with the interval).
    """
    rows = list(rows or [])
    out = []
    for no, s in sentences(text):
        if not CLAIM.search(s):
            continue
        support = _supporting(s, rows)
        qualified = bool(QUALIFIED.search(s))
        why = None
        if SIGNIFICANT.search(s) and not NOT_SIGNIFICANT.search(s) and not support:
            why = ("'significant' without a cited p_holm of the page's CSVs below "
                   f"{ALPHA} over >= {MIN_SEEDS} paired seeds" + ("" if rows else " (no paired CSV beside the page)"))
        elif BEST.search(s) and not support:
            why = "'best' without a significant row of the page's CSVs cited (p_holm)"
        elif TIE.search(s) and not NOT_TIE.search(s):
            tost = [x for op, x in [(m.group(1), m.group(2)) for m in P_TOST.finditer(s)]
                    if any(_close(x, _num(r, "tost_p"), op) and _num(r, "tost_p") < ALPHA for r in rows)]
            if not tost:
                why = ("'tie'/'equivalent' without a cited TOST p (p_tost) below 0.05 in the page's CSVs: "
                       "say inconclusive")
        if why is None and DIRECTION.search(s) and not support and not qualified:
            why = "a direction (beats/leads/trails/...) without a significant p_holm cited or 'exploratory'"
        if why is None and (m := COUNT.search(s)):
            k = next((int(g) for g in m.groups() if g), None)
            for cited in (g for mm in SIGN_P.finditer(s) for g in mm.groups() if g):
                if k is not None and not _close(cited, sign_test_p(k, k)):
                    why = f"the cited sign-test p = {cited} is not that of {k}/{k} seeds ({sign_test_p(k, k):.4g})"
            if why is None and not support and not qualified and not SIGN_P.search(s):
                why = "a count over seeds without its sign-test p, a significant p_holm, or 'exploratory'"
        if why is not None:
            out.append((no, s, why))
    return out


def check_wording(text: str, rows: Sequence[dict] | None = None) -> list[tuple[int, str]]:
    """The sentences (line number of their paragraph, sentence) that :func:`wording_problems`
    flags: to be worded as exploratory / inconclusive, or to cite the row that supports them."""
    return [(no, s) for no, s, _ in wording_problems(text, rows)]
