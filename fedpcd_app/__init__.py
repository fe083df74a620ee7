"""Fairness-aware federated aggregation on Flower: the ServerApp side.

Import-light on purpose: the ClientApp and the pure-maths modules import constants
from here without pulling in the server loop.
"""
