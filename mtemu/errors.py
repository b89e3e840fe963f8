"""Exceptions raised by the emulator. Every message names what is wrong and where."""
from rtcommon.errors import UserError


class MtemuError(UserError):
    """Base class: bad input or a program the machine refuses."""


class PlatformError(MtemuError):
    """A platform spec field is missing, unknown or out of range."""


class AssemblyError(MtemuError):
    """The assembler refused a program (names bundle, unit and operand)."""


class CapacityError(MtemuError):
    """A tile choice does not fit a memory (names the memory and the bytes over)."""


class MachineError(MtemuError):
    """A fault while executing (names DSP, PC, unit and address)."""
