package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The driver's half: make a query's checkpoint location resume from its latest durable checkpoint
 * before Spark reads it ([D1] of {@code spark_statebackend/spark/__init__.py}; the driver's sidecar does
 * [D2]-[D5]), and notice offline changes to a location (repartition).
 *
 * <p>Why here: Spark's first touch of a query's checkpoint location is {@code
 * CheckpointFileManager.createCheckpointDirectory()} (ResolveWriteToStream, during analysis inside
 * {@code DataStreamWriter.start}), before {@code metadata} is read and the query id fixed, for every
 * kind of job (PySpark, Scala, SQL, spark-submit). We ask the driver's sidecar to rebuild the location
 * there ({@code spark_statebackend.spark.driver_restore.restore_checkpoint_location}: empty, behind or
 * ahead of the latest checkpoint -> the {@code _driver} snapshot of that checkpoint) and wait; if it
 * cannot, the start fails naming why, so a query the blob store knows never starts from scratch
 * silently. Readers that are not a query (the state data source, offline repartition) touch {@code
 * offsets/}, {@code commits/} or {@code metadata} first: a location with no {@code metadata} is rebuilt
 * then too ("read" mode: a location that has its files is left as it is). A {@code commits/<n>} written
 * while no query runs on the location is offline repartition's new batch: the committer is told, so the
 * repartitioned state is checkpointed and no restore can bring back the old partitioning. Each {@code
 * offsets/<n>} is published only after its batch's plan is stored in the blob store ([C0] of {@code
 * spark_statebackend/runtime/__init__.py}), so a new driver host re-runs the batches Spark planned.
 */
final class DriverHooks {
  private static final Logger LOG = LoggerFactory.getLogger(DriverHooks.class);
  /** Roots of queries running in this JVM (the listener's onQueryStarted / onQueryTerminated). */
  private static final Set<Path> ACTIVE = ConcurrentHashMap.newKeySet();
  /** Roots already made current in this JVM since their last query ended. */
  private static final Set<Path> CHECKED = ConcurrentHashMap.newKeySet();
  /** Running queries' roots that are Spark's temporary locations ({@link #queryStarted}). */
  private static final Set<Path> TEMPORARY = ConcurrentHashMap.newKeySet();
  private static volatile boolean warnedNoSidecar;
  /** Guards the commit bookkeeping of a stop ({@link #stopCommits}, {@link #awaitHandover}) below. */
  private static final Object COMMITS = new Object();
  private static boolean stopping; // guarded by COMMITS
  private static int publishing; // guarded by COMMITS: commits/<n> of running queries being published now
  /** Guarded by COMMITS: per running query's root, its last published commits/<n>. */
  private static final Map<Path, Long> COMMITTED = new java.util.HashMap<>();
  /** Guarded by COMMITS: per running query's root, the last batch whose progress reached the committer. */
  private static final Map<Path, Long> HANDED = new java.util.HashMap<>();

  private DriverHooks() {}

  /**
   * A query starts on {@code root}; {@code temporary}: Spark's own temporary location (no
   * checkpointLocation given), which Spark deletes when the query stops and no run ever resumes, so its
   * batches need no plans.
   */
  static void queryStarted(Path root, boolean temporary) {
    ACTIVE.add(root);
    CHECKED.add(root);
    if (temporary) TEMPORARY.add(root);
  }

  static void queryTerminated(Path root) {
    ACTIVE.remove(root);
    TEMPORARY.remove(root);
    CHECKED.remove(root);
    synchronized (COMMITS) {
      Long committed = COMMITTED.remove(root);
      Long handed = HANDED.remove(root);
      if (committed != null && (handed == null || handed < committed)) {
        LOG.warn("spark-statebackend: query {} ended after committing batch {} without reporting its progress; "
            + "the batch is checkpointed from its upload reports and plan when the location is next used",
            StoreHooks.readQueryId(root), committed);
      }
      COMMITS.notifyAll();
    }
  }

  /** A new driver plugin: a SparkContext of this JVM starts, its commits are admitted again. */
  static void driverStarted() {
    synchronized (COMMITS) {
      stopping = false;
      COMMITTED.clear();
      HANDED.clear();
    }
  }

  /** {@link ProgressSpoolListener} handed batch {@code batch} of the query on {@code root} to the committer. */
  static void progressHanded(Path root, long batch) {
    synchronized (COMMITS) {
      HANDED.merge(root, batch, Math::max);
      COMMITS.notifyAll();
    }
  }

  /** The application stops: from now on a running query's commit is refused (its batch re-runs at the
   * next start, with the offsets Spark planned). */
  static void stopCommits() {
    synchronized (COMMITS) {
      stopping = true;
    }
  }

  /**
   * After {@link #stopCommits}: waits until every batch committed so far has been handed to the committer,
   * or until {@code deadlineMs} (wall clock). Why: Spark posts a batch's progress
   * after it writes {@code commits/<n>}, and with SIGTERM the query thread runs on beside
   * {@code SparkContext.stop()}; a commit published after the listener bus was drained would reach the
   * committer after the driver's sidecar drained, leaving the checkpoint log one batch behind what Spark
   * committed. Returns the roots still behind at the deadline (logged).
   */
  static Map<Path, Long> awaitHandover(long deadlineMs) {
    Map<Path, Long> behind = new LinkedHashMap<>();
    synchronized (COMMITS) {
      while (true) {
        behind.clear();
        for (Map.Entry<Path, Long> e : COMMITTED.entrySet()) {
          if (HANDED.getOrDefault(e.getKey(), -1L) < e.getValue()) behind.put(e.getKey(), e.getValue());
        }
        long left = deadlineMs - System.currentTimeMillis();
        if ((publishing == 0 && behind.isEmpty()) || left <= 0) break;
        try {
          COMMITS.wait(left);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          break;
        }
      }
    }
    for (Map.Entry<Path, Long> e : behind.entrySet()) {
      LOG.warn("spark-statebackend: query {}: batch {} was committed but its progress had not reached the "
          + "committer within {} of the stop; it is checkpointed from its upload reports and plan when {} is "
          + "next used", StoreHooks.readQueryId(e.getKey()), e.getValue(), Conf.DRAIN_TIMEOUT, e.getKey());
    }
    return behind;
  }

  /** Publishes a running query's {@code commits/<batch>}, unless the application is stopping. */
  private static void publish(Path root, long batch, CancellableFSDataOutputStream delegate) throws IOException {
    synchronized (COMMITS) {
      if (stopping) {
        delegate.cancel();
        throw new IOException("spark-statebackend: the application is stopping, so batch " + batch + " of the "
            + "query on " + root + " is not committed; its next start re-runs it with the offsets Spark planned");
      }
      publishing++;
    }
    boolean published = false;
    try {
      delegate.close();
      published = true;
    } finally {
      synchronized (COMMITS) {
        publishing--;
        if (published) COMMITTED.merge(root, batch, Math::max);
        COMMITS.notifyAll();
      }
    }
  }

  /**
   * A query is about to start on {@code location}: rebuild it from the latest checkpoint if needed. A
   * remote location ({@code local} null: another Hadoop scheme) is durable itself: nothing is rebuilt,
   * its store dirs' files are kept in local mirrors ({@link RemoteLocations}); the start fails if the
   * scheme's Hadoop file system is not {@link MirroringFileSystem}, since Spark would then write each
   * version's SSTs into the location and its zip into the mirror, and no commit could be staged.
   */
  static void beforeQueryStart(org.apache.hadoop.fs.Path location, Path local,
      org.apache.hadoop.conf.Configuration hadoopConf) {
    ExecutorEnv env = ExecutorEnv.current();
    if (!env.conf.enabled()) return;
    if (local == null) {
      checkRemote(location, hadoopConf, env.conf);
      return;
    }
    prepare(env, local, "start");
    CHECKED.add(local);
  }

  private static void checkRemote(org.apache.hadoop.fs.Path location, org.apache.hadoop.conf.Configuration hadoopConf,
      Conf conf) {
    String scheme = location.toUri().getScheme().toLowerCase(java.util.Locale.ROOT);
    String impl = hadoopConf.get("fs." + scheme + ".impl", "");
    if (!MirroringFileSystem.class.getName().equals(impl.trim())) {
      throw new IllegalArgumentException(notWrapped("checkpoint location " + location, scheme, impl));
    }
    String name = RemoteLocations.name(location.toUri());
    Path mirror = RemoteLocations.ensureMirrorRoot(conf, name);
    LOG.info("spark-statebackend: checkpoint location {} is remote: Spark's metadata stays there, its state "
        + "stores' files are kept in local mirrors ({} on this host) and backed up to the blob store", name, mirror);
  }

  /** Why {@code what}, on Hadoop scheme {@code scheme} whose file system is {@code impl}, is refused. */
  static String notWrapped(String what, String scheme, String impl) {
    return "spark-statebackend: " + what + " is on the Hadoop scheme '" + scheme + "', whose file system the "
        + "plugin did not wrap at application start (fs." + scheme + ".impl=" + (impl.isEmpty() ? "<unset>" : impl)
        + "), so its state could not be kept locally and backed up. Add '" + scheme + "' to "
        + Conf.REMOTE_SCHEMES + " (its file system class must be on the classpath), or disable the backend "
        + "for this application (" + Conf.ENABLED + "=false)";
  }

  /** Something other than a starting query reads {@code root}'s logs: rebuild it if it is empty. */
  static void beforeRead(Path root) {
    if (ACTIVE.contains(root) || CHECKED.contains(root)) return;
    ExecutorEnv env = ExecutorEnv.current();
    if (!env.conf.enabled()) return;
    if (!CHECKED.add(root)) return;
    try {
      prepare(env, root, "read");
    } catch (RuntimeException e) {
      CHECKED.remove(root);
      throw e;
    }
  }

  private static void prepare(ExecutorEnv env, Path root, String mode) {
    if (!"process".equals(env.conf.sidecarMode())) {
      if (!warnedNoSidecar) {
        warnedNoSidecar = true;
        LOG.warn("spark-statebackend: {}={} (no sidecar processes): checkpoint locations are not restored "
            + "from the blob store on this driver", Conf.SIDECAR_MODE, env.conf.sidecarMode());
      }
      return;
    }
    RestoreRequester.Outcome o = RestoreRequester.prepareCheckpointLocation(env.driver(), root, mode);
    if (o.status != RestoreRequester.Status.RESTORED) {
      String hint = o.status == RestoreRequester.Status.NO_SIDECAR
          ? "; the driver's sidecar is not running: see " + env.driver().spoolDir.resolve(SidecarProcess.LOG_FILE)
              + " and check " + Conf.SIDECAR_PYTHON + " (a Python with spark-statebackend installed)"
          : "";
      throw new IllegalStateException("spark-statebackend: cannot make checkpoint location " + root
          + " resume from its latest durable checkpoint, so the query does not start (it would otherwise "
          + "start from scratch or from state older than its checkpoint): " + o + hint);
    }
    LOG.info("spark-statebackend: checkpoint location {} ({}): {}", root, mode, o.message);
  }

  /**
   * Wraps the write of {@code <root>/<log>/<name>}. An {@code offsets/<n>} is published only once its
   * batch's plan is stored ({@link #planned}). A commit of a query running on {@code root} waits,
   * before Spark publishes it, while the query's checkpoints have failed for longer than maxCommitDelay
   * ({@link CommitGate#awaitCheckpoints}). A commit written while no query runs on {@code root} is offline
   * repartition's batch (the only Spark tool that writes a location without a query); the committer is
   * told once it is published.
   */
  static CancellableFSDataOutputStream onLogWrite(Path root, String log, org.apache.hadoop.fs.Path target,
      CancellableFSDataOutputStream delegate) {
    if (!"commits".equals(log) && !"offsets".equals(log)) return delegate;
    long batch;
    try {
      batch = Long.parseLong(target.getName());
    } catch (NumberFormatException e) {
      return delegate;
    }
    ExecutorEnv env = ExecutorEnv.current();
    if (!env.conf.enabled()) return delegate;
    if ("offsets".equals(log)) {
      // No sidecar, no plans: without one nothing rebuilds a location either ([D1]).
      boolean plans = "process".equals(env.conf.sidecarMode()) && !TEMPORARY.contains(root);
      return plans ? planned(env, root, batch, delegate) : delegate;
    }
    boolean running = ACTIVE.contains(root);
    if (running && !"process".equals(env.conf.sidecarMode())) return delegate;   // no committer to wait for
    return new CancellableFSDataOutputStream(delegate) {
      private boolean terminated;

      @Override
      public synchronized void close() throws IOException {
        if (terminated) return;
        terminated = true;
        if (running) {
          // Before Spark publishes the commit: a query whose checkpoints have failed beyond maxCommitDelay
          // (for any cause) waits here, and fails after commitTimeout naming the cause.
          CommitGate.awaitCheckpoints(env.driver().spoolDir, StoreHooks.readQueryId(root), batch,
              env.conf.maxCommitDelayMs(), env.conf.commitTimeoutMs());
          publish(root, batch, delegate);
          return;
        }
        delegate.close();
        offlineCommit(env, root, batch);
      }

      @Override
      public synchronized void cancel() {
        if (terminated) return;
        terminated = true;
        delegate.cancel();
      }
    };
  }

  /**
   * Wraps the write of {@code offsets/<batch>}: before Spark publishes it, the driver's sidecar stores the
   * batch's plan (these bytes and the driver files Spark wrote since the previous plan) as one immutable
   * blob, and Spark's write fails if it cannot ([C0] of {@code spark_statebackend/runtime/__init__.py}):
   * a rebuild on a new driver host then places every plan newer than its checkpoint, so Spark re-runs
   * the batches it planned with the offsets it gave them instead of planning them again.
   */
  private static CancellableFSDataOutputStream planned(ExecutorEnv env, Path root, long batch,
      CancellableFSDataOutputStream delegate) {
    java.io.ByteArrayOutputStream copy = new java.io.ByteArrayOutputStream(512);
    java.io.OutputStream tee = new java.io.OutputStream() {
      @Override
      public void write(int b) throws IOException {
        delegate.write(b);
        copy.write(b);
      }

      @Override
      public void write(byte[] b, int off, int len) throws IOException {
        delegate.write(b, off, len);
        copy.write(b, off, len);
      }

      @Override
      public void flush() throws IOException {
        delegate.flush();
      }
    };
    return new CancellableFSDataOutputStream(tee) {
      private boolean terminated;

      @Override
      public synchronized void close() throws IOException {
        if (terminated) return;
        terminated = true;
        try {
          storePlan(env, root, batch, copy.toByteArray());
        } catch (RuntimeException e) {
          delegate.cancel();   // never published: Spark's write fails, and with it the batch
          throw e;
        }
        delegate.close();
      }

      @Override
      public synchronized void cancel() {
        if (terminated) return;
        terminated = true;
        delegate.cancel();
      }
    };
  }

  /** Asks the driver's sidecar to store batch {@code batch}'s plan and waits (commitTimeout); throws if not stored. */
  private static void storePlan(ExecutorEnv env, Path root, long batch, byte[] offsets) {
    String queryId = StoreHooks.readQueryId(root);
    long t0 = System.nanoTime();
    RestoreRequester.Outcome o = RestoreRequester.storePlan(env.driver(), root, queryId, batch, offsets);
    long waitedUs = (System.nanoTime() - t0) / 1000;
    if (o.status != RestoreRequester.Status.UPLOADED) {
      throw new IllegalStateException("spark-statebackend: query " + queryId + " batch " + batch + ": the plan "
          + "of the batch (offsets/" + batch + " of " + root + ") could not be stored as blob plans/" + queryId
          + "/" + String.format("%012d", batch) + ".json in the blob store (waited " + waitedUs / 1000 + " ms, at "
          + "most " + Conf.COMMIT_TIMEOUT + "): " + o + "; the batch does not run, since a rebuild of this "
          + "location on another host could not re-run it with these offsets");
    }
    LOG.debug("spark-statebackend: query={} batch={} plan stored in {} us ({})", queryId, batch, waitedUs,
        o.message);
  }

  private static void offlineCommit(ExecutorEnv env, Path root, long batch) {
    String queryId = StoreHooks.readQueryId(root);
    SpoolDocuments.OfflineCommit doc = new SpoolDocuments.OfflineCommit(queryId, batch, root,
        System.currentTimeMillis());
    Path file = env.driver().spoolDir.resolve("progress").resolve(Spool.nextStem() + ".json");
    try {
      Spool.writeJsonAtomically(file, doc.toJson());
    } catch (IOException e) {
      throw new IllegalStateException("spark-statebackend: query " + queryId + ": batch " + batch + " was "
          + "committed offline in " + root + " but cannot be handed to the committer (" + file + "): " + e, e);
    }
    LOG.warn("spark-statebackend: query {}: batch {} committed in {} while no query runs on it (offline state "
        + "repartition); it is checkpointed once every store of version {} is uploaded", queryId, batch, root,
        batch + 1);
  }
}
