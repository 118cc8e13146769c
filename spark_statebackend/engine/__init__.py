"""The engine: one snapshot of one directory, up to a blob store (backup) and back (restore).

A snapshot is a SnapshotIndex (index.py; its JSON form index_codec.py) listing every file of a
directory as chunk blobs with CRC32C checksums (checksum.py) and what was removed since the previous
snapshot; the index's blob id is the store's marker (blobs.py: where blobs live). It knows nothing of
Spark or checkpoints but the store instance a snapshot is kept per (checkpoints/store_instance.py: its
key, and its dir in a checkpoint location, shared by every layer above): runtime/ and spark/ call it,
lifecycle/ keeps its blobs.

Backup (backup.py, BackupManager; per store, a store instance key -> a local directory):
  [B1] init(markers): load the SnapshotIndex each marker names: the diff base for the next upload.
  [B2] upload(cp, dirs): diff each directory against its previous SnapshotIndex (diff.py: names,
       sizes, owners, modes, and checksums of small files; never mtimes);
  [B3] upload every added file, chunked (whole if the store keeps whole-file blobs; new_snapshot.py
       plans the chunks), in parallel on the bounded transfer pool (transfer.py), each blob with a
       TTL. Crash point `during_file_upload`;
  [B4] upload the new SnapshotIndex (linked to the previous one; new_snapshot.py builds it), also
       with a TTL. Crash point `before_index_upload`;
  [B5] return {store -> new SnapshotIndex blob id}: the markers to checkpoint. The new index becomes
       the diff base at once, so the next upload is incremental even before this one is checkpointed.
  (the caller writes a checkpoint holding the markers: runtime/ [C5])
  [B6] cleanup(markers): remove the TTL of every blob the checkpointed snapshots reference, and of
       their index blobs. Crash point `during_cleanup`;
  [B7] then delete the blobs of files and dirs removed since the previous snapshot, and the previous
       SnapshotIndex blob (with retainCheckpoints > 1 the committer's retention deletes instead);
       cleanup_chain.py works out what, back along the chain to the previous checkpoint's snapshot.
  Nothing is deleted before a checkpoint references its replacement, so a crash at any point leaves
  the last checkpoint whole; uploads that never got checkpointed expire by TTL (or are swept by GC).
  cleanup is idempotent: run twice, or after a crash half-way, it finishes the job (deleting a missing
  blob succeeds). [B6] covers every referenced blob the first time a store is cleaned up in a process
  (restart safety, like Samza re-running cleanup at start), and afterwards only blobs not already made
  permanent by an earlier cleanup.

Restore of snapshot S into directory D (restore.py, RestoreManager; placing.py places files):
  [R1] fetch and parse S's SnapshotIndex. Names in it are data: the parser has already rejected
       separators, '..', absolute paths and duplicates; every target is also checked to lie inside
       the restore's own directory before anything is written.
  [R2] if D already holds exactly S (same names, and every file the same by the diff rules), stop:
       nothing is downloaded.
  [R3] build the result in a fresh sibling directory T (same filesystem). Create every directory;
       for every file, hard-link an identical local file if D (or a reuse directory) has one, else
       create it at its final size and queue its chunks.
  [R4] download all queued chunks on the bounded pool, in parallel across files and chunks, each
       written at its offset and checksum-verified while written; the first error cancels the rest,
       removes T, and leaves D untouched. A file that is one whole blob of a local store on T's
       filesystem is linked or copied in the kernel instead, and verified (placing.py: when a link is
       safe). Crash point `during_restore`.
  [R5] apply permissions (setuid, setgid and sticky bits masked off: an index is data and never grants
       privileges) and mtimes to every file written here, never to a linked file (its inode is the
       blob's; the mtime is the blob's age for GC's grace). The diff ignores mtimes, and for immutable
       files the write bits and the group and other read bits (a linked file has the blob's mode,
       0400), so a later backup uploads nothing. Each task fdatasyncs what it wrote
       (overlapping the other transfers), so a crash cannot leave a torn file that a later restore
       would trust by name and size; a linked file is synced only if the store did not sync it at put().
  [R6] fsync T's directories, then swap: D -> D.old, T -> D, fsync D's parent, remove D.old. Anything
       in D that is not in S is gone. A D that is a symlink is never followed: it is not compared in
       [R2] nor reused in [R3], and the swap replaces the link itself.
  A crash during [R3]-[R5] leaves D as it was plus a stale T, removed by the next restore of D. A crash
  inside [R6] can leave D missing: the next restore then downloads everything. D is never half-written.
verify.py reads every blob of a snapshot and checks every checksum, writing nothing.
"""
