"""The runtime: the processes that move state between Spark and the blob store while a job runs.

The JVM shim (jvm-bridge/) and one Python sidecar per JVM (sidecar.py) talk through files in a spool
directory (spool/: the protocol). The sidecar runs three loops, each with its own state: uploads
(upload_loop.py, with staged_events.py, batch_hold.py, diff_bases.py and upload_lag.py), restores
(restore_loop.py, with store_restore.py and restore_ahead.py) and, on the driver, commits
(commit_loop.py feeding committer.py, with checkpoint_build.py, commit_metrics.py, cleanup.py,
upgrades.py and sweeper.py). The steps
below are what the code marks `[C3]`, `[E2]`...; `crash point` names the test-only crash point of the
step (common/crashpoints.py; docs/reliability.md "Crash points").

Plan path: before a batch M runs (driver only; sidecar.mode=process).
  [C0] plan (driver JVM, DriverHooks; driver sidecar, plan_store.py): Spark writes `offsets/<M>`, its
       plan of batch M, after `commits/<M-1>` and the source metadata it writes while planning
       (`sources/**`). Before the write is published the JVM sends the bytes in a plan request and
       waits up to commitTimeout; the sidecar stores them, `commits/<M-1>` and the driver files changed
       since its previous plan of the location as one immutable blob `plans/<query>/<M>`
       (lifecycle/plans.py), never overwritten (the same offsets again: done; other ones: an error).
       Not stored (timeout, fenced, a conflict, the blob store failing): Spark's write fails, and so
       does the batch, naming query, batch and blob. Fenced is what the sidecar's committer last read
       (ownership.py: the latest checkpoint before each write); a plan never reads the checkpoint log,
       so a hanging log holds the query at its commit gate, not at its plan. A zombie driver that has
       not tried a checkpoint since the new owner's first one may still store a plan: whichever plan of
       a batch comes second with other offsets is the conflict above, never a silent loss.
       A rebuild on a new driver host places the plans after its checkpoint (spark/ [D4]). The JVM
       logs the time waited at DEBUG.

Commit path: one micro-batch N of one query, whose stores commit state version v = N+1.
  [C1] task commit (JVM, on the task thread; StoreHooks, CommitGate): Spark closes `<v>.zip` (or, with
       changelog checkpointing, `<v>.changelog`) through the checkpoint file manager the plugin
       installed. Before the close publishes it the commit gate blocks while this executor's oldest
       snapshot of the same query not yet uploaded was staged longer than maxCommitDelay ago (the
       sidecar's `status.json`, per query, upload_lag.py), and fails the commit after commitTimeout.
  [C2] staging (JVM; Recipe, Stager): the version's recipe, exactly the files Spark needs to load it,
       is hard-linked into a staging dir and a snapshot event is written to the spool. With
       durableCommit the event carries a request id and the commit waits until the sidecar answers
       that the version is uploaded and reported ([C4]); such a version is never held for its batch.
       Crash point `after_staging`.
  [C3] upload (sidecar, upload loop): the newest staged version of each store is diffed against the
       store's previous SnapshotIndex (its diff base, checked against the latest checkpoint first),
       its new files and then the new SnapshotIndex are uploaded with a TTL (engine/ [B2]-[B5]), once
       the batch's other stores on this executor are staged or none has been for 2 s (batch_hold.py;
       Spark's snapshots published meanwhile wait for the batch too). A
       failed upload is retried and counts as lag; a snapshot whose checkpoint location or staged dir
       is gone (deleted with its stopped query) is dropped with a WARNING. Crash points `during_file_upload`,
       `before_index_upload`.
  [C4] report (sidecar, upload loop): the SnapshotIndex's blob id, the store's marker, is reported
       under `reports/<query>/<version>/` in the blob store (lifecycle/reports.py); the staged links
       and the event are deleted.
  [C5] checkpoint (driver sidecar, commit loop and committer; the record: checkpoint_build.py): the JVM
       listener hands batch N's progress over (`progress/` in the driver's spool dir); once every store
       instance of the batch has reported, the committer checks every marker (lifecycle/markers.py),
       snapshots the driver's files of the checkpoint location as the store `_driver` (spark/location.py),
       writes the query locator (first checkpoint only) and then CheckpointV2(N): offsets and every marker,
       one record in the checkpoint log. That write is the commit point: nothing is deleted before it, so a
       crash anywhere before leaves the previous checkpoint whole, and the plans of the batches after it
       ([C0]) let a new driver host re-run what Spark planned since. A batch whose stores do not all report
       within commitTimeout, or that a later batch overtakes, is not checkpointed. The committer publishes
       when each query's checkpoints began to fail, and the last cause (checkpoint_lag.py); Spark's commit
       of a running query's next batch (`commits/<N>` on the driver, jvm-bridge DriverHooks and CommitGate)
       waits once that is longer ago than maxCommitDelay and fails after commitTimeout naming the cause, so
       a query whose checkpoints keep failing never runs on without them. Crash points
       `before_checkpoint_write`, `after_checkpoint_write`.
  [C6] cleanup (committer, cleanup.py), only while the checkpoint just written is still the log's
       latest: TTLs of every referenced blob removed, blobs of replaced files and the previous
       SnapshotIndex deleted (engine/ [B6]-[B7]), the batch's reports and the plans of batches up to
       N deleted (its `_driver` snapshot holds what they held), retention applied
       (lifecycle/retention.py). Repeated at the committer's start for the latest checkpoint.
       Crash point `during_cleanup`.

Executor restore path: a task is about to load version v of a store whose files are missing locally.
  [E1] request (JVM; StoreHooks.beforeRead, RestoreRequester): the version's recipe is incomplete in
       the store's dir, so a restore request is written to the spool and the task waits up to
       restoreTimeout (and while the sidecar is alive).
  [E2] marker (sidecar, restore loop; store_restore.py): the query (from the request, else the checkpoint
       root's `metadata` or the locator) and the store's marker of version v in the latest checkpoint or an
       older retained one, or, for a version newer than every checkpoint (Spark's files are never rolled
       back, spark/ [D3]), the newest upload report of it; none: answered `not_found`.
  [E3] restore (store_restore.py, engine/ [R1]-[R6]): a marker naming no SnapshotIndex of the query and
       store (another query's or store's, a blob that is not one; lifecycle/markers.py) is refused
       before anything is written: `error` (its SnapshotIndex missing: `not_found`), an ERROR naming
       query, store, version, checkpoint and blob. Else the snapshot is built in a scratch dir on the
       checkpoint location's filesystem, files in parallel, each chunk checksum-verified as it is
       written, identical local files reused. A missing, corrupt or hostile snapshot, or a full disk:
       answered `error` naming it, the store's dir untouched. Crash point `during_restore`.
  [E4] take the request (restore_loop.py): only while the JVM still waits (restoreTimeout less a margin) is
       the request renamed into `requests/claimed/`; a request the JVM withdrew is never merged nor
       answered.
  [E5] place and answer (store_restore.py, then restore_loop.py): the files are moved into the store's dir
       without following a symlink below the checkpoint location (the version's own zip or changelog last; a
       store's dir on another file system than the location, below a mount point, gets each file as a synced
       copy renamed into place), then the response is written; Spark loads (and replays changelogs) with its
       own code. On any answer but `restored` Spark's own files decide (it fails loudly if they are missing
       too).
  With a local master the driver's sidecar serves the tasks too, and after rebuilding a location
  ([D5]) it runs [E2]-[E5] for every store at once, ahead of the tasks (restore_ahead.py); a task that
  asks meanwhile waits for that store's restore and finds its files in place.
The driver-side restore of a checkpoint location is spark/ [D1]-[D5]; its request is served by the
restore loop too.
"""
