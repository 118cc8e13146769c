package dev.statebackend.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code spark.plugins=dev.statebackend.spark.StateBackendPlugin}: the one key (with the jar) a job needs.
 *
 * <p>Why it exists: Spark's plugin API (org.apache.spark.api.plugin, a public API) runs once per JVM at
 * start and stop, on the driver before any session or query exists and on every executor. At driver start
 * it
 * <ol>
 *   <li>checks the running Spark against what the shim relies on ({@link SignatureCheck}) and parses the
 *   keys the JVM reads ({@link Conf#validate()});</li>
 *   <li>runs {@code <sidecar.python> -m spark_statebackend.spark.validate}, which validates every
 *   {@code spark.statebackend.*} key and contacts the blob store and the checkpoint log: a bad key or an
 *   unreachable URL fails the application here, naming them, under spark-submit too;</li>
 *   <li>installs the hooks in the application's conf, before the session copies it: Spark's UI
 *   redaction of our secret-bearing keys, our
 *   {@link StateBackendCheckpointFileManager} (a manager the user had set becomes its delegate), the
 *   {@link ProgressSpoolListener}, and Spark's RocksDBStateStoreProvider when no provider is set (a
 *   different provider is refused: only RocksDB state is backed up);</li>
 *   <li>once the application id is known, starts the driver's sidecar (the committer, driver-side
 *   restores; in local mode it also serves the executor).</li>
 * </ol>
 * Executors start their own sidecar ({@code spark.statebackend.sidecar.mode=process}, the default) and
 * warm up the state store loader. It never calls {@code PluginContext.hostname()}, which threw a
 * NullPointerException inside ExecutorPlugin.init on Spark 4.3 standalone.
 */
public class StateBackendPlugin implements SparkPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(StateBackendPlugin.class);
  static final String LISTENERS_KEY = "spark.sql.streaming.streamingQueryListeners";
  static final String PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass";
  static final String ROCKSDB_PROVIDER =
      "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider";
  static final String CHECKPOINT_ROOT_KEY = "spark.sql.streaming.checkpointLocation";
  static final String VALIDATE_MODULE = "spark_statebackend.spark.validate";
  static final String REDACTION_KEY = "spark.redaction.regex";
  static final String FILE_FS_KEY = "fs.file.impl";
  static final String FILE_FS_NO_CACHE_KEY = "fs.file.impl.disable.cache";
  /** spark.redaction.regex's default in Spark 4.3 (core/config/package.scala SECRET_REDACTION_PATTERN). */
  static final String SPARK_DEFAULT_REDACTION = "(?i)secret|password|token|access[.]?key";
  /** Names of our options that carry secrets (blobStore.options.*), case-insensitive. */
  static final String OUR_REDACTION =
      "(?i)spark\\.statebackend\\..*(connection.?string|account.?key|account.?url|access.?key|secret|token|sas|password|credential)";
  static final long VALIDATE_TIMEOUT_S = 300;

  @Override
  public DriverPlugin driverPlugin() {
    return new DriverPlugin() {
      private SidecarProcess driverSidecar;
      private SidecarMetrics metrics;
      private java.nio.file.Path spool;
      private long drainTimeoutMs;

      @Override
      public Map<String, String> init(SparkContext sc, PluginContext ctx) {
        SparkConf sparkConf = ctx.conf();
        Conf conf = Conf.of(sparkConf);
        if (!conf.enabled()) {
          LOG.info("spark-statebackend: {}=false; no hooks installed", Conf.ENABLED);
          return Collections.emptyMap();
        }
        conf.validate();
        SignatureCheck.verify();
        driverContext = sc;
        DriverHooks.driverStarted();
        drainTimeoutMs = conf.drainTimeoutMs();
        defaultLocations(sparkConf, sc.master());
        installRemoteFileSystems(sparkConf, sc.hadoopConfiguration());
        checkCheckpointRoot(sparkConf, sc.hadoopConfiguration());
        if ("process".equals(conf.sidecarMode())) validateInPython(conf);
        install(sparkConf);
        installFileSystem(sparkConf, sc.hadoopConfiguration());
        MirrorCleaner.startOnce(conf);   // this host's unused mirrors, on its own thread
        return Collections.emptyMap();
      }

      @Override
      public synchronized void registerMetrics(String appId, PluginContext ctx) {
        Conf conf = Conf.of(ctx.conf());
        if (!conf.enabled()) return;
        // SparkContext has set spark.app.attempt.id (if any) in this conf by now, with spark.app.id.
        String app = Conf.appIdentity(appId, conf.attemptIdOrNull());
        if ("process".equals(conf.sidecarMode()) && driverSidecar == null) {
          driverSidecar = SidecarProcess.ensure(conf, app, "driver").getKey();
        }
        if (metrics == null) {
          metrics = SidecarMetrics.start(Conf.executorSpoolDir(conf.spoolRoot(), app, "driver"),
              ctx.metricRegistry(), "driver");
        }
        spool = Conf.executorSpoolDir(conf.spoolRoot(), app, "driver");
        SpoolCleaner.pruneOldInBackground(conf.spoolRoot(), app);
      }

      @Override
      public synchronized void shutdown() {
        if (metrics != null) metrics.stop();
        metrics = null;
        if (driverSidecar != null) {
          long deadline = System.currentTimeMillis() + drainTimeoutMs;
          awaitListeners(driverContext, drainTimeoutMs);
          driverSidecar.close(Math.max(0, deadline - System.currentTimeMillis()));
        }
        driverSidecar = null;
        if (spool != null) SpoolCleaner.atStop(spool);
        spool = null;
      }
    };
  }

  /** The SparkContext of this driver JVM, once the driver plugin has started (else null). */
  private static volatile SparkContext driverContext;

  static SparkContext driverContext() {
    return driverContext;
  }

  /**
   * Waits, at most {@code timeoutMs}, until Spark's listener bus has delivered every event posted so far.
   * Why: {@code SparkContext.stop()} shuts the plugins down before it stops the listener bus, so the last
   * batches' {@code QueryProgressEvent}s may still be queued (behind any slow listener of the user's) when
   * the driver's sidecar is told to drain; {@link ProgressSpoolListener} must hand them over first, or a
   * clean stop would lose the last checkpoint. Never throws: a stop goes on after the bound, with a
   * warning.
   */
  static void awaitListeners(SparkContext sc, long timeoutMs) {
    if (sc == null) return;
    long start = System.currentTimeMillis();
    // A query thread still running (SIGTERM runs Spark's shutdown beside it) could commit after the bus was
    // drained: no further commit is admitted, and the progress of those published is awaited below.
    DriverHooks.stopCommits();
    try {
      sc.listenerBus().waitUntilEmpty(Math.max(1, timeoutMs));
      DriverHooks.awaitHandover(start + Math.max(1, timeoutMs));
      LOG.info("spark-statebackend: listener bus drained in {} ms before the driver's sidecar stops",
          System.currentTimeMillis() - start);
    } catch (java.util.concurrent.TimeoutException e) {
      LOG.warn("spark-statebackend: Spark's listener bus still had events after {} ({} ms); batches they "
          + "report may not be checkpointed before the application stops (the next start resumes from "
          + "Spark's own files)", Conf.DRAIN_TIMEOUT, timeoutMs);
    } catch (RuntimeException e) {
      LOG.warn("spark-statebackend: could not wait for Spark's listener bus at stop: {}", e.toString());
    }
  }

  /**
   * The blob store and checkpoint log default to directories under the driver's working directory,
   * which only work when every executor shares the driver's disk. For {@code local} and
   * {@code local-cluster} masters the defaults are resolved here, once, on the driver, and set
   * explicitly (a sidecar elsewhere would resolve a relative default against its own directory); for
   * any other master an unset URL fails the application, naming the key and why.
   */
  static void defaultLocations(SparkConf conf, String master) {
    boolean oneHost = master != null && (master.equals("local") || master.startsWith("local["))
        || master != null && master.startsWith("local-cluster[");
    String[][] defaults = {
        {Conf.PREFIX + "blobStore.url", "blobs"},
        {Conf.PREFIX + "checkpointLog.url", "checkpoints"},
    };
    for (String[] d : defaults) {
      if (conf.contains(d[0]) && !conf.get(d[0]).trim().isEmpty()) continue;
      if (!oneHost) {
        throw new IllegalArgumentException("spark-statebackend: " + d[0] + " is not set; with master " + master
            + " executors do not share the driver's disk, so the default (a directory under the driver's "
            + "working directory) would leave each executor with a store of its own. Set it to a location "
            + "every executor and the driver reach (s3://, azure://, or file:// on a shared file system)");
      }
      java.nio.file.Path dir = java.nio.file.Paths.get("").toAbsolutePath().resolve("spark-statebackend")
          .resolve(d[1]);
      String uri = dir.toUri().toString();   // file:///abs/path, encoded; no trailing slash
      conf.set(d[0], uri.endsWith("/") ? uri.substring(0, uri.length() - 1) : uri);
    }
  }

  /** Puts our hooks into the application's conf (see the class doc); idempotent. */
  static void install(SparkConf conf) {
    String fm = conf.get(Conf.CHECKPOINT_FILE_MANAGER_KEY, "").trim();
    String ours = StateBackendCheckpointFileManager.class.getName();
    if (!fm.isEmpty() && !fm.equals(ours) && !conf.contains(Conf.DELEGATE_FILE_MANAGER)) {
      conf.set(Conf.DELEGATE_FILE_MANAGER, fm);
      LOG.info("spark-statebackend: {}={} is kept as the delegate of {}", Conf.CHECKPOINT_FILE_MANAGER_KEY, fm,
          ours);
    }
    conf.set(Conf.CHECKPOINT_FILE_MANAGER_KEY, ours);
    conf.set(LISTENERS_KEY, appendTo(conf.get(LISTENERS_KEY, ""), ProgressSpoolListener.class.getName()));
    // Spark shows every conf entry in its UI and event log, hiding values whose key or value matches
    // this pattern; its default misses our secrets' names (connection_string, account_url with a SAS,
    // access_key_id), so we add them to whatever pattern is set.
    String redaction = conf.get(REDACTION_KEY, SPARK_DEFAULT_REDACTION);
    if (!redaction.contains(OUR_REDACTION)) conf.set(REDACTION_KEY, redaction + "|" + OUR_REDACTION);
    String provider = conf.get(PROVIDER_KEY, "").trim();
    if (provider.isEmpty()) {
      conf.set(PROVIDER_KEY, ROCKSDB_PROVIDER);
    } else if (!provider.equals(ROCKSDB_PROVIDER)) {
      throw new IllegalArgumentException("spark-statebackend backs up Spark's RocksDB state store: "
          + PROVIDER_KEY + "=" + provider + " is not supported; use " + ROCKSDB_PROVIDER
          + " (or leave the key unset), or set " + Conf.ENABLED + "=false");
    }
  }

  /**
   * Makes {@link LinkingLocalFileSystem} the {@code file:} scheme's Hadoop file system of every session,
   * unless {@code linkSstFiles=false} or the user chose that file system (in the SparkConf, either
   * spelling, or in the Hadoop conf files): theirs is kept, and Spark copies SSTs as before. A bare Hadoop
   * key in the SparkConf reaches each session's SQL conf and from there the Hadoop conf Spark hands its
   * state stores, like the checkpoint file manager's key; the driver's SparkContext conf, built before
   * plugins run, is left alone.
   */
  static void installFileSystem(SparkConf conf, org.apache.hadoop.conf.Configuration hadoopConf) {
    if (!Conf.of(conf).linkSstFiles()) return;
    String ours = LinkingLocalFileSystem.class.getName();
    String[] theirs = {conf.get(FILE_FS_KEY, ""), conf.get("spark.hadoop." + FILE_FS_KEY, ""),
        hadoopConf.get(FILE_FS_KEY, "")};
    for (String v : theirs) {
      if (!v.trim().isEmpty() && !v.trim().equals(ours)) {
        LOG.info("spark-statebackend: {}={} is kept; Spark's RocksDB state store copies its SST files "
            + "instead of linking them ({})", FILE_FS_KEY, v.trim(), Conf.LINK_SST_FILES);
        return;
      }
    }
    conf.set(FILE_FS_KEY, ours);
    conf.set(FILE_FS_NO_CACHE_KEY, "true");
  }

  /**
   * Refuses an application whose default checkpoint root ({@value #CHECKPOINT_ROOT_KEY}) is on a Hadoop
   * scheme whose file system {@link #installRemoteFileSystems} could not wrap: every stateful query under
   * it would be refused at its start ({@link DriverHooks#beforeQueryStart}), so the application fails
   * now, naming the key, before it does any work. A path without a scheme is on the default file system
   * ({@code fs.defaultFS}).
   */
  static void checkCheckpointRoot(SparkConf conf, org.apache.hadoop.conf.Configuration hadoopConf) {
    org.apache.hadoop.fs.Path path = checkpointRootOrNull(conf);
    if (path == null || LocalCheckpointFileManager.isFileScheme(path, hadoopConf)) return;
    String scheme = schemeOf(path, hadoopConf);
    String impl = conf.get("fs." + scheme + ".impl", "");
    if (!MirroringFileSystem.class.getName().equals(impl)) {
      throw new IllegalArgumentException(DriverHooks.notWrapped(CHECKPOINT_ROOT_KEY + "=" + path, scheme,
          hadoopConf.get("fs." + scheme + ".impl", "")));
    }
  }

  private static org.apache.hadoop.fs.Path checkpointRootOrNull(SparkConf conf) {
    String root = conf.get(CHECKPOINT_ROOT_KEY, "").trim();
    if (root.isEmpty()) return null;
    try {
      return new org.apache.hadoop.fs.Path(root);
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("spark-statebackend: " + CHECKPOINT_ROOT_KEY + "=" + root
          + " is not a valid path: " + e.getMessage(), e);
    }
  }

  /** {@code path}'s scheme in lower case; a path without one is on {@code fs.defaultFS}. */
  private static String schemeOf(org.apache.hadoop.fs.Path path, org.apache.hadoop.conf.Configuration hadoopConf) {
    String s = path.toUri().getScheme();
    if (s == null) s = org.apache.hadoop.fs.FileSystem.getDefaultUri(hadoopConf).getScheme();
    return s == null ? "file" : s.toLowerCase(java.util.Locale.ROOT);
  }

  /** The remote schemes wrapped whenever their file system class exists. */
  static final List<String> COMMON_REMOTE_SCHEMES = java.util.Arrays.asList("s3a", "s3", "gs", "abfs", "abfss",
      "wasb", "wasbs", "hdfs", "viewfs", "webhdfs", "oss");
  private static final java.util.regex.Pattern FS_IMPL_KEY =
      java.util.regex.Pattern.compile("(?:spark\\.hadoop\\.)?fs\\.([A-Za-z][A-Za-z0-9+-]*)\\.impl");

  /**
   * Makes {@link MirroringFileSystem} the Hadoop file system of every remote scheme a checkpoint location
   * may use, in every session (bare keys, as {@link #installFileSystem}): {@link #COMMON_REMOTE_SCHEMES},
   * the schemes the user set a file system for in the SparkConf ({@code [spark.hadoop.]fs.<scheme>.impl}),
   * those of {@code fs.defaultFS} and {@value #CHECKPOINT_ROOT_KEY}, and {@code remoteSchemes}; each only
   * when its class (the user's, else Hadoop's) exists. Which scheme a query uses is known only when it
   * starts, after the sessions' confs are made. The class the scheme had is recorded for the wrapper.
   */
  static void installRemoteFileSystems(SparkConf conf, org.apache.hadoop.conf.Configuration hadoopConf) {
    java.util.Set<String> requested = new java.util.LinkedHashSet<>(Conf.of(conf).remoteSchemes());
    org.apache.hadoop.fs.Path root = checkpointRootOrNull(conf);
    if (root != null) requested.add(schemeOf(root, hadoopConf));
    requested.add(schemeOf(new org.apache.hadoop.fs.Path("/"), hadoopConf));
    for (scala.Tuple2<String, String> kv : conf.getAll()) {
      java.util.regex.Matcher m = FS_IMPL_KEY.matcher(kv._1());
      if (m.matches()) requested.add(m.group(1).toLowerCase(java.util.Locale.ROOT));
    }
    java.util.Set<String> schemes = new java.util.LinkedHashSet<>(requested);
    schemes.addAll(COMMON_REMOTE_SCHEMES);
    schemes.remove("file");
    String ours = MirroringFileSystem.class.getName();
    for (String scheme : schemes) {
      String implKey = "fs." + scheme + ".impl";
      String original = firstSet(conf, hadoopConf, implKey);
      if (ours.equals(original)) continue;   // wrapped already
      if (!fileSystemExists(scheme, original, hadoopConf)) {
        if (requested.contains(scheme)) {
          LOG.warn("spark-statebackend: no Hadoop file system class for scheme '{}' ({}={}); checkpoint "
              + "locations on it are refused", scheme, implKey, original.isEmpty() ? "<unset>" : original);
        }
        continue;
      }
      conf.set(MirroringFileSystem.originalImplKey(scheme), original);
      conf.set(MirroringFileSystem.originalNoCacheKey(scheme), firstSet(conf, hadoopConf, implKey + ".disable.cache"));
      conf.set(implKey, ours);
      conf.set(implKey + ".disable.cache", "true");
    }
  }

  /** {@code key} as a session would see it: bare in the SparkConf, else {@code spark.hadoop.}, else Hadoop's. */
  private static String firstSet(SparkConf conf, org.apache.hadoop.conf.Configuration hadoopConf, String key) {
    for (String v : new String[] {conf.get(key, ""), conf.get("spark.hadoop." + key, ""), hadoopConf.get(key, "")}) {
      if (v != null && !v.trim().isEmpty()) return v.trim();
    }
    return "";
  }

  private static boolean fileSystemExists(String scheme, String cls, org.apache.hadoop.conf.Configuration hadoopConf) {
    try {
      if (!cls.isEmpty()) {
        Class.forName(cls, false, Thread.currentThread().getContextClassLoader());
      } else {
        org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, hadoopConf);
      }
      return true;
    } catch (ClassNotFoundException | java.io.IOException | RuntimeException | LinkageError e) {
      return false;
    }
  }

  static String appendTo(String csv, String item) {
    List<String> items = new ArrayList<>();
    for (String s : csv.split(",")) if (!s.trim().isEmpty()) items.add(s.trim());
    if (!items.contains(item)) items.add(item);
    return String.join(",", items);
  }

  /**
   * Runs the Python validator on every spark.statebackend.* key; throws IllegalArgumentException with
   * its message (which names the key and URL, never a secret) when it fails.
   */
  static void validateInPython(Conf conf) {
    String[] python = conf.sidecarPython(System.getenv(), true);
    List<String> argv = new ArrayList<>();
    argv.add(python[0]);
    argv.add("-m");
    argv.add(VALIDATE_MODULE);
    argv.add("--conf");
    Path dir = null;
    try {
      dir = Files.createTempDirectory("spark-statebackend-validate",
          PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------")));
      Path file = Files.createFile(dir.resolve("conf.json"),
          PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
      Files.write(file, Spool.MAPPER.writeValueAsBytes(conf.sidecarConf()));
      argv.add(file.toString());
      Path out = dir.resolve("out.txt");
      int code = runPython(argv, out, false, VALIDATE_TIMEOUT_S);
      if (code < 0) {
        throw new IllegalArgumentException("spark-statebackend: validating the configuration (" + argv
            + ") took longer than " + VALIDATE_TIMEOUT_S + " s");
      }
      String text = new String(Files.readAllBytes(out), StandardCharsets.UTF_8).trim();
      if (code != 0) {
        throw new IllegalArgumentException("spark-statebackend: invalid configuration: "
            + (text.isEmpty() ? "the validator exited with code " + code : errorFirst(text))
            + " (validator: Python '" + python[0] + "' from " + python[1] + "; if it lacks the spark-statebackend"
            + " package, set " + Conf.SIDECAR_PYTHON + ")");
      }
      LOG.info("spark-statebackend: configuration valid: {}", lastLines(text, 3));
    } catch (IOException e) {
      throw new IllegalArgumentException("spark-statebackend: cannot run " + argv + " to validate the "
          + "configuration (Python '" + python[0] + "' from " + python[1] + "); set " + Conf.SIDECAR_PYTHON
          + " to a Python with the spark-statebackend package installed: " + e, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("spark-statebackend: interrupted while validating the configuration", e);
    } finally {
      HardLinks.deleteTree(dir);
    }
  }

  /**
   * Runs a Python check (the validator) with stdout and stderr to {@code out} (appended to, or replacing
   * it), waiting at most {@code timeoutS}; returns its exit code, or -1 after killing it at the timeout.
   */
  static int runPython(List<String> argv, Path out, boolean append, long timeoutS)
      throws IOException, InterruptedException {
    ProcessBuilder.Redirect to = append ? ProcessBuilder.Redirect.appendTo(out.toFile())
        : ProcessBuilder.Redirect.to(out.toFile());
    if (!Files.exists(out, java.nio.file.LinkOption.NOFOLLOW_LINKS)) Files.createFile(out, PrivateDirs.FILE_0600);
    Process p = new ProcessBuilder(argv).redirectErrorStream(true).redirectOutput(to).start();
    if (!p.waitFor(timeoutS, TimeUnit.SECONDS)) {
      p.destroyForcibly();
      return -1;
    }
    return p.exitValue();
  }

  /**
   * The validator's error (its last line: stdout and stderr share the file) first, so the exception's
   * headline names the key and URL; any warnings it logged before (retries, deprecated names) follow.
   */
  static String errorFirst(String text) {
    int cut = text.lastIndexOf('\n');
    if (cut < 0) return text;
    return text.substring(cut + 1) + "\n(validator output before the error:\n" + lastLines(text.substring(0, cut), 19)
        + ")";
  }

  private static String lastLines(String text, int n) {
    String[] lines = text.split("\n");
    int from = Math.max(0, lines.length - n);
    return String.join("\n", java.util.Arrays.copyOfRange(lines, from, lines.length));
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new SidecarExecutorPlugin();
  }

  /** Starts the sidecar at init, or at the first task if spark.app.id is not known yet (local mode). */
  static final class SidecarExecutorPlugin implements ExecutorPlugin {
    private String executorId;
    private boolean wanted;
    private SidecarProcess sidecar;
    private boolean mine;
    private com.codahale.metrics.MetricRegistry registry;
    private SidecarMetrics metrics;

    @Override
    public synchronized void init(PluginContext ctx, Map<String, String> extraConf) {
      Conf conf = Conf.of(ctx.conf());
      executorId = ctx.executorID();
      registry = ctx.metricRegistry();
      if ("driver".equals(executorId)) ExecutorEnv.driverRunsTasks = true;
      if (!conf.enabled()) return;
      conf.validate();
      SignatureCheck.verify();
      WarmUp.startInBackground(executorId);
      MirrorCleaner.startOnce(conf);   // each host's own mirrors; once per JVM (local mode: the driver's run)
      wanted = "process".equals(conf.sidecarMode());
      if (!wanted) {
        LOG.info("spark-statebackend: executor {}: sidecar.mode={}, no sidecar process", executorId,
            conf.sidecarMode());
        return;
      }
      if (conf.appIdentityOrNull() != null) start(conf, conf.appIdentityOrNull());
    }

    private void start(Conf conf, String app) {
      Map.Entry<SidecarProcess, Boolean> s = SidecarProcess.ensure(conf, app, executorId);
      sidecar = s.getKey();
      mine = s.getValue();
      if (mine && !"driver".equals(executorId)) SpoolCleaner.pruneOldInBackground(conf.spoolRoot(), app);
      // In local mode the executor is the driver's JVM and the driver plugin publishes that sidecar.
      if (!"driver".equals(executorId) && registry != null && metrics == null) {
        metrics = SidecarMetrics.start(Conf.executorSpoolDir(conf.spoolRoot(), app, executorId), registry,
            executorId);
      }
    }

    @Override
    public void onTaskStart() {
      if (!wanted) return;
      synchronized (this) {
        if (sidecar != null) return;
        Conf conf = Conf.current();
        String app = conf.appIdentityOrNull();
        if (app == null) throw new IllegalStateException("spark-statebackend: spark.app.id is unknown on "
            + "executor " + executorId + "; cannot place its spool dir");
        start(conf, app);
      }
    }

    @Override
    public synchronized void shutdown() {
      if (metrics != null) metrics.stop();
      metrics = null;
      if (sidecar != null && mine) {
        sidecar.close();
        SpoolCleaner.atStop(sidecar.spoolDir());
      }
      sidecar = null;
    }
  }
}
