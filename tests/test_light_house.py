"""Issue 51's light house: the run config reaches the ClientApp once, in its ``Context``, and a request
carries only what changes per round or per client (client_app/run_config.py, strategies/requests.py);
and a client method is defined once (client_app/methods), and that one definition trains on the loop,
as rows and in a foreign ClientApp's own loop (``ClientSide``) to the same numbers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from client_app import methods, quickstart, vectorised
from client_app import run_config as run_config_module
from client_app.client_app import train, train_reply
from client_app.foreign import ClientSide
from client_app.methods import LocalTraining, Parts, register_client_method
from client_app.run_config import read_run_config
from client_app.training import batch_indices
from fedcore import flat, keys
from fedcore.config import load_config
from fedcore.seeding import torch_generator
from fedpcd_app.server.config import load_setup
from strategies import Ditto, FedAvg, FedeRage, FedFa, FedProx, PropFair, Scaffold
from strategies.requests import RunContext, train_requests
from tests.fakegrid import configure_round, flat_of, task_identity

PID = 2


def default_request(overrides=None):
    """(the setup, the round-1 train request to partition PID) as this app's ServerApp builds it."""
    setup = load_setup({"method": "fedpcd", "num-clients": 6, **(overrides or {})})
    context = RunContext(run_config=setup.cfg.as_dict())
    with task_identity():
        (msg,) = train_requests(setup.strategy, 1, ArrayRecord(setup.model.state_dict()), ConfigRecord(),
                                {1000 + PID: PID}, context)
    return setup, msg


def node(run_config) -> Context:
    return Context(run_id=1, node_id=1000 + PID, node_config={keys.PARTITION_ID: PID, "num-partitions": 6},
                   state=RecordDict(), run_config=dict(run_config))


def test_the_default_request_carries_no_run_config_record():
    _, msg = default_request()
    assert keys.RUN_CONFIG not in msg.content
    assert list(msg.content.keys()) == [keys.ARRAYS, keys.CONFIG]
    assert set(msg.content[keys.CONFIG]) == {keys.SERVER_ROUND, keys.ROUND_LR, keys.CLIENT_METHOD,
                                             keys.WANT_LOSS_BEFORE, keys.PARTITION_ID}


def test_a_request_without_the_run_config_trains_by_the_contexts_and_a_changed_one_trains_otherwise():
    setup, msg = default_request()
    with task_identity():
        reply = train(msg, node(setup.cfg.as_dict()))
        again = train(msg, node(setup.cfg.as_dict()))  # the same run config: the same bytes
        longer = train(msg, node({**setup.cfg.as_dict(), "local-epochs": 2}))
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    from client_app.data import load_federated_data
    from client_app.training import num_local_steps

    n = len(load_federated_data(setup.cfg).client_train(PID)[1])
    metrics = reply.content[keys.METRICS]
    assert metrics[keys.NUM_EXAMPLES] == n
    assert metrics[keys.NUM_STEPS] == num_local_steps(n, setup.cfg.batch_size, setup.cfg.local_epochs)
    assert flat_of(reply.content[keys.ARRAYS]).tobytes() != flat_of(msg.content[keys.ARRAYS]).tobytes()  # it trained
    assert flat_of(again.content[keys.ARRAYS]).tobytes() == flat_of(reply.content[keys.ARRAYS]).tobytes()
    # the Context's run config, not anything in the request, decides how the client trains
    assert longer.content[keys.METRICS][keys.NUM_STEPS] == 2 * metrics[keys.NUM_STEPS]
    assert flat_of(longer.content[keys.ARRAYS]).tobytes() != flat_of(reply.content[keys.ARRAYS]).tobytes()


def test_an_empty_context_run_config_is_one_line_saying_how_to_start_the_run():
    _, msg = default_request()
    with pytest.raises(ValueError) as err:
        read_run_config(node({}), msg)
    assert "\n" not in str(err.value) and "Context.run_config is empty" in str(err.value)
    assert "flwr run" in str(err.value) and "run_config=" in str(err.value)


def test_the_run_config_is_parsed_once_per_run_not_per_message(monkeypatch):
    cfg = load_config({"num-clients": 6, "seed": 11})
    calls = []
    real = run_config_module.parse_run_config
    monkeypatch.setattr(run_config_module, "parse_run_config", lambda raw: calls.append(1) or real(raw))
    monkeypatch.setattr(run_config_module, "_parsed", [])
    first = read_run_config(node(cfg.as_dict()))
    # every node's Context holds its own dict of the run's values: one parse, one object for the run
    assert all(read_run_config(node(cfg.as_dict())) is first for _ in range(5))
    assert len(calls) == 1 and first == cfg
    other = read_run_config(node({**cfg.as_dict(), "seed": 12}))
    assert other is not first and other.seed == 12 and len(calls) == 2


def test_a_run_whose_nodes_bring_their_data_sends_what_the_server_learned_and_nothing_else():
    learned = {"input-shape": "1x8x8", "num-classes": 10, "data-mean": "0.3", "data-std": "0.2"}
    started = load_config({"client-data": "node", "eval-mode": "federated", "num-clients": 3}).as_dict()
    settled = RunContext(run_config={**started, **learned}).run_record
    assert dict(settled) == learned and tuple(settled) == keys.NODE_DATA_SETTLED
    assert RunContext(run_config=load_config({}).as_dict()).run_record is None  # partitioned data: no record
    with task_identity():
        from flwr.app import Message

        msg = Message(RecordDict({keys.RUN_CONFIG: settled}), dst_node_id=1, message_type="train")
    cfg = read_run_config(node(started), msg)  # the node's run config leaves them open; the request fills them
    assert (cfg.input_shape, cfg.num_classes, cfg.data_mean, cfg.data_std) == ("1x8x8", 10, "0.3", "0.2")
    assert read_run_config(node(started)).input_shape == ""


# -- one definition per client method: the loop, the rows and ClientSide ------------------------------
N, EPOCHS, BATCH = 50, 2, 16
RTOL = 1e-5  # the rows against the loop: tests/test_vectorised.py's tolerance (float sums in another order)


def client_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    y = torch.randint(quickstart.CLASSES, (N,), generator=g)
    return torch.randn(N, quickstart.FEATURES, generator=g) + y[:, None] * 0.3, y


def net(arrays: ArrayRecord) -> torch.nn.Module:
    model = quickstart.Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    return model


def fresh_node() -> Context:
    return Context(run_id=1, node_id=1000, node_config={keys.PARTITION_ID: 0, "num-partitions": 1},
                   state=RecordDict(), run_config={})


def by_app(request, ctx: Context, execution: str) -> Message:
    """The app's own client side (``train_reply``): on the loop, or as rows (``vectorised``)."""
    x, y = client_data()
    settings = LocalTraining(local_epochs=EPOCHS, batch_size=BATCH, client_execution=execution)
    return train_reply(request, ctx, net(request.content[keys.ARRAYS]), x, y, settings, partition_id=0, seed=0)


def by_piece(request, ctx: Context) -> Message:
    """A foreign ClientApp's own loop with ClientSide, over the loop's batches in the loop's order."""
    x, y = client_data()
    side = ClientSide(request, ctx, net(request.content[keys.ARRAYS]), data=[(x, y)])
    server_round = int(request.content[keys.CONFIG][keys.SERVER_ROUND])
    for idx in batch_indices(N, BATCH, EPOCHS, torch_generator(0, "batches", 0, server_round)):
        side.step(x[idx], y[idx])
    return side.reply({keys.NUM_EXAMPLES: N})


def state_of(ctx: Context) -> dict[str, np.ndarray]:
    return {k.split("@")[0]: flat_of(v) for k, v in ctx.state.items()}


def three_ways(requests, monkeypatch) -> None:
    """Each request through the loop, the rows and ClientSide (one node each, kept across the
    requests): ClientSide equals the loop to the bit; the rows equal it within RTOL (and did train)."""
    rows_ran = []
    real = vectorised.train_rows
    monkeypatch.setattr(vectorised, "train_rows", lambda *a, **k: rows_ran.append(1) or real(*a, **k))
    nodes = {form: fresh_node() for form in ("loop", "rows", "piece")}
    for request in requests:
        with task_identity():
            loop = by_app(request, nodes["loop"], "loop")
            rows = by_app(request, nodes["rows"], "vectorised")
            piece = by_piece(request, nodes["piece"])
        want = flat_of(loop.content[keys.ARRAYS])
        assert want.tobytes() != flat_of(request.content[keys.ARRAYS]).tobytes()  # it trained
        assert flat_of(piece.content[keys.ARRAYS]).tobytes() == want.tobytes()
        scale = max(float(np.abs(want).max()), 1.0)
        assert float(np.abs(flat_of(rows.content[keys.ARRAYS]) - want).max()) <= RTOL * scale
        metrics = {k: v for k, v in dict(loop.content[keys.METRICS]).items() if k != keys.PARTITION_ID}
        assert dict(piece.content[keys.METRICS]) == metrics
        got = dict(rows.content[keys.METRICS])
        assert set(got) == set(loop.content[keys.METRICS]) and got[keys.NUM_STEPS] == metrics[keys.NUM_STEPS]
        for k, v in metrics.items():
            assert abs(float(got[k]) - float(v)) <= RTOL * max(abs(float(v)), 1.0), k
        assert sorted(piece.content) == sorted(rows.content) == sorted(loop.content)
        for record in set(loop.content) - {keys.ARRAYS, keys.METRICS}:
            w = flat_of(loop.content[record])
            assert flat_of(piece.content[record]).tobytes() == w.tobytes()
            assert float(np.abs(flat_of(rows.content[record]) - w).max()) <= RTOL * max(float(np.abs(w).max()), 1.0)
        kept = state_of(nodes["loop"])
        assert state_of(nodes["piece"]).keys() == state_of(nodes["rows"]).keys() == kept.keys()
        for k, w in kept.items():
            assert state_of(nodes["piece"])[k].tobytes() == w.tobytes(), k
            assert float(np.abs(state_of(nodes["rows"])[k] - w).max()) <= RTOL * max(float(np.abs(w).max()), 1.0)
    assert len(rows_ran) == len(requests)  # the rows trained each request (no fallback to the loop)


def _c_nonzero(s):
    s.state.c = torch.linspace(-0.05, 0.05, s.spec.dim)


def _beta_hat(s):
    s.state.beta_hat = 0.9


# every registered client method: a strategy that asks for it, and a change between its two rounds
STRATEGIES = {
    keys.SGD: (lambda: FedAvg(lr=0.05, loss_before=True), None),
    keys.FEDPROX: (lambda: FedProx(lr=0.05, mu=0.5), None),
    keys.SCAFFOLD: (lambda: Scaffold(lr=0.05, num_clients=4), _c_nonzero),
    keys.FEDERAGE: (lambda: FedeRage(lr=0.05, alpha=0.3, gamma=0.5, beta_lr=0.2, level="sample"), _beta_hat),
    keys.DITTO: (lambda: Ditto(lr=0.05, lam=0.5), None),
    keys.PROPFAIR: (lambda: PropFair(lr=0.05, base=4.0, epsilon=0.3), None),  # M − f > ε: the log branch
    keys.FEDFA: (lambda: FedFa(lr=0.05, gamma=0.7), None),  # the accuracy before training; momentum γ
}


def test_every_registered_client_method_is_tested_here():
    assert methods.names() == sorted(STRATEGIES)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_one_definition_trains_the_loop_the_rows_and_client_side_alike(name, monkeypatch):
    """Two rounds (the second with what the node kept, c_i or the personal model, and a changed
    server value, c or β̂) of the method's own strategy."""
    make, between = STRATEGIES[name]
    strategy = make()
    assert strategy.method.client_method == name
    torch.manual_seed(0)
    arrays = ArrayRecord(quickstart.Net().state_dict())
    requests = []
    for server_round in (1, 2):
        if server_round == 2 and between is not None:
            between(strategy)
        (request,) = configure_round(strategy, server_round, arrays, [0])
        requests.append(request)
    three_ways(requests, monkeypatch)


@dataclasses.dataclass(frozen=True, eq=False)
class Shrink:
    """A toy gradient term: coeff·w added to the gradient (a pull towards zero), on the loop and as rows."""

    coeff: float

    @torch.no_grad()
    def add_to(self, model: torch.nn.Module) -> None:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.add_(p, alpha=self.coeff)

    @staticmethod
    def stack(terms, rows, flat_of_rows, params):
        coeff = torch.tensor([0.0 if t is None else t.coeff for t in terms], dtype=params.dtype,
                             device=params.device)[:, None]
        return lambda g, p, m: g + coeff[:m] * p


@pytest.fixture
def toy_method(monkeypatch):
    """A client method registered once, here: a Shrink term read from the request, and a metric."""
    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))

    @register_client_method("toy-shrink")
    def toy(job) -> Parts:
        def finish(_job, outcome, _trained):
            outcome.metrics["toy-steps"] = float(outcome.num_steps)

        return Parts(terms=(Shrink(float(job.config["toy-shrink"])),), finish=finish)

    return "toy-shrink"


def toy_request(client_method: str, server_round: int = 1) -> Message:
    torch.manual_seed(0)
    config = {keys.SERVER_ROUND: server_round, keys.ROUND_LR: 0.05, keys.CLIENT_METHOD: client_method,
              keys.WANT_LOSS_BEFORE: False, "toy-shrink": 2.0}  # as a strategy sends them
    with task_identity():
        return Message(RecordDict({keys.ARRAYS: ArrayRecord(quickstart.Net().state_dict()),
                                   keys.CONFIG: ConfigRecord(config)}), dst_node_id=1000,
                       message_type=MessageType.TRAIN)


def test_a_method_registered_once_trains_on_the_loop_as_rows_and_in_client_side(toy_method, monkeypatch):
    three_ways([toy_request(toy_method), toy_request(toy_method, 2)], monkeypatch)
    with task_identity():
        toy = by_app(toy_request(toy_method), fresh_node(), "loop")
        plain = by_app(toy_request(keys.SGD), fresh_node(), "loop")
    assert toy.content[keys.METRICS]["toy-steps"] == toy.content[keys.METRICS][keys.NUM_STEPS]
    # its term acts: the toy's model is not plain SGD's, and is the smaller one
    assert flat_of(toy.content[keys.ARRAYS]).tobytes() != flat_of(plain.content[keys.ARRAYS]).tobytes()
    assert np.linalg.norm(flat.record_to_flat(toy.content[keys.ARRAYS]).numpy()) < \
        np.linalg.norm(flat.record_to_flat(plain.content[keys.ARRAYS]).numpy())


def test_client_side_names_the_known_methods_for_an_unknown_one():
    with pytest.raises(ValueError, match="unknown client method 'no-such'; known: ditto, federage"):
        ClientSide(toy_request("no-such"), fresh_node(), quickstart.Net())
