"""Exceptions factored out so that every module can raise them without import loops.

The tree::

    AmbientError                      anything ambient raises on purpose
    ├── InputError                    bad input from a file, a packet or the CLI (exit code 2)
    │   ├── YamlError                 a YAML file that cannot be read safely
    │   ├── UnsafePathError           a path that leaves the brain root or its scope
    │   └── PacketError               a packet that fails validation
    ├── StateError                    an operation that the current state does not allow
    │   ├── TransitionError           an illegal claim status transition
    │   └── FencingError              a write carrying a stale fencing token
    ├── LockError                     lock-file mutex failures
    │   ├── LockHeldError             held by another holder (exit code 1)
    │   └── LockNotHeldError          release refused: wrong holder or not held (exit code 2)
    ├── UnsupportedFilesystemError    state directory on NFS/CIFS/FUSE
    ├── RunnerError                   an agent runner failed to carry out a SPAWN
    ├── NotifyError                   a notification could not be delivered
    └── AlreadyRunningError           another daemon holds the brain
"""

from __future__ import annotations


class AmbientError(Exception):
    """Base of every error ambient raises on purpose."""


class InputError(AmbientError):
    """Bad input; the message says where (file, line), what is wrong and what is expected."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        self.message = message
        self.file = file
        self.line = line
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line}: " if self.line is not None else f"{self.file}: "
        return f"{where}{self.message}"


class YamlError(InputError):
    """A YAML document that is unsafe or malformed."""


class UnsafePathError(InputError):
    """A path that escapes the brain root (``..``, absolute, NUL, symlink out)."""


class PacketError(InputError):
    """A packet that fails validation (schema or signal → payload rule)."""


class StateError(AmbientError):
    """An operation that the current state does not allow."""


class TransitionError(StateError):
    """An illegal claim transition; nothing was changed."""


class FencingError(StateError):
    """A write whose fencing token is older than the last one accepted (a lease outlived)."""


class LockError(AmbientError):
    """Base of lock-file mutex errors."""


class LockHeldError(LockError):
    """The lock is held by another holder."""


class LockNotHeldError(LockError):
    """Release refused: the lock is not held by this holder."""


class UnsupportedFilesystemError(AmbientError):
    """The state directory is on a filesystem whose locking cannot be trusted."""


class RunnerError(AmbientError):
    """An agent runner failed to carry out a SPAWN."""


class NotifyError(AmbientError):
    """A notification could not be delivered to any configured URL."""


class AlreadyRunningError(AmbientError):
    """Another daemon already runs on this brain."""
