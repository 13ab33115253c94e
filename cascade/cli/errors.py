"""How the command line reports a mistake the user can fix: a few lines naming the file, flag,
variable or port and what to do, exit status 2 (usage) or 1 (configuration), no traceback.

``main`` catches the classes of ``user_errors()``; ``--log-level debug`` (or
``CASCADE_LOG_LEVEL=debug``) lets them through with their traceback.
"""

from __future__ import annotations

USAGE = 2
CONFIGURATION = 1


class UsageError(Exception):
    """Flags that do not go together, or a flag value out of range: exit status 2."""


class ConfigError(Exception):
    """A configuration the command cannot run with (a taken port, say): exit status 1."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that are the user's to fix. Imported when an error is being reported,
    so that the parser stays light."""
    from cascade.clef.release import ReleaseError
    from cascade.errors import StartupRefused
    from cascade.eval.data import DataError
    from cascade.laya.config import CheckpointError
    from cascade.policy.calibration import CalibrationError
    from cascade.policy.files import PolicyError
    from cascade.settings import SettingsError

    return (
        UsageError,
        ConfigError,
        SettingsError,
        PolicyError,
        CheckpointError,
        CalibrationError,
        ReleaseError,
        DataError,
        StartupRefused,
        FileNotFoundError,
        IsADirectoryError,
        NotADirectoryError,
        PermissionError,
        FileExistsError,
    )


def describe(command: str, exc: BaseException) -> str:
    """The lines to print for ``exc`` raised by ``cascade COMMAND``; a file error names its
    file."""
    from cascade.policy.files import PolicyError

    if isinstance(exc, PolicyError):  # FILE:LINE: error: lines, as `cascade policy check` prints
        return "\n".join(exc.messages)
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = str(getattr(exc, "message", None) or exc)
    return f"cascade {command}: error: {text}"


def status(exc: BaseException) -> int:
    return USAGE if isinstance(exc, UsageError) else CONFIGURATION
