package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Stream;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.hadoop.conf.Configuration;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The two hooks of one state store instance, driven by what Spark's RocksDBFileManager does through
 * our checkpoint file manager on that store's dir (the steps are those of the commit and restore paths
 * in {@code spark_statebackend/runtime/__init__.py}):
 * <ol>
 *   <li><b>commit</b> ([C1]-[C2]): Spark commits version v by closing {@code <v>[_<id>].zip} (no
 *   changelog checkpointing: always; with it, only for snapshots forced on the task thread) or {@code
 *   <v>[_<id>].changelog} (changelog checkpointing), on the committing task. Before that close publishes
 *   the file we apply the commit gate (maxCommitDelay); after it (and after its {@code .crc} companion,
 *   which Spark's checksum manager closes on another thread) we stage v's {@link Recipe} and publish an
 *   event. Snapshots Spark's maintenance thread uploads later (changelog checkpointing) are not commits:
 *   the next commit's recipe picks them up, and one that shortens the recipe of the newest version
 *   staged here (Spark would now load that version from it) stages that version again, as an upgrade, so
 *   its backup never replays more changelogs than Spark would.</li>
 *   <li><b>load</b> ([E1]): Spark reads the dir (exists / list / open) only when it must load a version
 *   it does not hold. On the first such read of a task attempt we check that the version the task wants
 *   (its micro-batch id: batch N loads version N) has a complete recipe locally; if not, we ask the
 *   sidecar to restore it from the blob store and wait. Tasks without a micro-batch id (the state data
 *   source reader, offline repartition) get the query's latest checkpointed version when the dir holds
 *   no state files at all.</li>
 * </ol>
 *
 * <p>One instance per store dir per JVM ({@link #of}); Spark creates a new file manager for each
 * provider instance and our wrapper for each, so per-store state lives here.
 */
final class StoreHooks {
  private static final Logger LOG = LoggerFactory.getLogger(StoreHooks.class);
  /** TaskContext local property keys, from the 4.3.0 bytecode (StreamExecution$, MicroBatchExecution$). */
  static final String QUERY_ID_KEY = "sql.streaming.queryId";
  static final String BATCH_ID_KEY = "streaming.sql.batchId";

  private static final ConcurrentHashMap<Path, StoreHooks> BY_DIR = new ConcurrentHashMap<>();
  /** HDFSBackedStateStoreProvider's files: {@code <v>.delta}, {@code <v>.snapshot}. */
  private static final java.util.regex.Pattern HDFS_PROVIDER_FILE =
      java.util.regex.Pattern.compile("[0-9]+\\.(delta|snapshot)");

  final StoreDir store;
  private final Configuration hadoopConf;
  private volatile Recipe.Codec codec;
  private volatile String queryId;
  private long lastCheckedAttempt = -1;           // guarded by this
  private boolean changelogMode;                   // guarded by this; a changelog writer opened since the last load
  private final Map<String, Pending> pending = new HashMap<>(); // guarded by this
  private Staged lastStaged;                        // guarded by this; the newest version staged in this JVM

  private StoreHooks(StoreDir store, Configuration hadoopConf) {
    this.store = store;
    this.hadoopConf = hadoopConf;
  }

  static StoreHooks of(StoreDir store, Configuration hadoopConf) {
    return BY_DIR.computeIfAbsent(store.dir, d -> new StoreHooks(store, hadoopConf));
  }

  private Recipe.Codec codec() {
    Recipe.Codec c = codec;
    if (c == null) codec = c = Recipe.Codec.fromConf(hadoopConf);
    return c;
  }

  // ------------------------------------------------------------------------------------------ load

  /** Called before Spark reads {@code touched} (the dir or a file in it). */
  void beforeRead(org.apache.hadoop.fs.Path touched) {
    TaskContext tc = TaskContext.get();
    if (tc == null) return;   // maintenance threads: they never load
    if (!Conf.current().enabled()) return;
    learnQuery(tc);
    synchronized (this) {
      if (tc.taskAttemptId() == lastCheckedAttempt) return;
      lastCheckedAttempt = tc.taskAttemptId();
      changelogMode = false;   // a load: Spark opens this version's changelog writer after it, if in that mode
    }
    ExecutorEnv env = ExecutorEnv.current();
    Long batch = batchId(tc);
    String qid = queryId(tc);
    try {
      if (batch != null) {
        if (batch <= 0) return;   // version 0 is the empty store
        StoreDir.VersionFile f = StoreDir.VersionFile.parse(touched.getName());
        String uid = f != null && f.version == batch ? f.uniqueId : null;
        try {
          Recipe.of(store.dir, batch, uid, codec());
        } catch (Recipe.Missing m) {
          importIfNotRestored(qid, RestoreRequester.restoreBeforeLoad(env, store, qid, batch, uid, m.getMessage(),
              codec()));
        }
      } else if (!hasStateFiles()) {
        importIfNotRestored(qid, RestoreRequester.restoreBeforeLoad(env, store, qid, null, null,
            "the store dir holds no state files", codec()));
      }
    } catch (IOException e) {
      LOG.error("spark-statebackend: query={} store={}: cannot inspect {} ({}); Spark's own load decides", qid,
          store.instance(), store.dir, e.toString());
    }
  }

  /**
   * A remote location's store the blob store could not restore: Spark's own files in the location (a
   * checkpoint Spark wrote before the backend was enabled, or while it was off) are copied into the
   * mirror ({@link RemoteLocations#importFromLocation}), so Spark loads what it wrote and the first backup
   * takes it. Nothing to copy: Spark's own load decides, as for a local location.
   */
  private void importIfNotRestored(String qid, RestoreRequester.Outcome o) throws IOException {
    if (store.remote == null || o.status == RestoreRequester.Status.RESTORED) return;
    int n = RemoteLocations.importFromLocation(store, hadoopConf);
    if (n > 0) {
      LOG.warn("spark-statebackend: query={} store={}: {} file(s) of Spark's own state copied from {} into its "
          + "local mirror {}; the store's next backup takes them", qid, store.instance(), n, store.remote, store.dir);
    }
  }

  private boolean hasStateFiles() throws IOException {
    if (!Files.isDirectory(store.dir)) return false;
    try (Stream<Path> s = Files.list(store.dir)) {
      return s.anyMatch(p -> StoreDir.VersionFile.parse(p.getFileName().toString()) != null);
    }
  }

  // ------------------------------------------------------------------------------------------ commit

  /**
   * Wraps the stream Spark writes {@code target} with, if {@code target} is a version file (or its
   * {@code .crc}) being committed; other files pass through unchanged.
   */
  CancellableFSDataOutputStream onCreate(org.apache.hadoop.fs.Path target, CancellableFSDataOutputStream out) {
    String name = target.getName();
    if (HDFS_PROVIDER_FILE.matcher(name).matches()) {
      out.cancel();
      throw new IllegalStateException("spark-statebackend: store " + store + " is written by Spark's "
          + "HDFSBackedStateStoreProvider (" + name + "): its query's checkpoint was started with that provider, "
          + "which Spark records in the offset log. spark-statebackend backs up RocksDB state only; run the "
          + "query without spark-statebackend (spark.statebackend.enabled=false) or from a new checkpoint "
          + "location with spark.sql.streaming.stateStore.providerClass=" + StateBackendPlugin.ROCKSDB_PROVIDER);
    }
    boolean crc = name.endsWith(Recipe.CHECKSUM_SUFFIX);
    String main = crc ? name.substring(0, name.length() - Recipe.CHECKSUM_SUFFIX.length()) : name;
    StoreDir.VersionFile vf = StoreDir.VersionFile.parse(main);
    if (vf == null || !Conf.current().enabled()) return out;
    // Which thread creates the stream says little: Spark's checksum manager (checkpoint format v2)
    // creates and closes both files on its own pool. What counts is the store's mode: with changelog
    // checkpointing Spark opens a changelog writer at every load, commits by closing it, and uploads
    // snapshots later on its maintenance thread (those zips are not commits: the next commit's recipe
    // picks them up, see snapshotPublished); without it, each zip is a commit.
    Pending p;
    synchronized (this) {
      if (!vf.zip && !crc) changelogMode = true;
      boolean snapshotOnly = vf.zip && changelogMode;
      p = pending.computeIfAbsent(main, k -> new Pending(vf, snapshotOnly));
      if (crc) p.crcCreated = true; else p.mainCreated = true;
    }
    // A changelog whose commit will wait for its upload: the sidecar uploads it while it is written.
    Path streamDir = null;
    if (!vf.zip && !crc && out instanceof LocalCheckpointFileManager.AtomicStream a) {
      ExecutorEnv env = ExecutorEnv.current();
      if (env.conf.durableCommit()) {
        streamDir = Stager.stream(env, store, vf.version, name, queryId(TaskContext.get()), a.writing());
      }
    }
    return new Watched(out, p, crc, streamDir);
  }

  /** One version file being written, with its optional {@code .crc} companion. */
  private static final class Pending {
    final StoreDir.VersionFile file;
    /** A snapshot zip in changelog mode (Spark's maintenance thread, or forced): not a commit. */
    final boolean snapshotOnly;
    boolean mainCreated;
    boolean crcCreated;
    boolean mainClosed;
    boolean crcClosed;
    boolean done;

    Pending(StoreDir.VersionFile file, boolean snapshotOnly) {
      this.file = file;
      this.snapshotOnly = snapshotOnly;
    }
  }

  /** The newest version staged for this store in this JVM, and the snapshot its staged recipe starts from. */
  private static final class Staged {
    final long version;
    final String uniqueId;
    final long snapshotVersion;
    final String queryId;

    Staged(Recipe recipe, String queryId) {
      this.version = recipe.version;
      this.uniqueId = recipe.uniqueId;
      this.snapshotVersion = recipe.snapshotVersion;
      this.queryId = queryId;
    }
  }

  private final class Watched extends CancellableFSDataOutputStream {
    private final CancellableFSDataOutputStream delegate;
    private final Pending p;
    private final boolean crc;
    /** The link the sidecar streams this changelog from (Stager#stream), or null. */
    private final Path streamDir;
    private boolean terminated;

    Watched(CancellableFSDataOutputStream delegate, Pending p, boolean crc, Path streamDir) {
      super(delegate);
      this.delegate = delegate;
      this.p = p;
      this.crc = crc;
      this.streamDir = streamDir;
    }

    @Override
    public synchronized void close() throws IOException {
      if (terminated) return;
      terminated = true;
      if (!crc && !p.snapshotOnly) {   // only a commit waits for a lagging upload, never Spark's maintenance
        ExecutorEnv env = ExecutorEnv.current();
        CommitGate.await(env.spoolDir, queryId(TaskContext.get()), store.instance(), p.file.version,
            env.conf.maxCommitDelayMs(), env.conf.commitTimeoutMs());   // only this store's query's lag
      }
      delegate.close();   // Spark's file is published here
      boolean stage;
      synchronized (StoreHooks.this) {
        if (crc) p.crcClosed = true; else p.mainClosed = true;
        stage = !p.done && p.mainClosed && (!p.crcCreated || p.crcClosed);
        if (stage) p.done = true;
        if (stage || !p.mainCreated) pending.remove(p.file.name());
      }
      if (stage) {
        if (p.snapshotOnly) snapshotPublished(p); else staged(p);
      }
    }

    @Override
    public synchronized void cancel() {
      if (terminated) return;
      terminated = true;
      synchronized (StoreHooks.this) {
        p.done = true;
        pending.remove(p.file.name());
      }
      delegate.cancel();
      // The writer's file is gone: so goes the sidecar's link to it, which then drops the stream.
      if (streamDir != null) HardLinks.deleteTree(streamDir);
    }
  }

  /** The version file (and its checksum) is published: stage the version's recipe. */
  private void staged(Pending p) {
    ExecutorEnv env = ExecutorEnv.current();
    String qid = queryId(TaskContext.get());
    Recipe recipe;
    try {
      recipe = Recipe.of(store.dir, p.file.version, p.file.uniqueId, codec());
    } catch (Recipe.Missing | IOException e) {
      throw new IllegalStateException("spark-statebackend: query " + qid + " store " + store.instance()
          + ": version " + p.file.version + " was committed but its files are incomplete, so it cannot be "
          + "backed up: " + e.getMessage(), e);
    }
    // batch N commits version N+1
    String awaited = Stager.stage(env, store, recipe, qid, p.file.version - 1, false, env.conf.durableCommit());
    if (awaited != null) awaitUpload(env, qid, recipe.version, awaited);
    Staged now;
    synchronized (this) {
      if (lastStaged != null && recipe.version < lastStaged.version) return;
      lastStaged = now = new Staged(recipe, qid);
    }
    // A snapshot Spark published while this version was being staged is not in its recipe, and its close
    // may have come before lastStaged named this version: look once more (one listing, changelog mode only).
    if (recipe.changelogMode() && newerSnapshotListed(recipe)) upgrade(now, "published while it was staged");
  }

  /**
   * Spark published snapshot {@code p} of this store in changelog mode (its maintenance thread uploads
   * snapshots after the commits they were taken at). If it shortens the recipe of the newest version
   * staged here, i.e. Spark would now load that version from it and replay fewer changelogs, that
   * version is staged again with the new recipe: see {@link #upgrade}.
   */
  private void snapshotPublished(Pending p) {
    Staged last;
    synchronized (this) {
      last = lastStaged;
    }
    if (last == null || p.file.version > last.version || p.file.version <= last.snapshotVersion) return;
    upgrade(last, p.file.name());
  }

  /** Whether the dir lists a snapshot zip newer than {@code recipe}'s and not newer than its version. */
  private boolean newerSnapshotListed(Recipe recipe) {
    try (Stream<Path> s = Files.list(store.dir)) {
      return s.map(f -> StoreDir.VersionFile.parse(f.getFileName().toString()))
          .anyMatch(f -> f != null && f.zip && f.version > recipe.snapshotVersion && f.version <= recipe.version);
    } catch (IOException e) {
      return false;   // the next snapshot's close looks again
    }
  }

  /**
   * Stages version {@code last} again, as an upgrade, if its recipe is now shorter: the sidecar uploads
   * it and the committer checkpoints it in place of the commit-time upload (commit.py), so restoring the
   * version never replays more changelogs than Spark would from its own files. Never throws (it runs in
   * Spark's maintenance, or after a commit that succeeded): the version is backed up already, with its
   * commit-time recipe.
   */
  private void upgrade(Staged last, String snapshot) {
    try {
      Recipe recipe = Recipe.of(store.dir, last.version, last.uniqueId, codec());
      if (recipe.snapshotVersion <= last.snapshotVersion) return;   // v2: not a snapshot of its lineage
      synchronized (this) {
        if (lastStaged != last) return;   // staged meanwhile: a newer version, or this upgrade already
        lastStaged = new Staged(recipe, last.queryId);
      }
      Stager.stage(ExecutorEnv.current(), store, recipe, last.queryId, last.version - 1, true, false);
    } catch (Recipe.Missing | IOException | RuntimeException e) {
      LOG.error("spark-statebackend: query={} store={}: a newer snapshot ({}) could not be staged as an "
          + "upgrade of version {} ({}); that version stays backed up with its commit-time recipe (snapshot {})",
          last.queryId, store.instance(), snapshot, last.version, e.toString(), last.snapshotVersion);
    }
  }

  /**
   * durableCommit: returns once the sidecar has uploaded and reported {@code version} (answered {@code
   * requestId}), so the version survives the loss of this host; throws (the commit fails and Spark
   * retries the task) when the sidecar says it never will be, or after commitTimeout, or when no live
   * sidecar serves this executor. Spark's own files are already published: a retry recommits the version.
   */
  private void awaitUpload(ExecutorEnv env, String queryId, long version, String requestId) {
    long t0 = System.nanoTime();
    RestoreRequester.Outcome o;
    try {
      o = RestoreRequester.awaitResponse(env.spool(), requestId, env.conf.commitTimeoutMs(),
          RestoreRequester.LIVENESS_GRACE_MS);
    } catch (java.io.IOException e) {
      o = new RestoreRequester.Outcome(RestoreRequester.Status.ERROR, "cannot read the sidecar's answer: " + e,
          requestId);
    }
    if (o.status != RestoreRequester.Status.UPLOADED) {
      throw new IllegalStateException("spark-statebackend: query " + queryId + " store " + store.instance()
          + ": version " + version + " was committed but could not be made durable (" + Conf.DURABLE_COMMIT
          + "=true; waited at most " + Conf.COMMIT_TIMEOUT + "): " + o + "; failing the commit so that Spark "
          + "retries the task");
    }
    LOG.debug("spark-statebackend: query={} store={} version={} durable in {} us ({})", queryId,
        store.instance(), version, (System.nanoTime() - t0) / 1000, o.message);
  }

  // ------------------------------------------------------------------------------------------ query

  private void learnQuery(TaskContext tc) {
    String q = tc.getLocalProperty(QUERY_ID_KEY);
    if (q != null && !q.isEmpty()) queryId = q;
  }

  /**
   * The query this store belongs to: the task's streaming query id, else the one learnt from an
   * earlier task, else the {@code metadata} file in the checkpoint root (present on the driver's host),
   * else null (the sidecar then resolves it from the checkpoint root through the blob store).
   */
  private String queryId(TaskContext tc) {
    if (tc != null) {
      String q = tc.getLocalProperty(QUERY_ID_KEY);
      if (q != null && !q.isEmpty()) return q;
    }
    String q = queryId;
    if (q != null) return q;
    q = readQueryId(store.root);
    if (q != null) queryId = q;
    return q;
  }

  /** The id in {@code <root>/metadata} (Spark's StreamMetadata: one JSON line {"id": ...}), or null. */
  static String readQueryId(Path root) {
    try {
      byte[] data = Files.readAllBytes(root.resolve("metadata"));
      String first = new String(data, java.nio.charset.StandardCharsets.UTF_8).split("\n", 2)[0];
      JsonNode n = Spool.MAPPER.readTree(first);
      String id = n == null ? null : n.path("id").asText(null);
      return id == null || id.isEmpty() ? null : id;
    } catch (IOException | RuntimeException e) {
      return null;
    }
  }

  static Long batchId(TaskContext tc) {
    String v = tc == null ? null : tc.getLocalProperty(BATCH_ID_KEY);
    if (v == null) return null;
    try {
      return Long.parseLong(v.trim());
    } catch (NumberFormatException e) {
      return null;
    }
  }
}
