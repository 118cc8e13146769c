package dev.statebackend.spark;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.net.URI;

import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;

/**
 * Everything the hooks need to know about one state store instance (operator, partition, store name)
 * on this executor, resolved once when Spark creates its RocksDB.
 *
 * <p>Why it exists: the hooked RocksDB and file manager are constructed by Spark's own constructors,
 * which cannot carry our parameters; the provider builds this from {@code
 * RocksDBStateStoreProvider.stateStoreId()} and attaches it after construction.
 */
final class StoreContext {
  /** TaskContext local property keys, from the 4.3.0 bytecode (StreamExecution$, MicroBatchExecution$). */
  static final String QUERY_ID_KEY = "sql.streaming.queryId";
  static final String BATCH_ID_KEY = "streaming.sql.batchId";

  final long operator;
  final int partition;
  final String store;
  /** Local path of the store's checkpoint dir, e.g. {@code <ckpt>/state/0/1}; null if not a local path. */
  final Path dfsDir;
  /** The query's checkpoint location (the parent of {@code state/}). */
  final Path checkpointRoot;
  final Path stagingRoot;
  final String appId;
  final String executorId;
  final Path spoolDir;
  final long restoreTimeoutMs;

  private StoreContext(long operator, int partition, String store, Path dfsDir, Path checkpointRoot,
      Path stagingRoot, String appId, String executorId, Path spoolDir, long restoreTimeoutMs) {
    this.operator = operator;
    this.partition = partition;
    this.store = store;
    this.dfsDir = dfsDir;
    this.checkpointRoot = checkpointRoot;
    this.stagingRoot = stagingRoot;
    this.appId = appId;
    this.executorId = executorId;
    this.spoolDir = spoolDir;
    this.restoreTimeoutMs = restoreTimeoutMs;
  }

  static StoreContext of(StateStoreId id, String dfsRootDir, Conf conf) {
    Path dfs = localPathOrNull(dfsRootDir);
    Path stateRoot = localPathOrNull(id.checkpointRootLocation());
    Path root = null;
    if (stateRoot != null) {
      // checkpointRootLocation is "<query checkpoint>/state" for every stateful operator in 4.3.
      root = "state".equals(String.valueOf(stateRoot.getFileName())) ? stateRoot.getParent() : stateRoot;
    }
    String explicitStaging = conf.stagingDirOrNull();
    Path staging = explicitStaging != null ? Paths.get(explicitStaging).toAbsolutePath()
        : root == null ? null : root.resolve("_statebackend").resolve("staging");
    String app = conf.appIdOrNull();
    SparkEnv env = SparkEnv.get();
    String exec = env == null ? "driver" : env.executorId();
    return new StoreContext(id.operatorId(), id.partitionId(), id.storeName(), dfs, root, staging,
        app == null ? "unknown-app" : app, exec,
        Conf.executorSpoolDir(conf.spoolRoot(), app == null ? "unknown-app" : app, exec),
        conf.restoreTimeoutMs());
  }

  /** A {@code file:} URI or scheme-less path as a local absolute path; null for any other scheme. */
  static Path localPathOrNull(String location) {
    URI uri = new org.apache.hadoop.fs.Path(location).toUri();
    if (uri.getScheme() != null && !"file".equalsIgnoreCase(uri.getScheme())) return null;
    return Paths.get(uri.getPath()).toAbsolutePath().normalize();
  }

  boolean isLocal() {
    return dfsDir != null && checkpointRoot != null && stagingRoot != null;
  }

  /** "op/part/store", for logs. */
  String instance() {
    return operator + "/" + partition + "/" + store;
  }

  /** The running query's id from the task's local properties, or null off a task thread. */
  static String queryId() {
    TaskContext tc = TaskContext.get();
    return tc == null ? null : tc.getLocalProperty(QUERY_ID_KEY);
  }

  /** The running micro-batch id, or null off a task thread or when not parseable. */
  static Long batchId() {
    TaskContext tc = TaskContext.get();
    String v = tc == null ? null : tc.getLocalProperty(BATCH_ID_KEY);
    if (v == null) return null;
    try {
      return Long.parseLong(v.trim());
    } catch (NumberFormatException e) {
      return null;
    }
  }

  Spool spool() {
    return new Spool(spoolDir);
  }
}
