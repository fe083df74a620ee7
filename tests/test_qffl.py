"""q-FFL (strategies/qffl.py): the step against a hand computation, its q = 0 case, and
Flower's own QFedAvg on the same replies."""

import numpy as np
import pytest
from flwr.serverapp.strategy import QFedAvg

from fedcore import keys
from fedcore.config import ConfigError
from fedcore.flat import spec_of
from strategies.qffl import QFFL
from tests.helpers import aggregate_round, arrays_from_flat, flat64, make_replies, tiny_template

TEMPLATE = tiny_template()
D = spec_of(TEMPLATE).dim



def test_qffl_hand_computation(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(3)]
    losses, q, lr = [0.5, 1.0, 2.0], 2.0, 0.1
    new, metrics = aggregate_round(QFFL(q=q, lr=lr), 1, theta, TEMPLATE,
                                   make_replies(TEMPLATE, locals_, loss_before=losses))
    L = 1.0 / lr  # noqa: N806 - the paper's Lipschitz constant
    num, den = np.zeros(D), 0.0
    for x, f in zip(locals_, losses):
        dw = L * (theta - x)
        num += f**q * dw
        den += q * f ** (q - 1) * dw @ dw + L * f**q
    np.testing.assert_allclose(new, theta - num / den, rtol=1e-5, atol=1e-6)
    assert metrics["qffl-sum-h"] == pytest.approx(den, rel=1e-6)


def test_qffl_q0_is_uniform_fedavg(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(4)]
    new, _ = aggregate_round(QFFL(q=0.0), 1, theta, TEMPLATE,
                             make_replies(TEMPLATE, locals_, n=[1, 5, 10, 50], loss_before=[0.1, 1, 2, 3]))
    np.testing.assert_allclose(new, np.mean(locals_, axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q", [0.1, 1.0, 5.0])
def test_qffl_matches_flower_qfedavg(rng, q):
    theta = rng.normal(size=D)
    locals_ = [theta + 0.3 * rng.normal(size=D) for _ in range(5)]

    def replies():
        return make_replies(TEMPLATE, locals_, n=[3, 4, 5, 6, 7], loss_before=[0.2, 0.7, 1.1, 1.9, 3.0])

    ours, _ = aggregate_round(QFFL(q=q, lr=0.05), 1, theta, TEMPLATE, replies())
    theirs = QFedAvg(client_learning_rate=0.05, q=q, train_loss_key=keys.LOSS_BEFORE)
    theirs.current_arrays = arrays_from_flat(theta, TEMPLATE)  # what its configure_train does
    flower_arrays, _ = theirs.aggregate_train(1, replies())
    np.testing.assert_allclose(ours, flat64(flower_arrays), rtol=1e-5, atol=1e-6)
    assert not np.allclose(ours, theta)


def test_qffl_needs_each_update_and_the_loss_before():
    assert QFFL.method_class.needs_individual_updates and keys.LOSS_BEFORE in QFFL().method.reads.metrics


def test_qffl_bad_q_is_one_line_error():
    with pytest.raises(ConfigError, match="qffl-q"):
        QFFL.Params.from_run_config({"qffl-q": -1.0})
    with pytest.raises(ConfigError, match="qffl-q"):
        QFFL(q=-1.0)
