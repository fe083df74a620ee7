"""Which client piece a method needs from a foreign ClientApp, in one line each: what a server
prints when every reply of a round lacks what its method reads.

A ClientApp built from Flower's quickstart (load ``msg.content["arrays"]``, train, reply with the
model and ``{"train_loss", "num-examples"}``) runs plain SGD and sends no method field. For the
methods below that is not enough: the strategy drops every reply (FedeRage without
``federage-beta``, SCAFFOLD without ``scaffold-delta-c``, FedNova without ``num-steps``, q-FFL,
AFL, FedFV, FedLF and TERM without ``loss-before``, FedFa without ``fedfa-accuracy``), or, where the
server cannot tell, the run silently becomes another method (FedProx without the proximal term and
PropFair without its log utility are FedAvg; Ditto without the personal model scores the global
model). The piece that sends it is
:class:`client_app.foreign.ClientSide` (docs/library.md, "Client side for your own ClientApp").

This module imports nothing (no torch, no Flower): a strategy imports it to name the piece in
its error line (``how_to_send(strategy.name, reason)``)."""

from __future__ import annotations

PIECE = "client_app.foreign.ClientSide"
DOC = "docs/library.md, 'Client side for your own ClientApp'"

_SIDE = "side = ClientSide(msg, context, model)"
_DATA = "side = ClientSide(msg, context, model, data=trainloader)"
_STEP = "train each batch with side.step(x, y)"
_REPLY = "return side.reply(metrics)"

# method (the strategy's registered name) → how a quickstart-style ClientApp adds what it lacks
CLIENT_PIECES: dict[str, str] = {
    "federage": (f"FedeRage's clients train on the CVaR-weighted loss and send their β ('federage-beta'): in the "
                 f"ClientApp's train handler, {_SIDE}; {_STEP} (or loss = side.loss(logits, y) and "
                 f"side.before_step() in your own loop); {_REPLY}  ({PIECE}; {DOC})"),
    "scaffold": (f"SCAFFOLD's clients take the corrected step g - c_i + c and send 'scaffold-delta-c' and their "
                 f"step count 'num-steps': in the "
                 f"ClientApp's train handler, {_SIDE}; {_STEP} (plain SGD; or side.before_step() between "
                 f"loss.backward() and optimizer.step()); {_REPLY}  ({PIECE}; {DOC})"),
    "fedprox": (f"FedProx's clients add the proximal term mu(w - theta_t) ('fedprox-mu' in the request); without it "
                f"the run is FedAvg: in the ClientApp's train handler, {_SIDE}; {_STEP} (or side.before_step() "
                f"between loss.backward() and optimizer.step()); {_REPLY}  ({PIECE}; {DOC})"),
    "fednova": (f"FedNova's clients send their local step count 'num-steps': in the ClientApp's train handler, "
                f"{_SIDE}; {_STEP} (or call side.before_step() once per step in your own loop); {_REPLY}  "
                f"({PIECE}; {DOC})"),
    "propfair": (f"PropFair's clients train on the log utility -log(1 - f/M) of each batch's loss ('propfair-base' "
                 f"M, 'propfair-epsilon' in the request); without it the run is FedAvg: in the ClientApp's train "
                 f"handler, {_SIDE}; {_STEP} (or loss = side.loss(logits, y) in your own loop); {_REPLY}  "
                 f"({PIECE}; {DOC})"),
    "fedfa": (f"FedFa's clients send 'fedfa-accuracy', the received model's accuracy on their training data before "
              f"training, and train with SGD momentum gamma ('fedfa-gamma'): in the ClientApp's train handler, "
              f"{_DATA} (before training); {_STEP} (side.momentum for an optimizer of your own); {_REPLY}  "
              f"({PIECE}; {DOC})"),
    "ditto": (f"Ditto's clients keep a personal model (trained with the pull lambda(v - theta_t), 'ditto-lambda') "
              f"and are scored on it: in the train handler, {_SIDE}; {_STEP}; {_REPLY}; in the evaluate "
              f"handler, score evaluation_model(msg, context, model)  ({PIECE}; {DOC})"),
}
_LOSS_BEFORE = (f"{{name}}'s clients send 'loss-before', the received model's loss on their training data before "
                f"training: in the ClientApp's train handler, {_DATA} (before training); {_REPLY}  ({PIECE}; {DOC})")
for _name, _label in (("qffl", "q-FFL"), ("afl", "AFL"), ("fedfv", "FedFV"), ("fedlf", "FedLF"), ("term", "TERM")):
    CLIENT_PIECES[_name] = _LOSS_BEFORE.format(name=_label)

# a reply field → how to send it, for a method whose own line does not name it (``loss-before`` asked
# of any method by ``loss_before=True``)
FIELD_PIECES: dict[str, str] = {
    "loss-before": _LOSS_BEFORE.format(name="This strategy").replace("This strategy's clients send",
                                                                    "This strategy asks for"),
    "num-steps": CLIENT_PIECES["fednova"].replace("FedNova's clients send", "This strategy asks for"),
    "federage-beta": CLIENT_PIECES["federage"],
    "scaffold-delta-c": CLIENT_PIECES["scaffold"],
    "fedfa-accuracy": CLIENT_PIECES["fedfa"],
}


def how_to_send(method: str, reason: str | None = None) -> str | None:
    """The one line that tells a foreign ClientApp how to send what ``method`` (a strategy's
    registered name, e.g. ``"federage"``) needs. With ``reason`` (a drop reason such as
    ``"missing metric 'federage-beta'"``) naming a field: the method's line if it names that field,
    else the field's own line. None when neither the method nor the reason needs a piece."""
    if reason is not None:
        for field, line in FIELD_PIECES.items():
            if f"'{field}'" in reason:
                own = CLIENT_PIECES.get(method, "")
                return own if f"'{field}'" in own else line
    return CLIENT_PIECES.get(method)
