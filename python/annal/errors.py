"""The exceptions annal raises.

Every engine error is an :class:`AnnalError`. The class is named like the Rust variant
(``annal::Rejection`` or ``annal::Error``) and carries the variant's fields as
attributes (``expected``, ``actual``, ``session``, ...), also collected in ``fields``.

- :class:`Rejected`: the command broke a rule; nothing was written. Fix the request, or
  re-read state and retry.
- :class:`DataError`: stored data failed verification; the engine fails closed (run
  ``annal verify``).
- :class:`Unavailable`: the engine cannot write now (closed, poisoned by an I/O failure,
  a storage error); reopen the database.
- :class:`ConfigurationError`: the database cannot be opened as asked (format, limits,
  chain key).
"""

from __future__ import annotations

from typing import Any


class AnnalError(Exception):
    """Base class of every annal error."""

    message: str
    fields: dict[str, Any]

    def __init__(self, message: str = "", **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self):  # picklable with its fields
        return (_rebuild, (type(self), self.message, self.fields))


def _rebuild(cls: type, message: str, fields: dict[str, Any]) -> AnnalError:
    return cls(message, **fields)


class Rejected(AnnalError):
    """The command was refused; nothing was written."""


class DataError(AnnalError):
    """Stored data failed verification, or a record does not fit a page."""


class Unavailable(AnnalError):
    """The engine cannot serve the call now; reopen the database."""


class ConfigurationError(AnnalError):
    """The database cannot be opened with these options or this binary."""



# Rejections (annal::Rejection), with their fields.
class NotFound(Rejected):
    """No such session. Fields: ``session``."""
    session: str


class AlreadyExists(Rejected):
    """A session with this id exists. Fields: ``session``."""
    session: str


class Archived(Rejected):
    """The session is archived; revive it first. Fields: ``session``."""
    session: str


class NotArchived(Rejected):
    """Revive of a session that is not archived. Fields: ``session``."""
    session: str


class RevisionConflict(Rejected):
    """The expected revision is not the head. Fields: ``expected``, ``actual`` (hex)."""
    expected: str
    actual: str


class VersionConflict(Rejected):
    """The expected stream seq is not the session's. Fields: ``expected``, ``actual``."""
    expected: int
    actual: int


class Busy(Rejected):
    """Another worker holds the lease. Fields: ``holder``, ``expires_at_ms``."""
    holder: str
    expires_at_ms: int


class Fenced(Rejected):
    """The token is not the current lease token. Fields: ``presented``, ``current``."""
    presented: int
    current: int


class InputConflict(Rejected):
    """The input id was queued with other content. Fields: ``input_id``."""
    input_id: str


class UnknownInput(Rejected):
    """No such input. Fields: ``input_id``."""
    input_id: str


class InputState(Rejected):
    """The input is in the wrong state. Fields: ``input_id``, ``state``."""
    input_id: str
    state: str


class UnknownClaim(Rejected):
    """No such claim. Fields: ``claim``."""
    claim: int


class TurnNotLive(Rejected):
    """The turn is not live. Fields: ``turn_id``."""
    turn_id: str


class NotIdle(Rejected):
    """The session is running a turn. Fields: ``turn_id``."""
    turn_id: str


class TurnConflict(Rejected):
    """The turn id was committed with other content. Fields: ``turn_id``."""
    turn_id: str


class ContextNotPending(Rejected):
    """The context key is not pending. Fields: ``key``."""
    key: str


class ContextConflict(Rejected):
    """The context key exists with other content. Fields: ``key``."""
    key: str


class InvalidRequest(Rejected):
    """The request is malformed. Fields: ``reason``."""
    reason: str


class LimitExceeded(Rejected):
    """A configured limit was exceeded. Fields: ``limit`` (its name), ``actual``, ``max``."""
    limit: str
    actual: int
    max: int


class InvalidRange(Rejected):
    """A rewrite range does not fit the transcript. Fields: ``start``, ``end``, ``len``."""
    start: int
    end: int
    len: int


class NoChange(Rejected):
    """The result equals the current head."""


class UnknownRevision(Rejected):
    """The revision is unknown in this session. Fields: ``revision``."""
    revision: str


class IndexOutOfBounds(Rejected):
    """A fork index past the transcript. Fields: ``index``, ``len``."""
    index: int
    len: int


class ToolConflict(Rejected):
    """The tool operation exists with another value. Fields: ``op_id``, ``field``."""
    op_id: str
    field: str


class ToolOrphan(Rejected):
    """A tool result without a call. Fields: ``op_id``."""
    op_id: str


class UnknownToolOp(Rejected):
    """No such tool operation. Fields: ``op_id``."""
    op_id: str


class InvalidImport(Rejected):
    """An import was refused. Fields: ``seq``, ``reason``."""
    seq: int
    reason: str


class SessionConflict(Rejected):
    """The session exists here with another history. Fields: ``session``."""
    session: str


class ForkParentMissing(Rejected):
    """A copied fork's parent is missing. Fields: ``session``, ``parent``."""
    session: str
    parent: str


class ForkParentMoved(Rejected):
    """A copied fork's parent moved. Fields: ``session``, ``parent``."""
    session: str
    parent: str


class Batch(Rejected):
    """A batch member was refused. Fields: ``index``, ``rejection`` (an exception)."""
    index: int
    rejection: Rejected


class Purged(Rejected):
    """The session was purged. Fields: ``session``, ``seq`` (of its tombstone)."""
    session: str
    seq: int


class HasForks(Rejected):
    """A purge of a session with fork descendants that are not purged. Fields:
    ``session``, ``forks`` (their ids)."""
    session: str
    forks: list[str]


# Errors (annal::Error).
class OversizedRecord(DataError):
    """A record is over the page budget. Fields: ``seq``, ``size``, ``max_bytes``."""
    seq: int
    size: int
    max_bytes: int


class OversizedMessage(DataError):
    """A message is over the page budget. Fields: ``position``, ``size``, ``max_bytes``."""
    position: int
    size: int
    max_bytes: int


class Corrupt(DataError):
    """Stored data failed verification. Fields: ``location``, ``detail``."""
    location: str
    detail: str


class Decode(DataError):
    """A record could not be decoded. Fields: ``seq``, ``detail``."""
    seq: int
    detail: str


class InvalidLimits(ConfigurationError):
    """The limits are unusable. Fields: ``limit``, ``detail``."""
    limit: str
    detail: str


class UnsupportedFormat(ConfigurationError):
    """The file's format is newer than this binary. Fields: ``found``, ``supported``."""
    found: int
    supported: int


class MigrationRequired(ConfigurationError):
    """The file must be migrated (``annal migrate``). Fields: ``found``, ``supported``."""
    found: int
    supported: int


class KeyMismatch(ConfigurationError):
    """The chain key does not match the file. Fields: ``detail``."""
    detail: str


class Poisoned(Unavailable):
    """An earlier I/O failure stopped the writer; reopen the database."""


class Closed(Unavailable):
    """The database is closed."""


class Storage(Unavailable):
    """The storage layer failed. Fields: ``detail``, and ``kind``: the kind of failure
    the file system reported (``"StorageFull"`` for a full disk, ``"PermissionDenied"``,
    ``"NotFound"``, ...), or ``None`` when it did not come from one."""
    detail: str
    kind: str | None


class Backend(Unavailable):
    """The shared log a host appends to failed (a host of a shared log only); the command
    may or may not have been stored, and a retry of an idempotent one is safe. Fields:
    ``detail``."""
    detail: str


__all__ = [name for name, value in list(globals().items()) if isinstance(value, type) and issubclass(value, AnnalError)]
