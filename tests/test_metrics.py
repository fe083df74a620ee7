"""Fairness metrics against hand-computed values."""

import math

import numpy as np
import pytest

from fedpcd_app.server.metrics import fairness_metrics, jain_index, tail_mean


def test_hand_computed_ten_clients():
    acc = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 1.0])
    m = fairness_metrics(acc, losses=np.arange(10.0))
    assert m["mean_acc"] == pytest.approx(0.55)
    assert m["std_acc"] == pytest.approx(math.sqrt(np.mean((acc - 0.55) ** 2)))
    assert m["worst10_acc"] == pytest.approx(0.1)  # ceil(0.1*10) = 1 client
    assert m["best10_acc"] == pytest.approx(1.0)
    assert m["min_acc"] == pytest.approx(0.1)
    assert m["jain"] == pytest.approx(5.5**2 / (10 * np.sum(acc**2)))
    assert m["mean_loss"] == pytest.approx(4.5) and m["max_loss"] == 9.0


def test_tail_rounds_up_and_keeps_one():
    acc = np.array([0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 0.0, 1.0, 0.05])  # N = 12
    assert tail_mean(acc, 0.1, lowest=True) == pytest.approx((0.0 + 0.05) / 2)  # ceil(1.2) = 2
    assert tail_mean(np.array([0.3, 0.6]), 0.1, lowest=True) == pytest.approx(0.3)


def test_jain_bounds():
    assert jain_index(np.ones(7)) == pytest.approx(1.0)
    assert jain_index(np.array([1.0, 0, 0, 0])) == pytest.approx(0.25)  # 1/N: one client has all
    assert jain_index(np.zeros(3)) == 1.0
