"""Every strategy class has an explicit keyword-only signature (its Params fields, its own
__init__ arguments, FairStrategy's), seen by inspect.signature and help(), and generated from
the declarations, so it cannot drift from them."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc

import pytest
import torch

from fedcore.params import MethodParams, hyper
from strategies import registry
from strategies.base import FairStrategy

COMMON = [n for n in inspect.signature(FairStrategy.__init__).parameters if n not in ("self", "hyper")]


@pytest.mark.parametrize("method", registry.names())
def test_the_signature_is_keyword_only_params_plus_the_common_arguments(method):
    cls = registry.strategy_class(method)
    sig = inspect.signature(cls)
    params = sig.parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values()), sig
    fields = {f.name: f for f in dataclasses.fields(cls.Params)}
    names = list(params)
    assert names[: len(fields)] == list(fields), "the hyperparameters come first, in declaration order"
    assert set(COMMON) <= set(names) and set(cls.app_arguments) <= set(names)
    defaults = cls.Params()
    for name in fields:
        assert params[name].default == getattr(defaults, name), name
        assert params[name].annotation is not inspect.Parameter.empty, name
    # every name of the signature is accepted by the class, at its default: what the signature says works
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    kwargs = {n: (net if n == "model" else p.default) for n, p in params.items() if n not in ("params", "device")}
    strategy = cls(**kwargs)
    assert strategy.params == defaults
    with pytest.raises(TypeError):
        sig.bind(1)  # nothing positional


@pytest.mark.parametrize("method", registry.names())
def test_help_lists_each_hyperparameter_with_its_run_config_key(method):
    cls = registry.strategy_class(method)
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    head = text.split("Method resolution order")[0]
    assert "(**kwargs)" not in head.splitlines()[3]
    for key in cls.Params.run_config_keys():
        assert key in head, key


@pytest.mark.parametrize("method", registry.names())
def test_every_hyperparameter_says_what_it_means_in_its_one_declaration(method):
    """The doc= of each hyper() field is what help(), pyproject.toml's comment and the README read;
    a strategy module's docstring restates no hyperparameter (no hand-written section)."""
    import re
    import sys

    cls = registry.strategy_class(method)
    for key, _, doc, _ in cls.Params.declarations():
        assert doc, f"{key}: give its hyper() field a doc="
    module_doc = sys.modules[cls.__module__].__doc__ or ""
    assert not re.search(r"^Hyperparameters\b", module_doc, flags=re.MULTILINE), \
        f"{cls.__module__}'s docstring has a hand-written Hyperparameters section: move it into the hyper() docs"
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    for f, _ in cls.Params._fields():
        if f.metadata.get("doc"):
            assert " ".join(f.metadata["doc"].split()[:4]) in " ".join(text.split()), (method, f.name)


def test_fedpcd_reads_like_the_paper_in_its_signature():
    sig = inspect.signature(registry.strategy_class("fedpcd"))
    assert sig.parameters["tau"].default == 0.02 and sig.parameters["history"].default == 10
    assert "tau: float = 0.02" in str(sig)


def test_a_params_field_shadowed_by_an_init_argument_is_refused_when_the_class_is_defined():
    @dataclasses.dataclass(frozen=True)
    class Params(MethodParams):
        prefix = "toy"
        seed: int = hyper(3)  # FairStrategy.__init__ takes seed: this field would never be set

    with pytest.raises(TypeError, match=r"\['seed'\].*rename"):
        type("Toy", (FairStrategy,), {"Params": Params})
