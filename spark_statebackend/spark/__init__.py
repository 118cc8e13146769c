"""What a Spark application sees: how it enables the backend, and how its driver gets a query's
checkpoint location back.

Start-up (the plugin and configure(); README "Using it"):
  [S1] the job sets the conf keys: the jar on spark.jars, the plugin on spark.plugins, the
       spark.statebackend.* keys (../settings.py: every key, its default and meaning). From PySpark,
       `spark_statebackend.configure()` sets them on a builder and checks them at once (enable.py).
  [S2] the plugin's driver half runs `python -m spark_statebackend.spark.validate` (validate.py: every
       key, then the blob store and the checkpoint log are contacted; a failure fails the application
       naming the key), checks the Spark version (compat.py here, SignatureCheck in the JVM), installs
       the checkpoint file manager and the progress listener and starts the driver's sidecar
       (runtime/sidecar.py). Each executor's plugin starts that executor's sidecar.
  [S3] `spark_statebackend.status(spark, query)` reads what the driver's sidecar publishes about a
       query (query_status.py); the plugin's progress listener puts the same figures into each of the
       query's StreamingQueryProgress, `observedMetrics["statebackend"]` (jvm-bridge ProgressFigures).

Driver-side restore of a checkpoint location (driver_restore.py decides, rebuild.py writes the
location's files; location.py knows Spark's files):
  [D1] a query starts on a checkpoint location (Spark's `createCheckpointDirectory()`), or a reader
       that is not a query reads one: the JVM (DriverHooks) writes a checkpoint-location request to the
       driver's spool and waits up to restoreTimeout; the driver's sidecar serves it
       (runtime/restore_loop.py). `spark-statebackend restore-checkpoint` runs [D2]-[D5] by hand. A
       starting query's location with a symlink among Spark's files (or as `_statebackend/`) is refused,
       naming it (location.py `check_no_symlinks`): its checkpoints never follow one. The location
       itself may be a symlink or a mount point. A location on another Hadoop scheme (`s3a://`,
       `hdfs://`, ...: docs/how-it-works.md "Remote checkpoint locations") is durable itself and
       holds Spark's metadata, so [D2]-[D5] never run for it: the JVM only checks that the plugin
       wrapped the scheme's file system (else the start fails naming the scheme and
       `remoteSchemes`), and its state stores' files are kept in local mirrors that executors fill
       from the blob store ([E1]-[E5]). Its batches have no `_driver` snapshot and no plans.
  [D2] find the query: Spark's `metadata` file, else the query locator the committer wrote to the
       blob store for this path; neither: the location is fresh, Spark starts the query.
  [D3] read the query's latest CheckpointV2 (batch N) from the log. None: fresh. The location at N or
       ahead of it (Spark committed batches after N here: a crash, a kill, a run without the backend,
       an offline repartition), or N without a `_driver` snapshot: Spark's own files are used as they
       are. Never rolled back: Spark's offsets after N are plans a sink may have committed output for
       by batch id, and dropping them would make Spark plan those batches again with other input
       (README "Exactly once"); a task that needs a version no checkpoint holds restores it from its
       upload report (runtime/ [E2]). A location without them (a new driver host, the driver's disk
       lost) gets them back from the batch plans stored since N ([D4]).
  [D4] take the newest restorable checkpoint: the latest, else the retained ones newest first, never
       across an offline repartition (every marker a SnapshotIndex of the query and its store,
       lifecycle/markers.py; each `_driver` snapshot verified in full, each store's SnapshotIndex
       loaded and its file blobs checked); a fallback is written to the log as a copy so
       the committer and the executors continue from it. None restorable: Spark's own files if the
       location has them, else RestoreError (a query never starts from wrong or empty state). Spark's
       entries beyond the chosen checkpoint N (`commits/` after N, `offsets/` after N+1) are never
       deleted: the start is refused naming them (`offsets/<N+1>` stays: Spark re-runs it). Restore
       its `_driver` snapshot into a scratch dir inside the location, `_statebackend/driver-restore/`,
       so on its file system whatever its layout (engine/ [R1]-[R6]; crash point `during_restore`: the
       next start removes a stale scratch dir, never following a symlink, and redoes the rebuild).
       Then the batch plans M = N+1, N+2, ... that exist consecutively (runtime/ [C0],
       lifecycle/plans.py) are written over it, oldest first (rebuild.py `place_plans`): their `offsets/<M>`,
       `commits/<M-1>` and source metadata, so Spark re-runs the newest planned batch K with the
       offsets it gave it, on state version K, which executors restore from its upload report
       (runtime/ [E2]; none: the load fails naming query, store and version, never older state). A
       plan that cannot be read fails the start naming its blob; plans after a gap (batches Spark
       plans again) are deleted, a WARNING naming each.
  [D5] move the scratch files into the location (rebuild.py) without following any symlink below it (by
       rename, or a synced copy renamed into place where a dir below it is another mount; Hadoop's stale
       `.crc` of each replaced file dropped; `commits/` last, so a move cut short leaves the location behind
       its checkpoint, never a commit without its offsets), and create every store dir of the checkpoint.
       Spark resumes at batch N+1 (or the newest planned batch); each executor restores its stores when it
       loads them (runtime/ [E1]-[E5]), or, with a local master, the driver's sidecar restores them all at
       once, ahead of the tasks.

Export, the way back to Spark's own provider (export.py, [X1]-[X5]; `spark-statebackend export`):
the driver-side restore above for Spark's files, then every store written at the state version the
location's newest commit needs, so the query runs on without the backend (docs/operations.md
"Disabling the backend"). hadoop_export.py does it for a location on any Hadoop file system, through
a SparkSession's JVM ([H1]-[H3]).
"""

from .enable import jar_path

__all__ = ["jar_path"]
