package dev.statebackend.spark;

import java.nio.file.Path;
import java.nio.file.Paths;

import org.apache.spark.SparkEnv;

/**
 * What the hooks need to know about the JVM they run in: application identity and executor id, this
 * executor's spool dir, where staging goes, and the timeouts, read once per call from the JVM's Spark conf.
 *
 * <p>Why it exists: Spark constructs our checkpoint file manager by reflection with only a path and a
 * Hadoop conf, so everything else comes from {@code SparkEnv} (the executor's copy of the application's
 * SparkConf). In local mode the executor id is "driver".
 */
final class ExecutorEnv {
  /**
   * Whether this JVM is the driver and also runs tasks (a local master: Spark initializes the executor
   * plugin with executor id "driver"). Its sidecar then serves the tasks' restores too, so the
   * driver-side restore may restore every store ahead of them.
   */
  static volatile boolean driverRunsTasks;

  final Conf conf;
  /** The application attempt's identity ({@link Conf#appIdentityOrNull()}): names the spool and staging dirs. */
  final String appId;
  final String executorId;
  final Path spoolDir;

  private ExecutorEnv(Conf conf, String appId, String executorId) {
    this.conf = conf;
    this.appId = appId;
    this.executorId = executorId;
    this.spoolDir = Conf.executorSpoolDir(conf.spoolRoot(), appId, executorId);
  }

  static ExecutorEnv current() {
    Conf c = Conf.current();
    String app = c.appIdentityOrNull();
    SparkEnv env = SparkEnv.get();
    return new ExecutorEnv(c, app == null ? "unknown-app" : app, env == null ? "driver" : env.executorId());
  }

  /** The env of the driver's sidecar: driver-side requests (checkpoint locations) go there. */
  ExecutorEnv driver() {
    return "driver".equals(executorId) ? this : new ExecutorEnv(conf, appId, "driver");
  }

  /** {@code spark.statebackend.stagingDir}, else {@code <checkpoint root>/_statebackend/staging}. */
  Path stagingRoot(Path checkpointRoot) {
    String explicit = conf.stagingDirOrNull();
    return explicit != null ? Paths.get(explicit).toAbsolutePath()
        : checkpointRoot.resolve("_statebackend").resolve("staging");
  }

  Spool spool() {
    return new Spool(spoolDir);
  }
}
