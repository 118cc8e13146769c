package dev.statebackend.spark;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Map;
import java.util.TreeMap;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import scala.Tuple2;

/**
 * The shim's view of the {@code spark.statebackend.*} keys.
 *
 * <p>Why it exists: the shim's hooks are instantiated by Spark through reflection (provider, file
 * system, plugin) so nothing can be passed to them; every hook reads its settings from the JVM's
 * {@code SparkEnv} conf (the executor's copy of the application's SparkConf). The Python side
 * (spark_statebackend.settings) validates the whole prefix at start (the plugin runs it); this class
 * only parses what the JVM uses and fails with the key's name on a bad value.
 */
public final class Conf {
  public static final String PREFIX = "spark.statebackend.";

  public static final String ENABLED = PREFIX + "enabled";
  public static final String STAGING_DIR = PREFIX + "stagingDir";
  public static final String SPOOL_DIR = PREFIX + "spoolDir";
  /** Where remote checkpoint locations' store dirs are mirrored on each host (RemoteLocations). */
  public static final String MIRROR_DIR = PREFIX + "mirrorDir";
  /** How long a mirror nobody uses is kept before a start on its host removes it (MirrorCleaner). */
  public static final String MIRROR_RETENTION = PREFIX + "mirrorRetention";
  /** Hadoop schemes whose file system the plugin wraps, beside the common ones (MirroringFileSystem). */
  public static final String REMOTE_SCHEMES = PREFIX + "remoteSchemes";
  /** Deprecated: milliseconds; {@link #RESTORE_TIMEOUT} (a duration) is the key now. */
  public static final String RESTORE_TIMEOUT_MS = PREFIX + "restoreTimeoutMs";
  public static final String RESTORE_TIMEOUT = PREFIX + "restoreTimeout";
  public static final String SIDECAR_MODE = PREFIX + "sidecar.mode";
  public static final String MAX_COMMIT_DELAY = PREFIX + "maxCommitDelay";
  public static final String COMMIT_TIMEOUT = PREFIX + "commitTimeout";
  public static final String DRAIN_TIMEOUT = PREFIX + "drainTimeout";
  public static final String SIDECAR_PYTHON = PREFIX + "sidecar.python";
  /** The Python configure() ran in (it sets this): the driver's own, so its sidecar's first choice. */
  public static final String SIDECAR_DRIVER_PYTHON = PREFIX + "sidecar.driverPython";
  public static final String LOCAL_CHECKPOINT_FILE_MANAGER = PREFIX + "localCheckpointFileManager";
  public static final String LINK_SST_FILES = PREFIX + "linkSstFiles";
  public static final String DURABLE_COMMIT = PREFIX + "durableCommit";
  /** Read by the sidecars (common/metrics.py); parsed here so a bad value fails the start naming it. */
  public static final String METRICS_PER_STORE = PREFIX + "metrics.perStore";
  /** The checkpoint file manager the user had configured; the plugin records it here and installs ours. */
  public static final String DELEGATE_FILE_MANAGER = PREFIX + "checkpointFileManager.delegate";
  public static final String CHECKPOINT_FILE_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass";
  public static final String APP_ID = "spark.app.id";
  /** Spark's own key (core/config APP_ATTEMPT_ID), set by SparkContext when the cluster manager has one. */
  public static final String APP_ATTEMPT_ID = "spark.app.attempt.id";
  static final String ATTEMPT_SEPARATOR = ".attempt-";

  private final SparkConf conf;

  private Conf(SparkConf conf) {
    this.conf = conf;
  }

  /** Settings of this JVM's Spark environment; defaults only when no SparkEnv exists (unit use). */
  public static Conf current() {
    SparkEnv env = SparkEnv.get();
    return new Conf(env == null ? new SparkConf(false) : env.conf());
  }

  public static Conf of(SparkConf conf) {
    return new Conf(conf);
  }

  public boolean enabled() {
    return bool(ENABLED, true);
  }

  public boolean localCheckpointFileManager() {
    return bool(LOCAL_CHECKPOINT_FILE_MANAGER, true);
  }

  /**
   * A store's commit waits for its version's upload and report (README "Exactly once"); on by default,
   * as the safe choice. Without sidecar processes ({@code sidecar.mode=none}) nothing uploads in this
   * JVM, so there is nothing to wait for.
   */
  public boolean durableCommit() {
    return bool(DURABLE_COMMIT, true) && "process".equals(sidecarMode());
  }

  public boolean linkSstFiles() {
    return bool(LINK_SST_FILES, true);
  }

  /** Whether the sidecars label their backup and restore metrics by store instance too (off: per query). */
  public boolean metricsPerStore() {
    return bool(METRICS_PER_STORE, false);
  }

  /** The user's own checkpoint file manager class that ours delegates to, or null. */
  public String delegateFileManagerOrNull() {
    String v = conf.get(DELEGATE_FILE_MANAGER, "").trim();
    return v.isEmpty() ? null : v;
  }

  /**
   * Parses every key this JVM reads, so a bad value fails the application at start naming the key
   * rather than a commit or a load later. (The Python side validates the whole prefix.)
   */
  public void validate() {
    enabled();
    localCheckpointFileManager();
    linkSstFiles();
    metricsPerStore();
    durableCommit();
    restoreTimeoutMs();
    maxCommitDelayMs();
    commitTimeoutMs();
    drainTimeoutMs();
    mirrorRetentionMs();
    String mode = sidecarMode();
    if (!mode.equals("process") && !mode.equals("none")) {
      throw new IllegalArgumentException(SIDECAR_MODE + ": expected process or none, got '" + mode + "'");
    }
  }

  /** Explicit staging root, or null: then each query stages under its checkpoint location. */
  public String stagingDirOrNull() {
    String v = conf.get(STAGING_DIR, "").trim();
    return v.isEmpty() ? null : v;
  }

  /**
   * Root of all spool dirs of this user on this host: {@code spoolDir}, default {@code
   * <java.io.tmpdir>/spark-statebackend-<user>/spool} (per user: the spool is private, see PrivateDirs).
   */
  public Path spoolRoot() {
    String v = conf.get(SPOOL_DIR, "").trim();
    if (!v.isEmpty()) return Paths.get(v).toAbsolutePath().normalize();
    return Paths.get(System.getProperty("java.io.tmpdir"), "spark-statebackend-" + sanitizeId(
        System.getProperty("user.name", "")), "spool").toAbsolutePath().normalize();
  }

  /**
   * Root of the local mirrors of remote checkpoint locations on this host: {@code mirrorDir}, default
   * {@code <java.io.tmpdir>/spark-statebackend-<user>/mirrors} (beside the default spool root: private).
   */
  public Path mirrorDir() {
    String v = conf.get(MIRROR_DIR, "").trim();
    if (!v.isEmpty()) return Paths.get(v).toAbsolutePath().normalize();
    return Paths.get(System.getProperty("java.io.tmpdir"), "spark-statebackend-" + sanitizeId(
        System.getProperty("user.name", "")), "mirrors").toAbsolutePath().normalize();
  }

  /**
   * spark.statebackend.mirrorRetention (default 7d): a mirror root no JVM on the host has used for this
   * long, with no upload pending, is removed when a JVM of an application with the plugin starts there.
   */
  public long mirrorRetentionMs() {
    return durationMs(MIRROR_RETENTION, "7d", true);
  }

  /** {@code remoteSchemes}: extra Hadoop schemes to wrap, lower case, without blanks. */
  public java.util.List<String> remoteSchemes() {
    java.util.List<String> out = new java.util.ArrayList<>();
    for (String s : conf.get(REMOTE_SCHEMES, "").split(",")) {
      String t = s.trim().toLowerCase(java.util.Locale.ROOT);
      if (!t.isEmpty() && !out.contains(t)) out.add(t);
    }
    return out;
  }

  /**
   * {@code restoreTimeout} (default 10min), or the deprecated {@code restoreTimeoutMs} (milliseconds),
   * read first as before; both set to different values is an error (the sidecar would disagree).
   */
  public long restoreTimeoutMs() {
    long fromNew = durationMs(RESTORE_TIMEOUT, "10min", true);
    if (!conf.contains(RESTORE_TIMEOUT_MS)) return fromNew;
    long v;
    try {
      v = Long.parseLong(conf.get(RESTORE_TIMEOUT_MS).trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(RESTORE_TIMEOUT_MS + ": not a whole number of milliseconds: "
          + conf.get(RESTORE_TIMEOUT_MS), e);
    }
    if (v <= 0) throw new IllegalArgumentException(RESTORE_TIMEOUT_MS + " must be positive, got " + v);
    if (conf.contains(RESTORE_TIMEOUT) && fromNew != v) {
      throw new IllegalArgumentException(RESTORE_TIMEOUT_MS + "=" + v + " contradicts " + RESTORE_TIMEOUT + "="
          + conf.get(RESTORE_TIMEOUT) + "; set only " + RESTORE_TIMEOUT);
    }
    return v;
  }

  /** spark.statebackend.maxCommitDelay (default 60s): upload lag beyond which the next commit blocks. */
  public long maxCommitDelayMs() {
    return durationMs(MAX_COMMIT_DELAY, "60s", false);
  }

  /**
   * spark.statebackend.drainTimeout (default 60s): at application or executor stop, how long a sidecar
   * may take to finish uploading and checkpointing the batches already done.
   */
  public long drainTimeoutMs() {
    return durationMs(DRAIN_TIMEOUT, "60s", false);
  }

  /** spark.statebackend.commitTimeout (default 30min): how long a blocked commit waits before failing. */
  public long commitTimeoutMs() {
    return durationMs(COMMIT_TIMEOUT, "30min", true);
  }

  /**
   * A duration in Spark's grammar (JavaUtils.timeStringAsMs) with the project's two restrictions, the
   * same as spark_statebackend.common.units: a unit is required (bare 0 excepted), and no negatives. Spark
   * reads a bare number as milliseconds here but as seconds elsewhere, so "60" is refused.
   */
  private long durationMs(String key, String dflt, boolean positive) {
    String raw = conf.get(key, dflt).trim();
    if (!DURATION.matcher(raw).matches()) {
      throw new IllegalArgumentException(key + ": not a duration with a unit (e.g. 60s, 10min): '" + raw + "'");
    }
    long ms;
    try {
      ms = org.apache.spark.network.util.JavaUtils.timeStringAsMs(raw);
    } catch (RuntimeException e) {
      throw new IllegalArgumentException(key + ": not a duration: '" + raw + "'", e);
    }
    if (positive && ms <= 0) throw new IllegalArgumentException(key + " must be at least 1ms, got '" + raw + "'");
    return ms;
  }

  private static final java.util.regex.Pattern DURATION =
      java.util.regex.Pattern.compile("(?i)0|[0-9]+(us|ms|s|m|min|h|d)");

  /**
   * "process" (the default) starts one sidecar per executor JVM and one for the driver; "none" starts
   * none (tests that serve the spool themselves).
   */
  public String sidecarMode() {
    return conf.get(SIDECAR_MODE, "process").trim().toLowerCase(java.util.Locale.ROOT);
  }

  /** {@link #sidecarPython(Map, boolean)} of this JVM's conf and environment: the path only. */
  public String sidecarPython(boolean driver) {
    return sidecarPython(System.getenv(), driver)[0];
  }

  /**
   * The Python that runs a sidecar (and, on the driver, the start-up validation), and the key or
   * environment variable it came from: {@code {path, source}}. The one home of the rule (settings/keys.py
   * documents it under sidecar.python): {@value #SIDECAR_PYTHON} if set; else as Spark picks the Python
   * of the same process. On an executor, as for its Python workers: spark.pyspark.python, PYSPARK_PYTHON,
   * python3. On the driver: {@value #SIDECAR_DRIVER_PYTHON} (the Python configure() ran in, which is the
   * driver's whatever spark.pyspark.python says for executors, e.g. {@code ./environment/bin/python} of
   * an archive only executors unpack), else as spark-submit picks a PySpark driver's Python:
   * spark.pyspark.driver.python, spark.pyspark.python, PYSPARK_DRIVER_PYTHON, PYSPARK_PYTHON, python3.
   * Public for py4j (tests pass an environment).
   */
  public String[] sidecarPython(Map<String, String> env, boolean driver) {
    String[] confKeys = driver
        ? new String[] {SIDECAR_PYTHON, SIDECAR_DRIVER_PYTHON, "spark.pyspark.driver.python", "spark.pyspark.python"}
        : new String[] {SIDECAR_PYTHON, "spark.pyspark.python"};
    for (String k : confKeys) {
      String v = conf.get(k, "").trim();
      if (!v.isEmpty()) return new String[] {v, k};
    }
    String[] envKeys = driver ? new String[] {"PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON"} : new String[] {"PYSPARK_PYTHON"};
    for (String k : envKeys) {
      String v = env.getOrDefault(k, "").trim();
      if (!v.isEmpty()) return new String[] {v, "environment variable " + k};
    }
    // A local-cluster master's executors run on the driver's host: the driver's Python exists there and
    // has the package, where the host's python3 may not (a venv, like the one make setup builds).
    String driverPython = conf.get(SIDECAR_DRIVER_PYTHON, "").trim();
    if (!driver && !driverPython.isEmpty() && conf.get("spark.master", "").trim().startsWith("local")) {
      return new String[] {driverPython, SIDECAR_DRIVER_PYTHON + " (a local-cluster master: the driver's host)"};
    }
    return new String[] {"python3", "the default, none of " + String.join(", ", confKeys) + ", "
        + String.join(", ", envKeys) + " being set"};
  }

  /** spark.app.id, or null before the scheduler has assigned it (e.g. in DriverPlugin.init). */
  public String appIdOrNull() {
    String v = conf.get(APP_ID, "");
    return v.isEmpty() ? null : v;
  }

  /**
   * spark.app.attempt.id, or null when the cluster manager runs no attempts (everything but YARN cluster
   * mode). SparkContext sets it together with spark.app.id, before plugins register their metrics and
   * before any executor fetches the driver's conf.
   */
  public String attemptIdOrNull() {
    String v = conf.get(APP_ATTEMPT_ID, "").trim();
    return v.isEmpty() ? null : v;
  }

  /**
   * This application attempt's identity ({@link #appIdentity}), or null before spark.app.id is assigned.
   * It names the spool and staging dirs, and reports and checkpoints carry it.
   */
  public String appIdentityOrNull() {
    String app = appIdOrNull();
    return app == null ? null : appIdentity(app, attemptIdOrNull());
  }

  /**
   * The identity of an application attempt: {@code appId} when there is no attempt (so nothing changes
   * for applications without attempts), else {@code <appId>.attempt-<attempt id>} with the attempt id
   * made path-safe. Every attempt of a YARN application keeps its spark.app.id; this tells them apart, so
   * a zombie executor of attempt 1 neither shares a spool with attempt 2 nor gets its uploads into
   * attempt 2's checkpoints. spark_statebackend.runtime.spool.app_identity applies the same rule.
   */
  public static String appIdentity(String appId, String attemptIdOrNull) {
    String attempt = attemptIdOrNull == null ? "" : attemptIdOrNull.trim();
    if (appId == null || appId.isEmpty() || attempt.isEmpty()) return appId;
    return appId + ATTEMPT_SEPARATOR + sanitizeId(attempt);
  }

  /** Every spark.statebackend.* key plus spark.app.id and spark.app.attempt.id: the sidecar's --conf file. */
  public Map<String, String> sidecarConf() {
    Map<String, String> out = new TreeMap<>();
    for (Tuple2<String, String> kv : conf.getAll()) {
      if (kv._1().startsWith(PREFIX)) out.put(kv._1(), kv._2());
    }
    String app = appIdOrNull();
    if (app != null) out.put(APP_ID, app);
    String attempt = attemptIdOrNull();
    if (attempt != null) out.put(APP_ATTEMPT_ID, attempt);
    return out;
  }

  private boolean bool(String key, boolean dflt) {
    String v = conf.get(key, Boolean.toString(dflt)).trim().toLowerCase(java.util.Locale.ROOT);
    if (v.equals("true")) return true;
    if (v.equals("false")) return false;
    throw new IllegalArgumentException(key + ": expected true or false, got '" + v + "'");
  }

  /**
   * Path-safe form of an app or executor id: characters outside [A-Za-z0-9._-] become '_', and "",
   * "." and ".." become "_". spark_statebackend.runtime.spool.sanitize_id applies the same rule.
   */
  public static String sanitizeId(String id) {
    String s = id == null ? "" : id.replaceAll("[^A-Za-z0-9._-]", "_");
    if (s.isEmpty() || s.equals(".") || s.equals("..")) return "_";
    return s;
  }

  /**
   * {@code <spoolRoot>/<app identity>/<executorId>}: this executor's spool dir (see spool.py); {@code
   * appIdentity} is {@link #appIdentityOrNull()}'s, so each attempt of an application has spool dirs of
   * its own.
   */
  public static Path executorSpoolDir(Path spoolRoot, String appIdentity, String executorId) {
    return spoolRoot.resolve(sanitizeId(appIdentity)).resolve(sanitizeId(executorId));
  }

  /** The driver's spool dir of this application attempt (its sidecar runs the committer). For py4j callers. */
  public static String currentDriverSpoolDir() {
    SparkEnv env = SparkEnv.get();
    if (env == null) throw new IllegalStateException("no SparkEnv in this JVM");
    Conf c = new Conf(env.conf());
    String app = c.appIdentityOrNull();
    if (app == null) throw new IllegalStateException("spark.app.id is not set yet");
    return executorSpoolDir(c.spoolRoot(), app, "driver").toString();
  }

  /** The spool dir of the executor this JVM runs (local mode: executor id "driver"). For py4j callers. */
  public static String currentExecutorSpoolDir() {
    SparkEnv env = SparkEnv.get();
    if (env == null) throw new IllegalStateException("no SparkEnv in this JVM");
    Conf c = new Conf(env.conf());
    String app = c.appIdentityOrNull();
    if (app == null) throw new IllegalStateException("spark.app.id is not set yet");
    return executorSpoolDir(c.spoolRoot(), app, env.executorId()).toString();
  }
}
