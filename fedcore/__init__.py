"""What the server and the clients share: message keys, the typed run config, seeding,
flat model records, reply validation, method hyperparameters and state trees, and the one door
to Flower's and torch's internals (:mod:`fedcore.internals`).

A leaf: it imports nothing from ``fedpcd_app``, ``strategies`` or ``client_app``
(``tests/test_architecture.py`` checks the import graph)."""
