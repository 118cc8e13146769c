"""Lifecycle: the blobs beside the engine's, and what keeps or collects every blob a checkpoint references.

Built on the engine (engine/) and the checkpoint model and log (checkpoints/). Besides the engine's
`files/` and `indexes/` (engine/blobs.py) the blob store holds:

    reports/<query>/<version>/<store>/...    marker reports, sidecars to the committer (reports.py)
    upgrades/<query>/<version>/<store>/...   reports of upgraded snapshots (reports.py)
    queries/<location key>/<query>.json      query locators: a checkpoint location's queries (locators.py)
    plans/<query>/<batch>.json               batch plans, stored before Spark runs the batch (plans.py)

The life of a blob: why nothing a retained checkpoint references is ever deleted, and why nothing
else lives for ever (the commit path's steps are runtime/__init__.py's, the engine's engine/'s):
  [L1] uploaded with a TTL (blobTtl): a file chunk and a SnapshotIndex ([C3], engine/ [B3]-[B4]),
       a marker report ([C4]). A crash before [L2] leaves only blobs that expire.
  [L2] referenced: the committer checks every reported marker (markers.py) and writes a CheckpointV2
       naming it to the log ([C5]). Read back, a marker is data: one that is not a SnapshotIndex of
       its query and store is never used (markers.py: every way from a checkpoint to its snapshots,
       backup and restore alike, is `load_checkpoint_indexes`).
  [L3] made permanent: cleanup removes the TTL of every blob the new checkpoint references ([C6],
       engine/ [B6]); a committer restarting re-runs it for the latest checkpoint.
  [L4] replaced: cleanup deletes the blobs the new snapshots no longer reference and the previous
       indexes (engine/ [B7]), only while the checkpoint just written is still the log's latest. With
       retainCheckpoints K > 1, retention.py deletes instead the blobs only checkpoints that fell out of
       the last K referenced. Consumed reports are deleted.
  [L5] collected: `spark-statebackend gc` deletes the blobs of a query no retained checkpoint (or
       newest index) references once older than its grace (gc.py [1]-[5]; what is referenced:
       reachability.py), and the TTL sweep deletes every expired blob nothing references (gc.py [6];
       the committer runs it every sweepInterval, runtime/sweeper.py). A referenced blob found
       expired is made permanent instead.
The command line's own snapshots (`spark-statebackend backup`, query `cli`) have no checkpoints: every
index of theirs still present is kept; snapshots.py lists them and applies `forget`'s policies.
"""
