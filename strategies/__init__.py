"""Aggregation methods, one module each, and the Flower strategies that run them.

``from strategies import FedPCD, Craft, FedeRage`` — every class is a complete
``flwr.serverapp.strategy.Strategy`` (:class:`strategies.flower.FairStrategy`, the one adapter)
around its method (:class:`strategies.base.Method`: a pure aggregator on the gate's checked
round). The classes named like Flower's (FedAvg, FedProx, FedAvgM, FedAdam, FedYogi, FedAdagrad,
FedMedian, FedTrimmedAvg, Krum, MultiKrum, Bulyan, and QFedAvg = QFFL) take Flower's arguments in
Flower's order. ``strategies.registry`` maps run-config method names to them;
``weighting_of(method, config)`` says how a method weights its clients under a run config
(``data-size``, ``uniform``, ``loss``, ...: ``WEIGHTINGS``).

The names a ClientApp's replies carry are re-exported from :mod:`fedcore.keys` (``keys``, and
the reply metrics as constants: ``NUM_EXAMPLES``, ``TRAIN_LOSS``, ...; docs/library.md, "What a
ClientApp must send (the reply contract)").
"""

from fedcore import keys
from fedcore.keys import (
    EVAL_ACC,
    EVAL_LOSS,
    FEDERAGE_BETA,
    FEDFA_ACCURACY,
    LOSS_BEFORE,
    NUM_EXAMPLES,
    NUM_STEPS,
    NUM_TEST,
    PARTITION_ID,
    SCAFFOLD_DELTA_C,
    TRAIN_LOSS,
)
from strategies.adafed import AdaFed
from strategies.afl import AFL
from strategies.base import Method
from strategies.config_fl import ConFIG
from strategies.craft import Craft
from strategies.ditto import Ditto
from strategies.fedavg import FedAvg
from strategies.federage import FedeRage
from strategies.fedfa import FedFa
from strategies.fedfv import FedFV
from strategies.fedheal import FedHEAL
from strategies.fedlf import FedLF
from strategies.fedmgda import FedMGDA
from strategies.fednova import FedNova
from strategies.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from strategies.fedpcd import FedPCD
from strategies.fedprox import FedProx
from strategies.fedpw import FedPW
from strategies.flower import FairStrategy
from strategies.propfair import PropFair
from strategies.qffl import QFFL, QFedAvg
from strategies.registry import WEIGHTINGS, weighting_of
from strategies.robust import Bulyan, FedMedian, FedTrimmedAvg, Krum, MultiKrum
from strategies.scaffold import Scaffold
from strategies.term import TERM

__all__ = ["AFL", "AdaFed", "Bulyan", "ConFIG", "Craft", "Ditto", "FairStrategy", "FedAdagrad", "FedAdam",
           "FedAvg", "FedAvgM", "FedFV", "FedFa", "FedHEAL", "FedLF", "FedMGDA", "FedMedian", "FedNova", "FedPCD",
           "FedProx", "FedPW", "FedTrimmedAvg", "FedYogi", "FedeRage", "Krum", "Method", "MultiKrum", "PropFair",
           "QFFL", "QFedAvg", "Scaffold", "TERM", "WEIGHTINGS", "weighting_of",
           # reply names (fedcore.keys)
           "keys", "EVAL_ACC", "EVAL_LOSS", "FEDERAGE_BETA", "FEDFA_ACCURACY", "LOSS_BEFORE", "NUM_EXAMPLES",
           "NUM_STEPS", "NUM_TEST", "PARTITION_ID", "SCAFFOLD_DELTA_C", "TRAIN_LOSS"]
