"""The one error hierarchy: every error a user can meet derives from :class:`BarrierflowError`.

Library errors (delta-rs, Spark, the file system) are wrapped so that messages say what was wrong and what is allowed.
"""

from __future__ import annotations

__all__ = [
    "BarrierflowError", "ConfigurationError", "EngineUnavailableError", "PipelineDefinitionError", "SchemaEvolutionError",
    "UserFunctionError", "UnknownPipelineError", "ParameterError", "StorageError", "CheckpointError", "EpochInProgressError",
    "CommitConflictError", "FencedError", "LeaseLostError", "PipelineStoppedError", "SavepointError",
    "IncompatibleSavepointError", "QueryError", "SourceError", "BlockedInputError", "InjectedFault",
]  # fmt: skip


class BarrierflowError(Exception):
    """Base class of every barrierflow error."""


class ConfigurationError(BarrierflowError):
    """A setting (warehouse, master, environment variable) is invalid."""


class EngineUnavailableError(BarrierflowError):
    """The Spark engine (a Spark Connect server) does not answer at its address; a retry may succeed."""


class PipelineDefinitionError(BarrierflowError):
    """A pipeline is declared inconsistently (duplicate operator ids, bad types)."""


class SchemaEvolutionError(PipelineDefinitionError):
    """The code's output no longer fits a table's stored schema (:mod:`barrierflow.core.schema_evolution`); raised before the vote."""


class UserFunctionError(BarrierflowError):
    """A user's Python function raised, or returned rows that do not fit its declaration.

    Raised on the executors, naming the operator; the epoch fails before its vote and a retry replays the same barrier.
    """


class UnknownPipelineError(BarrierflowError):
    """No pipeline of that name is registered."""


class ParameterError(BarrierflowError):
    """A pipeline parameter is missing, unknown, or of the wrong type."""


class StorageError(BarrierflowError):
    """Reading or writing the warehouse failed."""


class CheckpointError(BarrierflowError):
    """The checkpoint log is inconsistent or an epoch cannot proceed."""


class EpochInProgressError(CheckpointError):
    """Another attempt holds the pipeline's epoch lease."""


class CommitConflictError(CheckpointError):
    """A Delta commit lost a race that re-reading the table could not resolve."""


class FencedError(CheckpointError):
    """This attempt is stale: a newer epoch or lineage has committed."""


class LeaseLostError(FencedError):
    """This process's epoch lease expired or was taken over: it must not commit anything more."""


class PipelineStoppedError(CheckpointError):
    """The pipeline was stopped with a savepoint; restore it to resume."""


class SavepointError(CheckpointError):
    """A savepoint cannot be created, found, restored or disposed."""


class IncompatibleSavepointError(SavepointError):
    """A restore point does not match the pipeline's current operators and state.

    ``dropped``: state (``operator_id/state``) the restore point has and the code has not (or with another
    schema); ``missing``: state the code declares and the restore point lacks.
    """

    def __init__(self, message: str, dropped: list[str], missing: list[str]) -> None:
        super().__init__(message)
        self.dropped = dropped
        self.missing = missing


class QueryError(BarrierflowError):
    """A SQL query over the pipeline's tables failed."""


class SourceError(BarrierflowError):
    """A source cannot be read or planned (missing directory, changed table)."""


class BlockedInputError(SourceError):
    """Input no retry can read as it is (a late file refused, a barrier's file gone, a Delta source changed incompatibly).

    The pipeline is blocked until someone acts: Airflow fails the task at once instead of retrying.
    """


class InjectedFault(BarrierflowError):
    """Raised by the fault hook when asked to fail softly (tests only)."""
