"""fedpcd_app.analysis.stats: CI against scipy.stats.t and a hand value, Holm against a
hand-computed example, the sign test's exact p, and the wording checker."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from fedpcd_app.analysis import stats


def test_paired_ci_equals_scipy_t_interval_and_a_hand_value():
    d = [0.012, -0.004, 0.020, 0.007, 0.015]
    mean, lo, hi = stats.paired_ci(d)
    ref = sps.t.interval(0.95, len(d) - 1, loc=np.mean(d), scale=sps.sem(d))
    assert (lo, hi) == pytest.approx(ref, rel=1e-12)
    assert mean == pytest.approx(np.mean(d))
    # hand: d = 1, 2, 3 -> mean 2, s = 1, t(0.975, 2) = 4.302652729911275
    half = 4.302652729911275 / math.sqrt(3)
    assert stats.paired_ci([1.0, 2.0, 3.0]) == pytest.approx((2.0, 2 - half, 2 + half))
    assert stats.paired_ci([1.0, 2.0, 3.0], level=0.9)[2] < stats.paired_ci([1.0, 2.0, 3.0])[2]


def test_paired_ci_degenerate_cases():
    assert all(math.isnan(x) for x in stats.paired_ci([]))
    mean, lo, hi = stats.paired_ci([0.3])
    assert mean == 0.3 and math.isnan(lo) and math.isnan(hi)
    assert stats.paired_ci([0.1, 0.1, 0.1]) == pytest.approx((0.1, 0.1, 0.1))
    with pytest.raises(ValueError, match="level"):
        stats.paired_ci([1.0, 2.0], level=95)


def test_holm_equals_a_hand_computed_example():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> monotone 0.06)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1; an undefined test (NaN) is kept and not counted in the family
    out = stats.holm([0.5, math.nan, 0.4])
    assert out[0] == pytest.approx(0.8) and math.isnan(out[1]) and out[2] == pytest.approx(0.8)
    assert stats.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])
    assert stats.holm([]) == []


def test_holm_is_never_below_the_raw_p_and_at_most_bonferroni():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.2, 17)
    adj = np.array(stats.holm(p))
    assert np.all(adj >= p - 1e-15)
    assert np.all(adj <= np.minimum(1, 17 * p) + 1e-15)


def test_sign_test_five_of_five_is_not_significant():
    assert stats.sign_test_p(5, 5) == pytest.approx(0.0625)
    assert stats.sign_test_p(0, 5) == pytest.approx(0.0625)
    assert stats.sign_test_p(3, 3) == pytest.approx(0.25)
    assert stats.sign_test_p(10, 10) == pytest.approx(2 / 1024)
    assert stats.sign_test_p(4, 5) == pytest.approx(sps.binomtest(4, 5).pvalue)
    assert math.isnan(stats.sign_test_p(0, 0))


def test_effect_size_and_ttest():
    d = [0.01, 0.03, 0.02]
    assert stats.effect_size(d) == pytest.approx(0.02 / 0.01)
    assert stats.ttest_p(d) == pytest.approx(sps.ttest_1samp(d, 0).pvalue)
    assert math.isnan(stats.ttest_p([0.1, 0.1])) and math.isnan(stats.effect_size([0.2]))
    # equal differences up to float round-off have no spread: no test (not p ~ 1e-64)
    noisy = [0.0433, 0.0433 + 1e-17, 0.0433 - 2e-17, 0.0433, 0.0433 + 3e-17]
    assert math.isnan(stats.ttest_p(noisy)) and math.isnan(stats.effect_size(noisy))
    assert not stats.has_spread(noisy) and stats.has_spread([0.0433, 0.0434])


def test_tost_equals_two_one_sided_scipy_tests_and_verdict_words():
    d = [0.001, -0.002, 0.0015, 0.0005, -0.001, 0.002]
    low = sps.ttest_1samp(d, -0.01, alternative="greater").pvalue
    high = sps.ttest_1samp(d, 0.01, alternative="less").pvalue
    assert stats.tost_p(d, 0.01) == pytest.approx(max(low, high)) and stats.tost_p(d, 0.01) < 0.05
    assert stats.tost_p(d, 0.0001) > 0.5 and math.isnan(stats.tost_p(d, 0.0))
    assert stats.verdict(2, 0.004) == "exploratory, 2 seeds"  # a 2-seed "significant" is not one
    assert stats.verdict(5, 0.004) == "significant"
    assert stats.verdict(10, 0.3, 0.01) == "equivalent" and stats.verdict(10, 0.3, 0.2) == "inconclusive"


PAGE = """# A page

FedPCD beats FedAvg on every seed (+7.38 pp). The gain in W10 is significant (p = 0.01).
It is significant after Holm's correction over the 12 comparisons (p_holm = 0.02).
- a list item starts a sentence
CRAFT wins on 3/3 seeds.

| method | significant |
|---|---|
| x | significant on every seed |

    python -m fedpcd_app.report out   # every seed, significant
"""


def test_sentences_skip_tables_and_code_and_keep_their_lines():
    """What the claim checker (fedpcd_app.analysis.claims, tests/test_claims.py) reads of a page."""
    found = stats.sentences(PAGE)
    assert [s for _, s in found] == ["# A page", "FedPCD beats FedAvg on every seed (+7.38 pp).",
                                     "The gain in W10 is significant (p = 0.01).",
                                     "It is significant after Holm's correction over the 12 comparisons "
                                     "(p_holm = 0.02).",
                                     "- a list item starts a sentence CRAFT wins on 3/3 seeds."]
    assert [no for no, _ in found] == [1, 3, 3, 4, 5]
    assert stats._close("0.020", 0.0204) and not stats._close("0.02", 0.026) and stats._close("0.05", 0.01, "<")
