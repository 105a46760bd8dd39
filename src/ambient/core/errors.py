"""Every exception ambient raises on purpose, in one tree, so that every module can raise them without import loops
and a caller can see in one place what it may have to catch.

A module may keep a private control-flow signal of its own (a ``_Name`` raised and caught inside that module,
never seen by a caller); every public exception class lives here (``tests/test_architecture.py`` checks it).

The tree::

    AmbientError                      anything ambient raises on purpose
    ├── InputError                    bad input from a file, a packet or the CLI (exit code 2)
    │   ├── YamlError                 a YAML file that cannot be read safely
    │   ├── UnsafePathError           a path that leaves the brain root or its scope
    │   ├── PacketError               a packet that fails validation
    │   ├── WorkflowError             a workflow document that cannot become a spec
    │   │   └── ActionError           an exit-trigger action that is not an accepted spelling
    │   ├── WorkflowTemplateError     a workflow's ``{{name}}`` template that cannot be rendered
    │   ├── ClaimFileError            a claim file that cannot be used
    │   ├── RunnerConfigError         an agent's runner configuration that does not validate
    │   ├── UnknownEscalationError    no escalation has this id
    │   ├── InvalidOptionError        an answer that is not one of the escalation's options
    │   ├── UnknownRuleError          no learned rule has this id
    │   └── NoSuchGrantError          no such grant to forget
    ├── StateError                    an operation that the current state does not allow
    │   ├── TransitionError           an illegal claim status transition
    │   ├── FencingError              a write carrying a stale fencing token
    │   └── AlreadyAnsweredError      an escalation that is no longer pending
    ├── HistoryError                  a run journal that cannot be folded (also a ValueError)
    ├── LockError                     lock-file mutex failures
    │   ├── LockHeldError             held by another holder (exit code 1)
    │   │   └── LockBusyError         still held after waiting; carries the lock's status
    │   └── LockNotHeldError          release refused: wrong holder or not held (exit code 2)
    ├── UnsupportedFilesystemError    state directory on NFS/CIFS/FUSE
    ├── JournalWriteError             a journal append that did not reach the file (also an OSError)
    ├── NoAnswer                      the daemon took a sent packet but did not answer (also an OSError)
    ├── RunnerError                   an agent runner failed to carry out a SPAWN
    │   ├── SpawnTemplateError        an agent's argv or environment that cannot be rendered from the SPAWN
    │   ├── ImportFromStringError     a ``pkg.module:function`` target that cannot be imported
    │   ├── SetupError                the request's ``before_start`` job failed
    │   ├── StdinError                the SPAWN packet could not be made the agent's stdin (also an OSError)
    │   └── SpawnerLost               the spawner process is gone (also an OSError)
    ├── NotifyError                   a notification could not be delivered
    │   ├── DeliveryError             some targets refused a message; carries the send report
    │   └── TelegramError             a Bot API call failed
    └── AlreadyRunningError           another daemon holds the brain

The classes that are also an ``OSError`` or a ``ValueError`` are so because their callers handle them with the I/O
failures or the bad values they stand for (``except OSError`` around a write, ``except ValueError`` around a fold).
Three carry an object of a higher layer (an escalation, a lock's status, a send report); they are generic in it, as
this module imports nothing of ambient above ``core``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from pydantic import ValidationError

    from ambient.core.problems import Problem

#: The object an error carries for its catcher, from a layer above ``core``.
_Payload = TypeVar("_Payload")


class AmbientError(Exception):
    """Base of every error ambient raises on purpose."""


# --------------------------------------------------------------------------- bad input


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


class WorkflowError(InputError):
    """A workflow document that cannot become a spec; ``loc`` is the key path of the fault."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        loc: tuple[str | int, ...] = (),
        validation: ValidationError | None = None,
    ) -> None:
        self.loc = loc
        self.validation = validation
        super().__init__(message, file=file, line=line)


class ActionError(WorkflowError):
    """An exit-trigger action that is not one of the accepted spellings."""


class WorkflowTemplateError(InputError):
    """A workflow's ``{{name}}`` template that names an unknown variable, is malformed, or renders to something
    refused (a NUL, a runaway length)."""


class ClaimFileError(InputError):
    """A claim file that cannot be used; ``problems`` lists every finding with its line."""

    def __init__(self, problems: list[Problem]) -> None:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(first.message + more, file=first.file, line=first.line)
        self.problems = problems


class RunnerConfigError(InputError):
    """A runner configuration that does not validate; ``problems`` holds every finding with its line."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        first = self.problems[0]
        rest = [str(p) for p in self.problems[1:]]
        message = "\n".join([first.message, *rest])
        super().__init__(message, file=first.file, line=first.line)


class UnknownEscalationError(InputError):
    """No escalation has this id (CLI exit code 2)."""


class InvalidOptionError(InputError):
    """The answer names an option the escalation does not offer; the message lists those it does."""


class UnknownRuleError(InputError):
    """No rule has this id (or the prefix matches several)."""


class NoSuchGrantError(InputError):
    """Nothing to forget: the agent has no such grant (already forgotten elsewhere, or never given)."""


# --------------------------------------------------------------------------- state


class StateError(AmbientError):
    """An operation that the current state does not allow."""


class TransitionError(StateError):
    """An illegal claim transition; nothing was changed."""


class FencingError(StateError):
    """A write whose fencing token is older than the last one accepted (a lease outlived)."""


class AlreadyAnsweredError(StateError, Generic[_Payload]):
    """The escalation is no longer pending (answered, expired or cancelled); nothing was changed.

    ``escalation``: the escalation as it now stands (a :class:`ambient.human.escalations.Escalation`)."""

    def __init__(self, message: str, *, escalation: _Payload) -> None:
        super().__init__(message)
        self.escalation = escalation


class HistoryError(AmbientError, ValueError):
    """A run history that cannot be folded: no ``started`` event first, or a value of the wrong type or range.

    The journal is a file a person (or an attacker) can edit: a value that fails its check is a problem of that run
    (``index``: the 0-based record it is in, mapped to a line by :func:`ambient.engine.journals.journal_problem`),
    never an exception that stops the daemon. Also a ``ValueError``: the fold's callers catch it with the other
    bad values a journal can hold.
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.index = index


# --------------------------------------------------------------------------- locks and files


class LockError(AmbientError):
    """Base of lock-file mutex errors."""


class LockHeldError(LockError):
    """The lock is held by another holder."""


class LockBusyError(LockHeldError, Generic[_Payload]):
    """The lock is held by another holder (after waiting, if asked to wait).

    ``status``: what the lock looked like (a :class:`ambient.claims.lockstate.LockStatus`)."""

    def __init__(self, message: str, status: _Payload) -> None:
        super().__init__(message)
        self.status = status


class LockNotHeldError(LockError):
    """Release refused: the lock is not held by this holder."""


class UnsupportedFilesystemError(AmbientError):
    """The state directory is on a filesystem whose locking cannot be trusted."""


class JournalWriteError(AmbientError, OSError):
    """A write to a journal failed (a full disk); ``rest``: the bytes kept in memory to be written again."""

    def __init__(self, cause: OSError, path: str, rest: bytes) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), path)
        self.rest = rest


class NoAnswer(AmbientError, OSError):
    """The daemon took the request but closed without answering: the packet may or may not be delivered."""


# --------------------------------------------------------------------------- runners


class RunnerError(AmbientError):
    """An agent runner failed to carry out a SPAWN."""


class SpawnTemplateError(RunnerError):
    """An agent's argv template or environment value that cannot be rendered from the SPAWN (unknown name, NUL,
    leading dash, too long, a packet that is not JSON)."""


class ImportFromStringError(RunnerError):
    """A ``"pkg.module:function"`` target that cannot be imported or is not callable."""


class SetupError(RunnerError):
    """The request's ``before_start`` job failed: the agent was not started."""


class StdinError(RunnerError, OSError):
    """The SPAWN packet could not be put where the agent reads its stdin."""


class SpawnerLost(RunnerError, OSError):
    """The spawner process is gone: the agent's start or exit code could not be learned."""


# --------------------------------------------------------------------------- notifications


class NotifyError(AmbientError):
    """A notification could not be delivered to any configured URL."""


class DeliveryError(NotifyError, Generic[_Payload]):
    """At least one target did not accept a message; ``report`` (a :class:`ambient.human.notify.SendReport`) says
    which did and which did not. Made by :func:`ambient.human.notify.delivery_error`, which words the message."""

    def __init__(self, report: _Payload, message: str) -> None:
        self.report = report
        super().__init__(message)


class TelegramError(NotifyError):
    """A Bot API call failed; the message never contains the token."""

    def __init__(self, message: str, *, code: int | None = None, retry_after: float | None = None) -> None:
        self.code = code
        self.retry_after = retry_after
        super().__init__(message)


# --------------------------------------------------------------------------- the daemon


class AlreadyRunningError(AmbientError):
    """Another daemon already runs on this brain."""


class NamespaceTakenError(AmbientError):
    """Another brain's daemon uses this brain's cluster namespace on the NATS server."""
