"""The workspace store: a run's turns as snapshots in a git object store
(:mod:`.snapshots`, :mod:`.scan`, :mod:`.git_objects`, :mod:`.git_run`), seeding from a
repository or an archive (:mod:`.seeding`, :mod:`.archives`), exports (:mod:`.export`) and
the file operations that follow no link (:mod:`.safe_fs`). It knows no backend."""
