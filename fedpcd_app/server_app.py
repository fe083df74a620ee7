"""The ServerApp's entry point under its published name: ``fedpcd_app.server_app:app``
(pyproject's ``[tool.flwr.app.components]``, read by ``flwr run`` and outside scripts).
The ServerApp itself is :mod:`fedpcd_app.server.server_app`. On an install without the
'server' extra (a SuperNode's base install) loading it stops with one line naming the extra."""

from fedcore import extras

extras.require("server", "the ServerApp (fedpcd_app.server_app:app)")

from fedpcd_app.server.server_app import app  # noqa: E402 - after the check: it imports the extra's packages

__all__ = ["app"]
