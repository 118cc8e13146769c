package dev.statebackend.spark;

import java.nio.file.Path;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution;
import org.apache.spark.sql.execution.streaming.runtime.StreamingQueryWrapper;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.StreamingQueryListener;
import org.apache.spark.sql.streaming.StreamingQueryProgress;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code spark.sql.streaming.streamingQueryListeners=dev.statebackend.spark.ProgressSpoolListener}: hands
 * every finished micro-batch to the driver's sidecar, whose committer writes the combined checkpoint
 * ([C5] of {@code spark_statebackend/runtime/__init__.py}).
 *
 * <p>Why a JVM listener and not a Python one: it is enabled by a spark.conf key alone, so spark-submit
 * jobs (Python or not) need no code change, and the committer then runs in the sidecar like the uploads
 * do. Spark calls onQueryProgress on its listener bus after {@code commits/N} is written. Each progress
 * becomes {@code <spool root>/<app identity>/driver/progress/<stem>.json}, in this application attempt's
 * driver spool dir ({@link Conf#appIdentityOrNull()}): a {@link SpoolDocuments.Progress} (see
 * spark_statebackend/runtime/spool/__init__.py; read by runtime/progress.py). The checkpoint root is
 * looked up when the query starts (onQueryStarted runs on the query's thread while the query is
 * registered) and cached. Hooks only the public StreamingQueryListener API plus
 * StreamingQueryWrapper.streamingQuery(); and, before handing a progress over, puts the backend's figures
 * for the query into it ({@link ProgressFigures}: {@code observedMetrics["statebackend"]}, by reflection).
 */
public class ProgressSpoolListener extends StreamingQueryListener {
  private static final Logger LOG = LoggerFactory.getLogger(ProgressSpoolListener.class);
  private static final Map<UUID, String> CHECKPOINT_ROOTS = new ConcurrentHashMap<>();

  public ProgressSpoolListener() {}

  /** The running query {@code id} of this JVM's session (default, else active), or null. */
  private static StreamExecution execution(UUID id) {
    scala.Option<SparkSession> session = SparkSession.getDefaultSession();
    if (session.isEmpty()) session = SparkSession.getActiveSession();
    if (session.isEmpty()) return null;
    StreamingQuery q = session.get().streams().get(id);
    return q instanceof StreamingQueryWrapper ? ((StreamingQueryWrapper) q).streamingQuery() : null;
  }

  /** Remote locations' names ({@link RemoteLocations#name}) by query id; a local location has none. */
  private static final Map<UUID, String> REMOTE_LOCATIONS = new ConcurrentHashMap<>();

  /**
   * The query's checkpoint root as a local path: its location, or a remote location's mirror root on
   * this host (created: the committer checks the root it is handed exists), the remote location's name
   * then recorded in {@link #REMOTE_LOCATIONS}.
   */
  private static String checkpointRoot(UUID id) {
    String cached = CHECKPOINT_ROOTS.get(id);
    if (cached != null) return cached;
    StreamExecution exec = execution(id);
    if (exec == null) return null;
    String root = exec.resolvedCheckpointRoot();
    if (root != null) {
      org.apache.hadoop.fs.Path path = new org.apache.hadoop.fs.Path(root);
      if (RemoteLocations.isRemote(path)) {
        String name = RemoteLocations.name(path.toUri());
        REMOTE_LOCATIONS.put(id, name);
        root = RemoteLocations.ensureMirrorRoot(Conf.current(), name).toString();
      } else if (root.startsWith("file:")) {
        root = java.net.URI.create(root).getPath();
      }
      CHECKPOINT_ROOTS.put(id, root);
    }
    return root;
  }

  @Override
  public void onQueryStarted(QueryStartedEvent event) {
    if (!Conf.current().enabled()) return;
    String root = checkpointRoot(event.id());
    if (root != null) {
      DriverHooks.queryStarted(java.nio.file.Paths.get(root).toAbsolutePath().normalize(),
          deletesCheckpointOnStop(event.id()));
    }
    LOG.info("spark-statebackend: query {} ({}) started, checkpoint location {}", event.id(), event.name(), root);
  }

  /**
   * Whether query {@code id} runs on Spark's temporary checkpoint location, which Spark deletes at its stop
   * (StreamExecution's private {@code deleteCheckpointOnStop}). Anything unexpected (another Spark version)
   * answers false: the query is then treated as one that can be resumed, the safe side.
   */
  private static boolean deletesCheckpointOnStop(UUID id) {
    try {
      StreamExecution exec = execution(id);
      if (exec == null) return false;
      for (Class<?> c = exec.getClass(); c != null; c = c.getSuperclass()) {
        try {
          java.lang.reflect.Field f = c.getDeclaredField("deleteCheckpointOnStop");
          f.setAccessible(true);
          return f.getBoolean(exec);
        } catch (NoSuchFieldException e) {
          // declared on a superclass
        }
      }
    } catch (RuntimeException | IllegalAccessException e) {
      LOG.debug("spark-statebackend: query {}: cannot tell whether its location is temporary: {}", id, e.toString());
    }
    return false;
  }

  @Override
  public void onQueryProgress(QueryProgressEvent event) {
    Conf conf = Conf.current();
    if (!conf.enabled()) return;
    StreamingQueryProgress p = event.progress();
    String root = checkpointRoot(p.id());
    String app = conf.appIdentityOrNull();
    if (root == null || app == null) {
      LOG.error("spark-statebackend: query {} batch {}: checkpoint location or app id unknown; the batch will "
          + "not be checkpointed", p.id(), p.batchId());
      return;
    }
    SpoolDocuments.Progress doc = new SpoolDocuments.Progress(p.id().toString(), p.runId().toString(), p.name(),
        p.batchId(), root, REMOTE_LOCATIONS.get(p.id()), p.json(), System.currentTimeMillis());
    Path driverSpool = Conf.executorSpoolDir(conf.spoolRoot(), app, "driver");
    // Before the hand-over, so the figures are never the committer's answer to this very batch.
    addFigures(p, driverSpool);
    Path dir = driverSpool.resolve("progress");
    try {
      Spool.writeJsonAtomically(dir.resolve(Spool.nextStem() + ".json"), doc.toJson());
      DriverHooks.progressHanded(java.nio.file.Paths.get(root).toAbsolutePath().normalize(), p.batchId());
    } catch (Exception e) {
      LOG.error("spark-statebackend: query {} batch {}: cannot hand the batch to the committer: {}", p.id(),
          p.batchId(), e.toString());
    }
  }

  /** The backend's figures for the query into its progress ({@link ProgressFigures}); never throws. */
  private static void addFigures(StreamingQueryProgress p, Path driverSpool) {
    try {
      ProgressFigures.addTo(p, ProgressFigures.read(driverSpool, p.id().toString()));
    } catch (RuntimeException | LinkageError e) {
      LOG.warn("spark-statebackend: query {} batch {}: its progress carries no backend figures: {}", p.id(),
          p.batchId(), e.toString());
    }
  }

  @Override
  public void onQueryTerminated(QueryTerminatedEvent event) {
    String root = CHECKPOINT_ROOTS.remove(event.id());
    REMOTE_LOCATIONS.remove(event.id());
    if (root != null) DriverHooks.queryTerminated(java.nio.file.Paths.get(root).toAbsolutePath().normalize());
  }
}
