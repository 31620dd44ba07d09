"""Operations on a pipeline's state and history: savepoints, restores, reprocessing, maintenance, queries."""
