"""The client side for foreign ClientApps (client_app/foreign.py, fedcore/client_pieces.py,
examples/client_<method>.py): a quickstart-style ClientApp with ``ClientSide`` trains each
method as the app's own client routine does (the same model, β, Δc_i, personal model, to the
bit), each example runs against its strategy through Flower's ``Strategy.start`` with no reply
dropped, and a quickstart client without the piece is told which piece it lacks."""

from __future__ import annotations

import importlib
import logging
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, RecordDict

from client_app import quickstart
from client_app.client_app import train_reply
from client_app.foreign import ClientSide, evaluation_model, mean_loss
from client_app.methods import LocalTraining
from client_app.training import batch_indices
from fedcore import client_pieces, keys
from fedcore.seeding import torch_generator
from strategies import QFFL, TERM, Ditto, FedAvg, FedeRage, FedFa, FedProx, PropFair, Scaffold
from strategies.registry import names, strategy_class
from tests.fakegrid import ClientAppGrid, configure_round, flat_of, task_identity

N, EPOCHS, BATCH = 50, 2, 16


def client_data(pid: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7 + pid)
    y = torch.randint(quickstart.CLASSES, (N,), generator=g)
    return torch.randn(N, quickstart.FEATURES, generator=g) + y[:, None] * 0.3, y


def net(arrays: ArrayRecord) -> torch.nn.Module:
    model = quickstart.Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    return model


def context() -> Context:
    return Context(run_id=1, node_id=1000, node_config={keys.PARTITION_ID: 0, "num-partitions": 1},
                   state=RecordDict(), run_config={})


def with_app_routine(request, ctx: Context):
    """The app's own client (client_app.client_app.train_reply, on the loop)."""
    x, y = client_data(0)
    settings = LocalTraining(local_epochs=EPOCHS, batch_size=BATCH, client_execution="loop")
    return train_reply(request, ctx, net(request.content[keys.ARRAYS]), x, y, settings, partition_id=0, seed=0)


def with_piece(request, ctx: Context):
    """A foreign client: ClientSide over the same batches, in the same order."""
    x, y = client_data(0)
    side = ClientSide(request, ctx, net(request.content[keys.ARRAYS]),
                      data=[(x[i:i + 128], y[i:i + 128]) for i in range(0, N, 128)])
    server_round = int(request.content[keys.CONFIG][keys.SERVER_ROUND])
    for idx in batch_indices(N, BATCH, EPOCHS, torch_generator(0, "batches", 0, server_round)):
        side.step(x[idx], y[idx])
    return side.reply({keys.NUM_EXAMPLES: N})


STATE_KEYS = {"scaffold": keys.SCAFFOLD_C_CLIENT, "ditto": "ditto-personal"}


def state_of(ctx: Context, key: str):
    return next(v for k, v in ctx.state.items() if k.split("@")[0] == key)


def setups():
    """(name, strategy, what to change on the server between rounds 1 and 2)."""

    def c_nonzero(s):
        s.state.c = torch.linspace(-0.05, 0.05, s.spec.dim)

    def beta_hat(s):
        s.state.beta_hat = 0.9

    return [
        ("fedavg-loss-before", FedAvg(lr=0.05, loss_before=True), None),
        ("fedprox", FedProx(lr=0.05, mu=0.5), None),
        ("scaffold", Scaffold(lr=0.05, num_clients=4), c_nonzero),
        ("federage-batch", FedeRage(lr=0.05, alpha=0.3, gamma=0.5, beta_lr=0.2), beta_hat),
        ("federage-sample", FedeRage(lr=0.05, alpha=0.3, gamma=0.5, beta_lr=0.2, level="sample"), beta_hat),
        ("ditto", Ditto(lr=0.05, lam=0.5), None),
        ("qffl", QFFL(lr=0.05), None),
        ("term", TERM(lr=0.05), None),
        ("propfair", PropFair(lr=0.05, base=2.5, epsilon=0.3), None),
        ("propfair-huber", PropFair(lr=0.05, base=2.5, epsilon=0.3, huber=True), None),
        ("fedfa", FedFa(lr=0.05, gamma=0.7), None),
    ]


@pytest.mark.parametrize("name, strategy, between", setups(), ids=[s[0] for s in setups()])
def test_the_piece_trains_as_the_apps_own_client_routine(name, strategy, between):
    """Two rounds (the second one with what the client kept: c_i, the personal model; and a
    changed server value: c, β̂): the reply's model, metrics and records equal the app's own
    client's to the bit; so does what the node keeps."""
    torch.manual_seed(0)
    arrays = ArrayRecord(quickstart.Net().state_dict())
    ctx_app, ctx_piece = context(), context()
    for server_round in (1, 2):
        if server_round == 2 and between is not None:
            between(strategy)
        (request,) = configure_round(strategy, server_round, arrays, [0])
        with task_identity():
            want, got = with_app_routine(request, ctx_app), with_piece(request, ctx_piece)
        np.testing.assert_array_equal(flat_of(got.content[keys.ARRAYS]), flat_of(want.content[keys.ARRAYS]))
        assert flat_of(got.content[keys.ARRAYS]).tobytes() != flat_of(arrays).tobytes()  # it trained
        wanted = dict(want.content[keys.METRICS])
        del wanted[keys.PARTITION_ID]  # the app's client names its partition; a foreign one is its node
        assert dict(got.content[keys.METRICS]) == wanted
        assert sorted(got.content) == sorted(want.content)
        for record in set(got.content) - {keys.ARRAYS, keys.METRICS}:
            np.testing.assert_array_equal(flat_of(got.content[record]), flat_of(want.content[record]))
        if name in STATE_KEYS:
            np.testing.assert_array_equal(flat_of(state_of(ctx_piece, STATE_KEYS[name])),
                                          flat_of(state_of(ctx_app, STATE_KEYS[name])))
        arrays = got.content[keys.ARRAYS]
    if name.startswith("federage"):
        assert got.content[keys.METRICS][keys.FEDERAGE_BETA] != 0.9  # β moved from β̂
    if name == "scaffold":
        assert keys.SCAFFOLD_DELTA_C in got.content


def test_ditto_evaluation_scores_the_personal_model_the_node_kept():
    strategy = Ditto(lr=0.05, lam=0.5)
    torch.manual_seed(0)
    arrays = ArrayRecord(quickstart.Net().state_dict())
    ctx = context()
    (request,) = configure_round(strategy, 1, arrays, [0])
    with task_identity():
        with_piece(request, ctx)
    scored = evaluation_model(request, ctx, net(arrays))
    np.testing.assert_array_equal(flat_of(ArrayRecord(scored.state_dict())), flat_of(ctx.state["ditto-personal"]))
    assert flat_of(ctx.state["ditto-personal"]).tobytes() != flat_of(arrays).tobytes()
    plain = FedAvg(lr=0.05)
    (request,) = configure_round(plain, 1, arrays, [0])
    model = net(arrays)
    assert evaluation_model(request, ctx, model) is model  # not Ditto: the received model


# -- each example against its strategy through Flower's Strategy.start --------------------------------
EXAMPLES = [("federage", "federage"), ("scaffold", "scaffold"), ("fedprox", "fedprox"), ("fednova", "fednova"),
            ("ditto", "ditto"), ("qffl", "qffl"), ("qffl", "afl"), ("qffl", "term"), ("propfair", "propfair"),
            ("fedfa", "fedfa")]


def run_example(module: str, name: str, client=None, rounds: int = 3, nodes: int = 6):
    example = importlib.import_module(f"examples.client_{module}")
    server = quickstart.server_app(name, example.STRATEGIES[name], rounds=rounds)
    grid = ClientAppGrid(nodes, client or example.client)
    with task_identity():
        server(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    return quickstart.RESULTS[name], grid


def train_replies(grid, group: str):
    return [r for r in grid.replies if r.metadata.message_type == "train" and r.metadata.group_id == group]


@pytest.mark.parametrize("module, name", EXAMPLES, ids=[n for _, n in EXAMPLES])
def test_each_example_trains_its_strategy_with_no_reply_dropped(module, name, caplog):
    with caplog.at_level(logging.WARNING, logger="fedpcd"):
        result, grid = run_example(module, name)
    assert not [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert not [r for r in grid.replies if r.has_error()]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    accs = [float(m["accuracy"]) for _, m in sorted(result.evaluate_metrics_clientapp.items())]
    assert accs[-1] > accs[0] and accs[-1] > 0.3, accs  # chance is 0.1
    losses = [np.mean([float(r.content[keys.METRICS].get(keys.TRAIN_LOSS, r.content[keys.METRICS].get("train_loss")))
                       for r in train_replies(grid, str(t))]) for t in (1, 3)]
    assert losses[1] < losses[0], losses
    metrics = result.train_metrics_clientapp
    replies = [r for t in (1, 2, 3) for r in train_replies(grid, str(t))]
    trained = {int(r.metadata.src_node_id) for r in replies}
    if name == "federage":  # β̂ is the mean of the clients' β, and it moves
        betas = [float(metrics[t]["federage-beta-hat"]) for t in (1, 2, 3)]
        assert len(set(betas)) == 3 and betas[0] != 0.0
        assert all(keys.FEDERAGE_BETA in r.content[keys.METRICS] for r in replies)
    if name == "scaffold":  # c updates; each client keeps its c_i
        norms = [float(metrics[t]["scaffold-c-norm"]) for t in (1, 2, 3)]
        assert norms[0] > 0 and len(set(norms)) == 3
        assert all(keys.SCAFFOLD_C_CLIENT in grid.contexts[node].state for node in trained)
    if name == "ditto":  # each client keeps a personal model, which its evaluation scores
        for node in trained:
            personal = grid.contexts[node].state["ditto-personal"]
            assert flat_of(personal).tobytes() != flat_of(result.arrays).tobytes()
    if name == "fednova":  # num-steps: the batches of one epoch
        for r in replies:
            m = r.content[keys.METRICS]
            assert m[keys.NUM_STEPS] == -(-int(m[keys.NUM_EXAMPLES]) // quickstart.BATCH) * quickstart.EPOCHS
    if name in ("qffl", "afl", "term"):
        assert all(float(r.content[keys.METRICS][keys.LOSS_BEFORE]) > 0 for r in replies)
    if name == "fedfa":  # each reply's accuracy; the server's counts and weights move with them
        assert all(0.0 <= float(r.content[keys.METRICS][keys.FEDFA_ACCURACY]) <= 1.0 for r in replies)
        assert max(max(metrics[t]["fedfa-counts"]) for t in (1, 2, 3)) >= 2


def test_a_50_node_quickstart_app_trains_federage_with_the_piece_first_try(caplog):
    """The new user's app of the issue: 50 quickstart-style nodes, FedeRage built as the README
    shows (no num_clients), the documented piece in the ClientApp: 25 clients a round, no drop."""
    with caplog.at_level(logging.WARNING, logger="fedpcd"):
        result, grid = run_example("federage", "federage", nodes=50)
    assert not [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert [len(train_replies(grid, str(t))) for t in (1, 2, 3)] == [25, 25, 25]
    assert len(result.train_metrics_clientapp[3]["federage-betas"]) == 25
    accs = [float(m["accuracy"]) for _, m in sorted(result.evaluate_metrics_clientapp.items())]
    assert accs[-1] > 0.5, accs


def test_the_fedprox_piece_adds_the_proximal_term():
    """The same nodes, batches and μ: with the piece each client's update is shorter than the
    quickstart's plain SGD (without it FedProx is FedAvg: nothing is dropped, nothing tells)."""
    with_piece_result, _ = run_example("fedprox", "fedprox")
    plain_result, grid = run_example("fedprox", "fedprox", client=quickstart.plain_client)
    assert not [r for r in grid.replies if r.has_error()]
    with_piece = with_piece_result.train_metrics_clientapp[1]["update-norm"]
    plain = plain_result.train_metrics_clientapp[1]["update-norm"]
    assert with_piece < plain


WITHOUT_THE_PIECE = [("federage", "federage", "missing metric 'federage-beta'"),
                     ("scaffold", "scaffold", "missing metric 'num-steps'"),  # checked before its record
                     ("fednova", "fednova", "missing metric 'num-steps'"),
                     ("qffl", "afl", "missing metric 'loss-before'"),
                     ("qffl", "term", "missing metric 'loss-before'"),
                     ("fedfa", "fedfa", "missing metric 'fedfa-accuracy'")]


@pytest.mark.parametrize("module, name, reason", WITHOUT_THE_PIECE, ids=[n for _, n, _ in WITHOUT_THE_PIECE])
def test_a_quickstart_client_without_the_piece_is_told_which_piece_it_lacks(module, name, reason, caplog):
    """Today's failure: Flower's quickstart ClientApp (no method field) under FedeRage (SCAFFOLD,
    FedNova, q-FFL, AFL) has every reply dropped. Each drop names the field, and the line for it
    names the piece and how to add it."""
    with caplog.at_level(logging.WARNING, logger="fedpcd"):
        try:
            result, grid = run_example(module, name, client=quickstart.plain_client, rounds=1)
        except Exception as exc:  # noqa: BLE001 - a strategy that raises on an all-dropped run must name the piece
            assert client_pieces.PIECE in str(exc)
            return
    drops = [r.getMessage() for r in caplog.records if "dropped reply" in r.getMessage()]
    assert drops and len(drops) == len(train_replies(grid, "1"))
    assert all(reason in d for d in drops), drops
    line = client_pieces.how_to_send(name, drops[0])
    assert client_pieces.PIECE in line and reason.split()[-1] in line and "side.reply" in line
    assert flat_of(result.arrays).tobytes() == flat_of(quickstart.initial_arrays()).tobytes()  # untrained
    # an ERROR line about it (strategies' all-dropped detector), when there is one, names the piece
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and client_pieces.PIECE in errors[0]  # strategies.health: once, naming the piece


def test_running_an_example_runs_its_strategy(monkeypatch, capsys):
    """``python -m examples.client_qffl afl`` (its __main__ block), Flower's simulation replaced by
    the in-process grid: AFL, not q-FFL, runs, and the accuracy line is printed."""
    import runpy

    import flwr.simulation

    def simulation(server_app, client_app, num_supernodes, **kwargs):
        with task_identity():
            server_app(ClientAppGrid(num_supernodes, client_app),
                       Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))

    monkeypatch.setattr(flwr.simulation, "run_simulation", simulation)
    quickstart.RESULTS.clear()
    monkeypatch.setattr(sys, "argv", ["client_qffl", "afl"])
    runpy.run_module("examples.client_qffl", run_name="__main__")
    assert list(quickstart.RESULTS) == ["afl"] and "afl: federated accuracy by round [" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["client_qffl", "fedavg"])
    with pytest.raises(SystemExit, match=re.escape("qffl | afl")):
        runpy.run_module("examples.client_qffl", run_name="__main__")


# -- the one-line pieces ----------------------------------------------------------------------------
def test_every_method_whose_clients_do_more_than_plain_sgd_has_its_line():
    def reads(n):
        return strategy_class(n)().method.reads

    needing = {n for n in names() if n != "config-fl" and (
        strategy_class(n).method_class.client_method != keys.SGD or set(reads(n).metrics) - {keys.TRAIN_LOSS}
        or reads(n).records)}  # train-loss: Flower's quickstart sends it (train_loss)
    assert needing <= set(client_pieces.CLIENT_PIECES), needing - set(client_pieces.CLIENT_PIECES)
    for method, line in client_pieces.CLIENT_PIECES.items():
        assert client_pieces.PIECE in line and "\n" not in line, method
        for field in (*reads(method).metrics, *reads(method).records):
            assert f"'{field}'" in line, (method, field)


def test_a_drop_reason_names_the_line_of_its_field():
    assert client_pieces.how_to_send("fedpcd") is None  # plain SGD is enough
    line = client_pieces.how_to_send("fedpcd", "missing metric 'loss-before'")  # FedPCD(loss_before=True)
    assert "'loss-before'" in line and "data=trainloader" in line
    assert client_pieces.how_to_send("qffl", "missing metric 'loss-before'") == client_pieces.CLIENT_PIECES["qffl"]
    assert "'num-steps'" in client_pieces.how_to_send("fednova", "missing metric 'num-steps'")
    assert client_pieces.how_to_send("scaffold", "missing ArrayRecord 'scaffold-delta-c'") == \
        client_pieces.CLIENT_PIECES["scaffold"]


def test_the_piece_and_the_lines_import_nothing_server_side():
    """A client-only install (flwr, torch, numpy) runs the piece; a strategy names it without
    importing torch."""
    code = ("import sys, client_app.foreign; "
            "print(sorted({m.split('.')[0] for m in sys.modules}))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for server_side in ("'strategies'", "'fedpcd_app'", "'cvxpy'", "'ray'", "'matplotlib'", "'sklearn'", "'scipy'",
                        "'pandas'", "'datasets'", "'flwr_datasets'", "'torchvision'"):
        assert server_side not in loaded, server_side
    code = "import sys, fedcore.client_pieces; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "'torch'" not in loaded and "'flwr'" not in loaded


# -- what a wrong use says ----------------------------------------------------------------------------
def request_of(strategy):
    torch.manual_seed(0)
    (request,) = configure_round(strategy, 1, ArrayRecord(quickstart.Net().state_dict()), [0])
    return request


def test_a_wrong_use_is_one_line_naming_the_fix():
    x, y = client_data(0)
    with pytest.raises(ValueError, match="data=trainloader"):
        ClientSide(request_of(QFFL(lr=0.05)), context(), quickstart.Net())
    side = ClientSide(request_of(FedAvg(lr=0.05)), context(), quickstart.Net())
    side.step(x, y)
    with pytest.raises(ValueError, match="num-examples"):
        side.reply({"train_loss": 1.0})
    with pytest.raises(ValueError, match="Ditto"):
        side.personal_step(x, y)
    with task_identity():
        side.reply({"num-examples": N})
        with pytest.raises(ValueError, match="twice"):
            side.reply({"num-examples": N})
    with pytest.raises(ValueError, match="before_step"):
        ClientSide(request_of(Scaffold(lr=0.05, num_clients=2)), context(), quickstart.Net()).reply(
            {"num-examples": N})
    with pytest.raises(TypeError, match="unpack="):
        mean_loss(quickstart.Net(), [{"img": x, "label": y}])
    assert mean_loss(quickstart.Net(), [{"img": x, "label": y}], unpack=lambda b: (b["img"], b["label"])) > 0


def test_a_loop_of_your_own_with_the_hooks_is_the_step():
    """loss() + before_step() in the caller's loop (its own SGD optimizer) = step()."""
    request = request_of(FedeRage(lr=0.05, alpha=0.3, gamma=0.5))
    x, y = client_data(0)
    a, b = ClientSide(request, context(), net(request.content[keys.ARRAYS])), None
    for i in range(0, N, BATCH):
        a.step(x[i:i + BATCH], y[i:i + BATCH])
    model = net(request.content[keys.ARRAYS])
    b = ClientSide(request, context(), model)
    opt = torch.optim.SGD(model.parameters(), lr=b.lr)
    for i in range(0, N, BATCH):
        opt.zero_grad()
        b.loss(model(x[i:i + BATCH]), y[i:i + BATCH]).backward()
        b.before_step()
        opt.step()
    with task_identity():
        ra, rb = a.reply({"num-examples": N}), b.reply({"num-examples": N})
    np.testing.assert_array_equal(flat_of(ra.content[keys.ARRAYS]), flat_of(rb.content[keys.ARRAYS]))
    assert dict(ra.content[keys.METRICS]) == dict(rb.content[keys.METRICS])
    assert a.beta == b.beta == ra.content[keys.METRICS][keys.FEDERAGE_BETA]

