"""Every strategy class writes its hyperparameters out in its ``__init__`` (no signature rewriting,
no metaclass): ``inspect.signature``, help() and IDEs see them, and a test, not a generator, keeps
them equal to the method's ``Params`` (the one declaration of keys, ranges and meanings)."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc
from abc import ABCMeta

import pytest
import torch

import strategies
from strategies import registry
from strategies.flower import FairStrategy

# The classes named like Flower's take a hyperparameter under Flower's name and under its own: both
# default to None there (one given, else the Params default), Flower's name first, in Flower's place.
FLOWER_NAMES = {"mu": "proximal_mu", "momentum": "server_momentum", "beta1": "beta_1", "beta2": "beta_2",
                "num_malicious": "num_malicious_nodes", "num_select": "num_nodes_to_select"}


@pytest.mark.parametrize("method", registry.names())
def test_the_signature_names_every_hyperparameter_with_its_default(method):
    cls = registry.strategy_class(method)
    params = inspect.signature(cls).parameters
    defaults = cls.Params()
    for f in dataclasses.fields(cls.Params):
        assert f.name in params, f"{cls.__name__}.__init__ does not take its hyperparameter {f.name!r}"
        p = params[f.name]
        assert p.annotation is not inspect.Parameter.empty, (method, f.name)
        if f.name in FLOWER_NAMES:  # a pair: None by default in the signature, the Params default when neither is given
            assert p.default is None and FLOWER_NAMES[f.name] in params
        elif f.metadata.get("nested"):  # another method's Params (Ditto's craft): None means its defaults
            assert p.default is None
        else:
            assert p.default == getattr(defaults, f.name), (method, f.name)
    assert "params" in params and any(p.kind is p.VAR_KEYWORD for p in params.values())  # **common


@pytest.mark.parametrize("method", registry.names())
def test_every_name_of_the_signature_is_accepted_at_its_default(method):
    cls = registry.strategy_class(method)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    kwargs = {n: p.default for n, p in inspect.signature(cls).parameters.items()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not inspect.Parameter.empty}
    strategy = cls(**kwargs, model=net)
    assert strategy.params == cls.Params() and strategy.method.setting.model is net
    assert strategy.params == cls().params  # the defaults are the Params defaults


@pytest.mark.parametrize("method", registry.names())
def test_params_and_keywords_are_one_or_the_other(method):
    cls = registry.strategy_class(method)
    assert cls(params=cls.Params()).params == cls.Params()
    fields = [f for f in dataclasses.fields(cls.Params) if f.type in ("float", "int")]
    if fields:
        f = fields[0]
        changed = getattr(cls.Params(), f.name) + 1
        with pytest.raises(TypeError, match="either params= or keyword"):
            cls(params=cls.Params(), **{f.name: changed})


def test_fedpcd_reads_like_the_paper_in_its_signature():
    sig = inspect.signature(registry.strategy_class("fedpcd"), eval_str=True)
    assert sig.parameters["tau"].default == 0.02 and sig.parameters["history"].default == 10
    assert "tau: float = 0.02" in str(sig)
    text = pydoc.render_doc(strategies.FedPCD, renderer=pydoc.plaintext)
    assert "tau: 'float' = 0.02" in text


def test_no_metaclass_and_no_reflection_in_the_flower_layer():
    """The adapter and every strategy class are plain classes (Flower's Strategy's ABCMeta) whose
    signatures are their own ``__init__``s: nothing rewrites them."""
    for cls in [FairStrategy, *(registry.strategy_class(m) for m in registry.names())]:
        assert type(cls) is ABCMeta, cls
        assert "__signature__" not in vars(cls) and "__init_subclass__" not in vars(cls), cls
    import strategies.flower as adapter

    source = inspect.getsource(adapter)  # (a misspelt keyword's message reads the signatures: nothing rewrites them)
    assert "__signature__" not in source and "metaclass" not in source and "__init_subclass__" not in source


@pytest.mark.parametrize("method", registry.names())
def test_every_hyperparameter_says_what_it_means_in_its_one_declaration(method):
    """The doc= of each hyper() field is what pyproject.toml's comment and the docs' tables read; a
    strategy module's docstring restates no hyperparameter (no hand-written section)."""
    import re
    import sys

    cls = registry.strategy_class(method)
    for key, _, doc, _ in cls.Params.declarations():
        assert doc, f"{key}: give its hyper() field a doc="
    module_doc = sys.modules[cls.__module__].__doc__ or ""
    assert not re.search(r"^Hyperparameters\b", module_doc, flags=re.MULTILINE), \
        f"{cls.__module__}'s docstring has a hand-written Hyperparameters section: move it into the hyper() docs"
