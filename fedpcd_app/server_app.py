"""The ServerApp's entry point under its published name: ``fedpcd_app.server_app:app``
(pyproject's ``[tool.flwr.app.components]``, read by ``flwr run`` and outside scripts).
The ServerApp itself is :mod:`fedpcd_app.server.server_app`."""

from fedpcd_app.server.server_app import app

__all__ = ["app"]
