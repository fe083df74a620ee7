"""Seeded metrics of every registered method on the digits preset (3 rounds), recorded
before the "one contract per method" redesign; ``tests/test_golden.py`` checks that the
code still gives them.

    python -m tests.golden.record fedavg krum   # (re)records these entries, the others untouched
    python -m tests.golden.record --all         # every entry anew
    python -m tests.golden.record --rehash      # another machine: its model hashes (metrics checked)
    python -m tests.golden.record --help        # the options; --list the entries

The final model's bits depend on the numeric environment (torch wheel, BLAS, CPU, threads:
:mod:`tests.golden.environment`), which is recorded beside the numbers in
``tests/golden/environment.json``; the hashes are compared only there. An entry recorded alone on
a machine that differs from it keeps its own fingerprint (its ``environment`` field), so recording
one new method never needs the others rerun. ``--rehash`` moves the
recorded environment to this machine: it reruns every entry, checks the recorded metrics within
the cross-machine tolerances, and replaces only the model's hash and projections and the environment.

What is kept per run: each round's sampled partitions, train loss and the strategy's
diagnostics (timings left out), the final per-client accuracies and the central accuracy,
and the final global model (its sha256, for bit-identity, and 16 fixed random projections
of it in float64, for a 1e-6 comparison).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).with_name("methods.json")
PRESET = {
    "dataset": "digits", "model": "mlp", "partitioner": "dirichlet", "dirichlet-alpha": 0.1,
    "num-clients": 20, "fraction-train": 0.25, "num-server-rounds": 3, "local-epochs": 1,
    "batch-size": 16, "lr": 0.1, "eval-every": 0, "seed": 0, "checkpoint-every": 0,
}
# Variants beyond each method's defaults: settings that reach code paths the defaults do not.
VARIANTS = {
    "fedpcd-tau0.5": {"method": "fedpcd", "fedpcd-tau": 0.5},
    "fedpcd-ema": {"method": "fedpcd", "fedpcd-normalize": "ema", "fedpcd-history": 2},
    "ditto-craft": {"method": "ditto", "ditto-aggregator": "craft"},
    "craft-flat": {"method": "craft", "craft-layerwise": False},
    "fedavg-skewed": {"method": "fedavg", "participation": "skewed"},
    # hostile clients and defences: an attack mod, the update clip, central DP, Krum's f
    "fedavg-scale-attack-clip": {"method": "fedavg", "attack": "scale", "attack-fraction": 0.2, "update-clip": 2.0},
    "federage-loss-lie-dp": {"method": "federage", "attack": "loss-lie", "attack-clients": "3,7", "dp": "adaptive",
                             "dp-noise-multiplier": 0.2, "dp-clipping-norm": 0.5},
    "krum-label-flip": {"method": "krum", "krum-num-malicious": 1, "attack": "label-flip", "attack-fraction": 0.2},
}
_SKIP = ("seconds",)


def runs() -> dict[str, dict]:
    from strategies import registry

    out = {name: {"method": name} for name in registry.names()}
    out.update(VARIANTS)
    return out


def projections(flat: np.ndarray) -> list[float]:
    rng = np.random.default_rng(12345)
    return (rng.standard_normal((16, flat.size)) @ flat.astype(np.float64)).tolist()


def flat_model(arrays) -> np.ndarray:
    return np.concatenate([a.numpy().ravel() for a in arrays.values()]).astype(np.float32)


def run_one(overrides: dict, out_dir: str) -> dict:
    """One seeded run through the app's round loop on an in-process grid; what it recorded."""
    from tests.golden.harness import run_in_process

    arrays, rounds, summary = run_in_process({**PRESET, **overrides, "output-dir": out_dir})
    flat = flat_model(arrays)
    return {
        "rounds": [
            {
                "sampled": r["sampled"],
                "train_loss": r.get("train_loss"),
                "strategy": {k: v for k, v in r.get("strategy", {}).items() if not any(s in k for s in _SKIP)},
            }
            for r in rounds
        ],
        "client_acc": summary["client_acc"],
        "mean_acc": summary["mean_acc"],
        "central_acc": summary["central_acc"],
        "model_sha256": hashlib.sha256(flat.tobytes()).hexdigest(),
        "model_projections": projections(flat),
    }


def compare(got: dict, want: dict, *, same_environment: bool, bit_identical: bool = True) -> None:
    """Raise AssertionError unless ``got`` keeps ``want``'s numbers: in the recorded environment the
    metrics within 1e-6 and (``bit_identical``) the model's sha256; elsewhere the tolerances of
    :data:`tests.golden.environment.FOREIGN` and no hash."""
    from tests.golden.environment import FOREIGN

    tol = FOREIGN
    assert [r["sampled"] for r in got["rounds"]] == [r["sampled"] for r in want["rounds"]], "sampled clients"
    rtol_loss = 1e-6 if same_environment else tol["train_loss_rtol"]
    np.testing.assert_allclose([r["train_loss"] for r in got["rounds"]],
                               [r["train_loss"] for r in want["rounds"]], rtol=rtol_loss, atol=1e-7)
    for g, w in zip(got["rounds"], want["rounds"]):
        # every recorded diagnostic is still there; a new one (e.g. fedpcd-outliers) may join
        assert w["strategy"].keys() <= g["strategy"].keys()
        for key, value in w["strategy"].items():
            np.testing.assert_allclose(g["strategy"][key], value, err_msg=key,
                                       rtol=1e-5 if same_environment else tol["strategy_rtol"],
                                       atol=1e-6 if same_environment else tol["strategy_atol"])
    np.testing.assert_allclose(got["client_acc"], want["client_acc"],
                               atol=1e-6 if same_environment else tol["client_acc_atol"])
    np.testing.assert_allclose(got["central_acc"], want["central_acc"],
                               atol=1e-6 if same_environment else tol["central_acc_atol"])
    got_p, want_p = np.asarray(got["model_projections"]), np.asarray(want["model_projections"])
    if same_environment:
        np.testing.assert_allclose(got_p, want_p, rtol=1e-6, atol=1e-6)
        if bit_identical:
            assert got["model_sha256"] == want["model_sha256"], "the final model is no longer bit-identical"
    else:
        rel = float(np.abs(got_p - want_p).max() / max(np.linalg.norm(want_p), 1e-12))
        assert rel <= tol["projection_rel_norm"], (
            f"the final model moved {rel:.3g} of its projections' norm (> {tol['projection_rel_norm']} "
            "allowed across environments)")


def entry_environment(entry: dict) -> dict:
    """The environment an entry's hash was recorded in: its own (an entry recorded alone on a
    machine other than the file's) or the file's (:func:`tests.golden.environment.recorded`)."""
    from tests.golden import environment

    return entry.get("environment") or environment.recorded()


def parser():
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m tests.golden.record",
        description="Record the seeded golden numbers of tests/test_golden.py (tests/golden/methods.json). "
                    "Name the entries to record; the others are left as they are.",
        epilog="An entry recorded on a machine whose numeric environment differs from the file's "
               "(tests/golden/environment.json) keeps that machine's fingerprint beside it, so its hash "
               "is compared only there and the other entries keep theirs; elsewhere the suite compares "
               "it within the cross-machine tolerances, as it does every entry.")
    p.add_argument("names", nargs="*", metavar="ENTRY",
                   help="entries to record: a registered method or a variant (see --list)")
    p.add_argument("--all", action="store_true", help="record every entry anew (this machine becomes the file's "
                                                       "environment)")
    p.add_argument("--rehash", action="store_true",
                   help="rerun every entry, check its metrics within the cross-machine tolerances and replace "
                        "only the model's hash and projections (this machine becomes the file's environment)")
    p.add_argument("--list", action="store_true", help="print the entries and whether each is recorded, then exit")
    return p


def main(argv: list[str]) -> int:
    from tests.golden import environment

    args = parser().parse_args(argv)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    entries = runs()
    if args.list:
        for name in sorted(entries):
            print(name, "recorded" if name in golden else "not recorded")
        return 0
    unknown = sorted(set(args.names) - set(entries))
    if unknown:
        print(f"error: no golden entry {', '.join(unknown)}; --list names them (a new method is an entry once "
              "it is registered)", file=sys.stderr)
        return 2
    if sum((bool(args.names), args.all, args.rehash)) != 1:
        print("error: name the entries to record, or give --all or --rehash (one of them); --help says more",
              file=sys.stderr)
        return 2
    here, there = environment.fingerprint(), environment.recorded()
    whole = args.all or args.rehash
    chosen = sorted(entries) if whole else args.names
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            got = run_one(entries[name], f"{tmp}/{name}")
            if args.rehash and name in golden:  # the metrics stay; the model as this machine gives it
                compare(got, golden[name], same_environment=False)
                golden[name]["model_sha256"] = got["model_sha256"]
                golden[name]["model_projections"] = got["model_projections"]
                golden[name].pop("environment", None)
            else:
                if not whole and there and environment.differences(here, there):
                    got["environment"] = here  # its hash belongs to this machine, not the file's
                golden[name] = got
            print(name, golden[name]["mean_acc"], flush=True)
    if whole:
        for entry in golden.values():
            entry.pop("environment", None)
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    if whole or not there:
        environment.save(here)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
