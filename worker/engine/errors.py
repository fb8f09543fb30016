"""User-facing errors of the engine.

Every failure a user can cause is one of these, with a message meant to be read by that user: it says what
is wrong and where (a file, a node, an option). The CLI prints ``str(error)`` on one line; the service
stores it as the failed job's error and maps ``field`` to the name of the bad request field.
"""
from __future__ import annotations


class MirserveError(Exception):
    """Base class: a problem with the user's input or request, not a bug of the engine."""

    #: Which option or request field the error is about, when it is about one ("places", "input_shapes").
    field: str | None = None

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        if field is not None:
            self.field = field


class OptionsError(MirserveError):
    """An option is malformed or names something that does not exist (a place, a pass, an input)."""


class PlaceError(OptionsError):
    field = "places"


class ModelError(MirserveError):
    """The model file is missing, unreadable, not ONNX, invalid, or beyond the configured limits."""

    field = "model"


class UnsupportedOpsError(MirserveError):
    """Some ops have no kernel in any valid place."""


class PassError(MirserveError):
    """A pass failed on this model; the message names the pass and the node."""


class VerificationError(MirserveError):
    """The optimized model does not compute what the input model computed."""


class InternalError(Exception):
    """A bug in the engine or in a plugin, not something the user did: the pass it happens in is undone and the
    run goes on without it (unless the run is strict). ``node`` is the node it happened at, when known."""

    def __init__(self, message: str, *, node=None):
        super().__init__(message)
        self.node = node
