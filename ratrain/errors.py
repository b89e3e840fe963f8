"""Exceptions raised by ratrain. Messages name the file, field or value that is wrong."""
from rtcommon.errors import UserError


class RatrainError(UserError):
    """Base class for bad input to the planner, simulator or model loader."""


class ConfigError(RatrainError):
    """A model config, platform file or parallel configuration is malformed or unsupported."""


class DivergedError(RatrainError):
    """A training run produced a non-finite loss: there is no curve to compare."""
