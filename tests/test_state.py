"""Checkpoint trees hold fields, never class paths: reading one imports and instantiates only
what the method that owns the state names (fedcore.state, Method.restore)."""

from __future__ import annotations

import dataclasses
import io
import sys

import numpy as np
import pytest
import torch

from fedcore.config import load_config
from fedcore.state import Fields, from_tree, rebuild, to_tree
from strategies import privacy, registry


def through_bytes(tree):
    buf = io.BytesIO()
    torch.save(tree, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def strings_in(tree) -> list[str]:
    if isinstance(tree, dict):
        return [s for k, v in tree.items() for s in (*strings_in(k), *strings_in(v))]
    if isinstance(tree, (list, tuple)):
        return [s for v in tree for s in strings_in(v)]
    return [tree] if isinstance(tree, str) else []


def earlier_format(tree, path: str):
    """The earlier format: every dataclass node named its class by import path."""
    if isinstance(tree, list):
        return [earlier_format(v, path) for v in tree]
    if not isinstance(tree, dict):
        return tree
    out = {k: earlier_format(v, path) for k, v in tree.items()}
    if tree.get("__state__") == "fields":
        out.update({"__state__": "dataclass", "class": path})
    return out


def built(method: str, **extra):
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    return registry.build(load_config({"method": method, **extra}), model=net)


CASES = [(m, {}) for m in registry.names()] + [("ditto", {"ditto-aggregator": "craft"})]


@pytest.mark.parametrize("method, extra", CASES)
def test_every_methods_state_is_saved_as_fields_and_rebuilt_by_the_strategy(method, extra):
    first = built(method, **extra)
    tree = to_tree(first.state)
    assert not [s for s in strings_in(tree) if ":" in s or s.startswith(("strategies.", "fedcore."))], \
        "a class path in the tree"
    resumed = built(method, **extra)
    resumed.state = from_tree(through_bytes(tree))  # what the app does with a checkpoint's state
    assert type(resumed.state) is type(first.state)
    assert str(to_tree(resumed.state)) == str(tree)


def test_a_state_of_the_earlier_format_is_refused_in_one_line_and_its_class_path_not_imported():
    # Prepare: every method's state that holds a dataclass, as the earlier format wrote it (a class path each)
    trees = [earlier_format(to_tree(built(method, **extra).state), "tests.no_such_module_to_import:Evil")
             for method, extra in CASES]
    trees = [through_bytes(t) for t in trees if '"dataclass"' in repr(t).replace("'", '"')]
    assert len(trees) >= 10
    before = set(sys.modules)
    for tree in trees:
        # Execute / Assert: refused, saying why, importing nothing
        with pytest.raises(ValueError, match="earlier checkpoint format") as info:
            from_tree(tree)
        assert "\n" not in str(info.value)
    assert "tests.no_such_module_to_import" not in sys.modules and set(sys.modules) == before


def test_a_moved_state_class_still_loads():
    """The tree does not know its class: a State renamed or moved to another module rebuilds."""

    @dataclasses.dataclass
    class Old:
        lam: np.ndarray
        slots: dict[int, int] = dataclasses.field(default_factory=dict)

    @dataclasses.dataclass
    class Moved:
        lam: np.ndarray
        slots: dict[int, int] = dataclasses.field(default_factory=dict)

    tree = through_bytes(to_tree(Old(np.arange(3.0), {4: 0})))
    new = rebuild(Moved, from_tree(tree))
    assert isinstance(new, Moved) and new.slots == {4: 0} and np.array_equal(new.lam, np.arange(3.0))


@dataclasses.dataclass
class Inner:
    x: torch.Tensor
    n: int = 0


@dataclasses.dataclass
class Outer:
    one: Inner | None
    many: list[Inner]
    by_client: dict[int, Inner]
    pair: tuple[float, int]
    anything: object = None


def test_nested_dataclasses_are_rebuilt_from_the_annotations():
    outer = Outer(Inner(torch.ones(2), 3), [Inner(torch.zeros(1))], {7: Inner(torch.ones(1), 1)}, (0.5, 2))
    got = from_tree(through_bytes(to_tree(outer)), Outer)
    assert isinstance(got.one, Inner) and got.one.n == 3 and isinstance(got.many[0], Inner)
    assert isinstance(got.by_client[7], Inner) and got.pair == (0.5, 2)
    assert isinstance(from_tree(to_tree(outer)), Fields)  # without a class: fields, nothing instantiated


def test_fields_the_class_does_not_have_are_one_line():
    with pytest.raises(ValueError) as exc:
        rebuild(Inner, Fields({"x": torch.ones(1), "gone": 1}))
    assert "['gone']" in str(exc.value) and "\n" not in str(exc.value)


def test_a_stateless_method_refuses_a_checkpoint_with_state():
    with pytest.raises(ValueError, match="keeps no state"):
        built("fedavg").state = Fields({"lam": 1})


def test_central_dp_state_is_rebuilt_too():
    dp = built("fedavg")
    dp.use(privacy.CentralDP(dp.method, privacy.Params(mode="adaptive"), seed=0))
    dp.state = privacy.State(dp.state.inner, 0.25)
    other = built("fedavg")
    other.use(privacy.CentralDP(other.method, privacy.Params(mode="adaptive"), seed=0))
    other.state = from_tree(through_bytes(to_tree(dp.state)))  # the method's state and the clipping norm, whole
    assert isinstance(other.state, privacy.State) and other.state.clipping_norm == 0.25
