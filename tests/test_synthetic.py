"""dataset='synthetic': the FedProx/q-FFL authors' Synthetic(α, β), checked against a literal
re-implementation of their script (litian96/fair_flearn data/synthetic/generate_synthetic.py),
and the natural partition it is used with."""

import numpy as np
import pytest
import torch

from client_app.data import DataError, load_federated_data, synthetic
from fedcore.config import ConfigError, load_config
from fedcore.seeding import derive_seed, numpy_rng


def _authors_script(alpha, beta, iid, num_user, seed):
    """The authors' generate_synthetic(alpha, beta, iid) written out again statement by
    statement, its global ``np.random`` replaced by one RandomState seeded with ``seed``."""
    np_random = np.random.RandomState(seed)
    dimension, num_class = 60, 10

    def softmax(x):
        ex = np.exp(x)
        return ex / np.sum(np.exp(x))

    samples_per_user = np_random.lognormal(4, 2, (num_user)).astype(int) + 50
    x_split = [[] for _ in range(num_user)]
    y_split = [[] for _ in range(num_user)]
    mean_w = np_random.normal(0, alpha, num_user)
    mean_b = mean_w
    big_b = np_random.normal(0, beta, num_user)
    mean_x = np.zeros((num_user, dimension))
    diagonal = np.zeros(dimension)
    for j in range(dimension):
        diagonal[j] = np.power((j + 1), -1.2)
    cov_x = np.diag(diagonal)
    for i in range(num_user):
        if iid == 1:
            mean_x[i] = np.ones(dimension) * big_b[i]
        else:
            mean_x[i] = np_random.normal(big_b[i], 1, dimension)
    if iid == 1:
        w_global = np_random.normal(0, 1, (dimension, num_class))
        b_global = np_random.normal(0, 1, num_class)
    for i in range(num_user):
        w = np_random.normal(mean_w[i], 1, (dimension, num_class))
        b = np_random.normal(mean_b[i], 1, num_class)
        if iid == 1:
            w = w_global
            b = b_global
        xx = np_random.multivariate_normal(mean_x[i], cov_x, samples_per_user[i])
        yy = np.zeros(samples_per_user[i])
        for j in range(samples_per_user[i]):
            tmp = np.dot(xx[j], w) + b
            yy[j] = np.argmax(softmax(tmp))
        x_split[i] = xx.tolist()
        y_split[i] = yy.tolist()
    return x_split, y_split


@pytest.mark.parametrize("alpha, beta, iid", [(1.0, 1.0, False), (0.5, 0.5, False), (0.0, 0.0, True)])
def test_the_generator_draws_exactly_what_the_authors_script_draws(alpha, beta, iid):
    want_x, want_y = _authors_script(alpha, beta, 1 if iid else 0, 12, seed=11)
    xs, ys = synthetic.generate(12, alpha, beta, iid, 11)
    assert len(xs) == len(ys) == 12
    for k in range(12):
        np.testing.assert_allclose(xs[k], np.asarray(want_x[k]), rtol=0, atol=1e-12)
        assert np.array_equal(ys[k], np.asarray(want_y[k], dtype=np.int64)), k


def test_sizes_shapes_labels_and_the_feature_covariance():
    xs, ys = synthetic.generate(100, 1.0, 1.0, False, 3)
    sizes = np.array([len(y) for y in ys])
    assert sizes.min() >= 50 and len(set(sizes.tolist())) > 50  # lognormal + 50: unequal users
    assert all(x.shape == (len(y), 60) for x, y in zip(xs, ys))
    labels = np.concatenate(ys)
    assert labels.min() >= 0 and labels.max() <= 9 and len(np.unique(labels)) == 10
    # within a user, x ~ N(v_k, diag(j^-1.2)): the pooled within-user variance of feature j
    centred = np.concatenate([x - x.mean(axis=0) for x in xs])
    var = centred.var(axis=0)
    np.testing.assert_allclose(var, np.arange(1, 61) ** -1.2, rtol=0.05)
    # non-iid: users' feature means differ (v_k ~ N(B_k, 1)); iid variant (α = β = 0): all means 0
    means = np.array([x.mean(axis=0) for x in xs])
    assert means.std(axis=0).mean() > 0.5
    iid_x, _ = synthetic.generate(30, 0.0, 0.0, True, 3)
    assert np.abs(np.concatenate(iid_x).mean(axis=0)).max() < 0.05


def test_users_are_shuffled_and_split_90_10():
    xs, ys = synthetic.generate(15, 1.0, 1.0, False, 2)
    users = synthetic.split_users(xs, ys, 2)
    for k, (x, y) in enumerate(zip(xs, ys)):
        n_train = int(0.9 * len(y))
        assert len(users.y_train[k]) == n_train and len(users.y_test[k]) == len(y) - n_train
        perm = numpy_rng(2, "synthetic-shuffle", k).permutation(len(y))
        both = np.concatenate([users.x_train[k], users.x_test[k]])
        np.testing.assert_array_equal(both, x[perm].astype(np.float32))
        np.testing.assert_array_equal(np.concatenate([users.y_train[k], users.y_test[k]]), y[perm])
        assert not np.array_equal(perm, np.arange(len(y)))


def test_data_seed_follows_seed_unless_synthetic_seed_is_given():
    assert synthetic.data_seed(4, -1) == derive_seed(4, "synthetic") % 2**32
    assert synthetic.data_seed(4, 17) == synthetic.data_seed(9, 17) == 17


def test_memory_bound_is_one_line():
    with pytest.raises(synthetic.SyntheticError) as err:
        synthetic.generate(100, 1.0, 1.0, False, 0, max_examples=1000)
    msg = str(err.value)
    assert "\n" not in msg and "num-clients" in msg and "1,000" in msg


def _cfg(**kw):
    base = {"dataset": "synthetic", "partitioner": "natural", "model": "logreg", "num-clients": 10}
    return load_config({**base, **{k.replace("_", "-"): v for k, v in kw.items()}})


def test_federated_synthetic_is_one_client_per_user_with_their_own_split():
    cfg = _cfg(seed=1)
    data = load_federated_data(cfg)
    users = synthetic.synthetic_users(10, 1.0, 1.0, False, 1)
    assert data.num_clients == 10 and data.num_classes == 10 and data.input_shape == (1, 1, 60)
    for k in range(10):
        xtr, ytr = data.client_train(k)
        xte, yte = data.client_test(k)
        np.testing.assert_array_equal(xtr.reshape(len(xtr), 60).numpy(), users.x_train[k])  # features as given
        np.testing.assert_array_equal(ytr.numpy(), users.y_train[k])
        np.testing.assert_array_equal(xte.reshape(len(xte), 60).numpy(), users.x_test[k])
        np.testing.assert_array_equal(yte.numpy(), users.y_test[k])
    # the central test set is the union of the users' test splits
    np.testing.assert_array_equal(data.y_central.numpy(), np.concatenate(users.y_test))
    assert torch.equal(data.x_central, torch.cat([data.client_test(k)[0] for k in range(10)]))


def test_seeds_give_partitions_and_synthetic_seed_pins_one():
    a = load_federated_data(_cfg(seed=0))
    b = load_federated_data(_cfg(seed=0))
    assert a is b or torch.equal(a.x, b.x)
    a_x = a.x.clone()
    c = load_federated_data(_cfg(seed=1))
    assert c.x.shape != a_x.shape or not torch.equal(c.x, a_x)
    p0 = load_federated_data(_cfg(seed=0, synthetic_seed=5)).x.clone()
    p1 = load_federated_data(_cfg(seed=1, synthetic_seed=5)).x
    assert torch.equal(p0, p1)
    alt = load_federated_data(_cfg(seed=0, synthetic_alpha=0.5, synthetic_beta=0.5)).x
    assert alt.shape != a_x.shape or not torch.equal(alt, a_x)


def test_val_fraction_carves_validation_from_each_users_train_split():
    plain = load_federated_data(_cfg(seed=2))
    train0 = [plain.train_idx[k].copy() for k in range(10)]
    test0 = [plain.test_idx[k].copy() for k in range(10)]
    data = load_federated_data(_cfg(seed=2, val_fraction=0.1))
    for k in range(10):
        assert np.array_equal(data.test_idx[k], test0[k])
        assert len(data.val_idx[k]) >= 1
        assert np.array_equal(np.sort(np.concatenate([data.train_idx[k], data.val_idx[k]])), train0[k])


def _rows(x, y):
    """A user's examples as a sorted list of (label, features) rows: the multiset, order-free."""
    x = x.reshape(len(x), -1).numpy()
    return sorted((int(label), tuple(row)) for label, row in zip(y.numpy(), x))


def _user(data, k, split):
    return getattr(data, f"client_{split}")(k)


def test_user_resplit_keeps_each_users_pooled_examples_and_cuts_them_80_10_10():
    plain = load_federated_data(_cfg(seed=3, synthetic_seed=7))
    pooled = []
    for k in range(10):
        (xtr, ytr), (xte, yte) = plain.client_train(k), plain.client_test(k)
        pooled.append(_rows(torch.cat([xtr, xte]), torch.cat([ytr, yte])))
    data = load_federated_data(_cfg(seed=3, synthetic_seed=7, user_resplit=True))
    for k in range(10):
        parts = [_user(data, k, split) for split in ("train", "val", "test")]
        n = len(pooled[k])
        assert [len(y) for _, y in parts] == [int(0.8 * n), int(0.9 * n) - int(0.8 * n), n - int(0.9 * n)]
        assert _rows(torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])) == pooled[k]
    # the central test set is still the union of the users' (new) test splits
    assert torch.equal(data.x_central, torch.cat([data.client_test(k)[0] for k in range(10)]))


def test_user_resplit_is_fixed_by_the_seed_and_differs_across_seeds():
    def cut(seed):
        d = load_federated_data(_cfg(seed=seed, synthetic_seed=7, user_resplit=True))
        return [_rows(*_user(d, k, "test")) for k in range(10)], [_rows(*_user(d, k, "val")) for k in range(10)]

    first, again, other = cut(1), cut(1), cut(2)
    assert first == again
    assert all(a != b for a, b in zip(first[0], other[0]))  # every user's test split moves
    assert all(a != b for a, b in zip(first[1], other[1]))
    # the draw itself (synthetic-seed) is the same: seed 2's pooled examples are seed 1's
    d1 = load_federated_data(_cfg(seed=1, synthetic_seed=7, user_resplit=True))
    x1 = sorted(map(tuple, d1.x.reshape(len(d1.x), -1).numpy()))
    d2 = load_federated_data(_cfg(seed=2, synthetic_seed=7, user_resplit=True))
    assert sorted(map(tuple, d2.x.reshape(len(d2.x), -1).numpy())) == x1


def test_user_resplit_off_is_the_sources_own_split():
    a = load_federated_data(_cfg(seed=4))
    train, test = [t.copy() for t in a.train_idx], [t.copy() for t in a.test_idx]
    b = load_federated_data(_cfg(seed=4, user_resplit=False))
    assert all(np.array_equal(x, y) for x, y in zip(train, b.train_idx))
    assert all(np.array_equal(x, y) for x, y in zip(test, b.test_idx))
    assert all(len(v) == 0 for v in b.val_idx)


def test_user_resplit_of_a_tiny_user_is_one_data_error():
    from client_app.data.splits import resplit_user

    with pytest.raises(DataError) as err:
        resplit_user(np.arange(1), seed=0, pid=3)
    assert "client 3" in str(err.value) and "user-resplit" in str(err.value) and "\n" not in str(err.value)
    train, val, test = resplit_user(np.arange(10, 20), seed=0, pid=0)
    assert (len(train), len(val), len(test)) == (8, 1, 1)


@pytest.mark.parametrize("override, fragment", [
    ({"partitioner": "dirichlet"}, "set partitioner='natural'"),
    ({"user-resplit": True, "val-fraction": 0.1}, "set val-fraction=0"),
    ({"user-resplit": "maybe"}, "user-resplit"),
    ({"synthetic-alpha": -1.0}, "synthetic-alpha"),
    ({"synthetic-beta": -0.1}, "synthetic-beta"),
    ({"synthetic-seed": -2}, "synthetic-seed"),
    ({"synthetic-iid": "maybe"}, "synthetic-iid"),
    ({"dataset": "digits"}, "needs user ids"),
])
def test_bad_synthetic_or_natural_settings_are_one_line(override, fragment):
    with pytest.raises(ConfigError) as err:
        _cfg(**{k.replace("-", "_"): v for k, v in override.items()})
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_too_many_users_for_memory_is_one_data_error(monkeypatch):
    monkeypatch.setattr(synthetic, "MAX_EXAMPLES", 500)
    with pytest.raises(DataError) as err:
        load_federated_data(_cfg(seed=9, num_clients=12))
    assert "memory bound" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # through Flower: seconds on an idle machine, minutes on a loaded one
def test_a_small_synthetic_run_end_to_end(tmp_path):
    from fedpcd_app.runtime.simulate import simulate
    from fedpcd_app.server.results import read_summary

    out = simulate({"dataset": "synthetic", "partitioner": "natural", "model": "logreg", "num-clients": 8,
                    "fraction-train": 0.5, "num-server-rounds": 2, "eval-every": 1, "seed": 3,
                    "output-dir": str(tmp_path / "run")}, workers=0)
    summary = read_summary(out)
    assert summary["rounds"] == 2 and len(summary["client_acc"]) == 8
    assert 0.0 <= summary["mean_acc"] <= 1.0 and 0.0 <= summary["central_acc"] <= 1.0


def test_user_resplit_needs_the_natural_partitioner():
    with pytest.raises(ConfigError) as err:
        load_config({"dataset": "digits", "partitioner": "dirichlet", "user-resplit": True})
    assert "partitioner='natural'" in str(err.value) and "\n" not in str(err.value)
