package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One executor's Python sidecar process: started with the documented argv, stopped on plugin shutdown
 * or JVM exit.
 *
 * <p>Why it exists: uploads and restores run in Python (the blob SDKs), one long-lived process per
 * executor JVM, next to the spool dir it serves. The command line is the contract with {@code
 * spark_statebackend.runtime.sidecar}: {@code <sidecar.python> -m spark_statebackend.runtime.sidecar
 * --spool-dir <executor spool dir> --executor-id <id> --conf <spool dir>/sidecar-conf.json --jvm-pid <this
 * JVM's pid>}; stdout and stderr are appended to {@code <spool dir>/sidecar.log}, which {@link
 * SidecarLogForwarder} copies into this JVM's log (where Spark's logs go). A kill -9 of the JVM runs no
 * hook: the sidecar must watch its parent pid itself, and it is told the JVM's pid because one it read
 * itself could already be the pid of the process it was reparented to (the JVM died while the sidecar
 * started). Hooks no Spark member.
 *
 * <p>Supervised: a sidecar that exits without being stopped (killed, crashed) is started again at once,
 * logged as an error; the new one finishes the work its predecessor had claimed (see
 * spark_statebackend/runtime/sidecar.py). At most
 * {@link #MAX_RESTARTS} restarts per {@link #RESTART_WINDOW_MS}; after that it stays down with an error
 * saying that this executor's state is no longer backed up, and {@code status.json} says the backup lags
 * from that moment, so commits block after maxCommitDelay and fail after commitTimeout (see
 * {@link CommitGate}); restores wait {@code RestoreRequester.LIVENESS_GRACE_MS} and fall back to Spark's
 * files.
 */
final class SidecarProcess {
  private static final Logger LOG = LoggerFactory.getLogger(SidecarProcess.class);
  static final String MODULE = "spark_statebackend.runtime.sidecar";
  static final String CONF_FILE = "sidecar-conf.json";
  static final String LOG_FILE = "sidecar.log";

  static final int MAX_RESTARTS = 5;
  static final long RESTART_WINDOW_MS = 10 * 60_000L;

  private final List<String> argv;
  private final long drainTimeoutMs;
  private final String executorId;
  private final Path spoolDir;
  private final Thread shutdownHook;
  private final SidecarLogForwarder logForwarder;
  private final ArrayDeque<Long> restartTimes = new ArrayDeque<>(); // guarded by this
  private Process process; // guarded by this; the current child
  private boolean stopped; // guarded by this; set before any intended stop, so its exit is not restarted

  private SidecarProcess(List<String> argv, String executorId, Path spoolDir, long drainTimeoutMs) {
    this.drainTimeoutMs = drainTimeoutMs;
    this.argv = argv;
    this.executorId = executorId;
    this.spoolDir = spoolDir;
    this.logForwarder = new SidecarLogForwarder(spoolDir.resolve(LOG_FILE), executorId);
    this.shutdownHook = new Thread(() -> {
      if ("driver".equals(executorId)) {
        // A JVM told to exit (SIGTERM) runs this hook beside Spark's own, which stops the SparkContext:
        // the batches its listener bus still holds must reach the committer before the drain, as at a
        // plugin shutdown (StateBackendPlugin.awaitListeners), within the same drainTimeout.
        long deadline = System.currentTimeMillis() + drainTimeoutMs;
        StateBackendPlugin.awaitListeners(StateBackendPlugin.driverContext(), drainTimeoutMs);
        stop("JVM shutdown", Math.max(0, deadline - System.currentTimeMillis()));
      } else {
        stop("JVM shutdown");
      }
      SpoolCleaner.atStop(spoolDir);   // an executor killed by its worker runs no plugin shutdown
    }, "statebackend-sidecar-stop");
  }

  static List<String> argv(Conf conf, Path spoolDir, String executorId) {
    List<String> argv = new ArrayList<>();
    argv.add(conf.sidecarPython("driver".equals(executorId)));
    argv.add("-m");
    argv.add(MODULE);
    argv.add("--spool-dir");
    argv.add(spoolDir.toString());
    argv.add("--executor-id");
    argv.add(executorId);
    argv.add("--conf");
    argv.add(spoolDir.resolve(CONF_FILE).toString());
    argv.add("--jvm-pid");
    argv.add(Long.toString(ProcessHandle.current().pid()));
    return argv;
  }

  /** Sidecars this JVM started, by executor id (local mode: the driver's serves its executor too). */
  private static final Map<String, SidecarProcess> RUNNING = new java.util.HashMap<>();

  /**
   * The sidecar of {@code executorId} in this JVM, started if there is none yet. Returns it and whether
   * this call started it (its starter stops it).
   */
  static synchronized Map.Entry<SidecarProcess, Boolean> ensure(Conf conf, String appIdentity, String executorId) {
    SidecarProcess s = RUNNING.get(executorId);
    if (s != null) return Map.entry(s, false);
    s = start(conf, appIdentity, executorId);
    RUNNING.put(executorId, s);
    return Map.entry(s, true);
  }

  /**
   * Writes the conf file and starts the sidecar in the spool dir of {@code appIdentity} (the application
   * attempt's, {@link Conf#appIdentityOrNull()}); throws with the command line if it cannot start.
   */
  static SidecarProcess start(Conf conf, String appIdentity, String executorId) {
    Path spool = Conf.executorSpoolDir(conf.spoolRoot(), appIdentity, executorId);
    List<String> argv = argv(conf, spool, executorId);
    try {
      PrivateDirs.ensure(conf.spoolRoot(), spool);
      Spool.writeJsonAtomically(spool.resolve(CONF_FILE), conf.sidecarConf());   // 0600: it holds secrets
      // The driver's Python was checked a moment ago (StateBackendPlugin.validateInPython).
      if (!"driver".equals(executorId)) checkPython(conf, spool, executorId);
      SidecarProcess s = new SidecarProcess(argv, executorId, spool, conf.drainTimeoutMs());
      synchronized (s) {
        s.launch();
      }
      Runtime.getRuntime().addShutdownHook(s.shutdownHook);
      return s;
    } catch (IOException e) {
      throw new IllegalStateException("spark-statebackend: executor " + executorId + " could not start its "
          + "sidecar " + argv + " (check spark.statebackend.sidecar.python): " + e, e);
    }
  }

  static final long CHECK_TIMEOUT_S = 120;

  /**
   * Before an executor's sidecar starts: runs {@code <its Python> -m spark_statebackend.spark.validate
   * --conf <conf file> --offline} (the keys, the sidecar's imports and the extras of the URLs; contacts
   * nothing), its output appended to the sidecar log. A Python that cannot run the sidecar (missing, or
   * without the package) would otherwise exit at once, be restarted {@value #MAX_RESTARTS} times and
   * leave commits blocked until commitTimeout: this throws instead, so the executor fails at start with
   * the Python, where it came from, the key to set and the log, and the spool loses the conf file (it
   * holds secrets).
   */
  static void checkPython(Conf conf, Path spool, String executorId) {
    String[] python = conf.sidecarPython(System.getenv(), false);
    List<String> argv = List.of(python[0], "-m", StateBackendPlugin.VALIDATE_MODULE, "--conf",
        spool.resolve(CONF_FILE).toString(), "--offline");
    Path log = spool.resolve(LOG_FILE);
    String failure;
    try {
      long from = Files.exists(log, java.nio.file.LinkOption.NOFOLLOW_LINKS) ? Files.size(log) : 0;
      int code = StateBackendPlugin.runPython(argv, log, true, CHECK_TIMEOUT_S);
      if (code == 0) return;
      String out = new String(Files.readAllBytes(log), java.nio.charset.StandardCharsets.UTF_8);
      out = out.substring((int) Math.min(from, out.length())).trim();
      failure = code < 0 ? "did not finish within " + CHECK_TIMEOUT_S + " s"
          : "exited with code " + code + (out.isEmpty() ? "" : ": " + StateBackendPlugin.errorFirst(out));
    } catch (IOException e) {
      failure = "cannot be started: " + e.getMessage();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      failure = "check interrupted";
    }
    SpoolCleaner.atStop(spool);
    throw new IllegalStateException("spark-statebackend: executor " + executorId + " cannot run its sidecar: "
        + "Python '" + python[0] + "' (from " + python[1] + ") " + failure + ". Every executor needs a "
        + "Python with the spark-statebackend package and the extras of its URLs: install it there, or set "
        + Conf.SIDECAR_PYTHON + " (else spark.pyspark.python, then PYSPARK_PYTHON) to such a Python on the "
        + "executors' hosts. Sidecar log: " + log);
  }

  /** Starts a child (the caller holds the lock) and watches it for an unintended exit. */
  private void launch() throws IOException {
    Path log = spoolDir.resolve(LOG_FILE);
    if (!Files.exists(log, java.nio.file.LinkOption.NOFOLLOW_LINKS)) Files.createFile(log, PrivateDirs.FILE_0600);
    Process p = new ProcessBuilder(argv)
        .redirectErrorStream(true)
        .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile()))
        .start();
    process = p;
    LOG.info("spark-statebackend: executor {} started sidecar pid={} (jvm pid={}): {}; log {}", executorId,
        p.pid(), ProcessHandle.current().pid(), argv, spoolDir.resolve(LOG_FILE));
    p.onExit().thenAccept(this::exited);
  }

  /** A child exited: unless we stopped it, start another one (bounded, see the class doc). */
  private synchronized void exited(Process p) {
    if (stopped || p != process) return;
    long now = System.currentTimeMillis();
    while (!restartTimes.isEmpty() && now - restartTimes.peekFirst() > RESTART_WINDOW_MS) restartTimes.pollFirst();
    if (restartTimes.size() >= MAX_RESTARTS) {
      LOG.error("spark-statebackend: sidecar pid={} of executor {} exited with code {}, its {}th death within {} "
          + "min; NOT restarting it: this executor's state is no longer backed up (see {}); commits of its "
          + "stores block after {} and fail after {}, restores fall back to Spark's own files", p.pid(),
          executorId, p.exitValue(), MAX_RESTARTS + 1, RESTART_WINDOW_MS / 60_000, spoolDir.resolve(LOG_FILE),
          Conf.MAX_COMMIT_DELAY, Conf.COMMIT_TIMEOUT);
      markBackupsStopped(now);
      return;
    }
    restartTimes.addLast(now);
    LOG.error("spark-statebackend: sidecar pid={} of executor {} exited unexpectedly with code {}; restarting it "
        + "(restart {} of at most {} per {} min; see {})", p.pid(), executorId, p.exitValue(),
        restartTimes.size(), MAX_RESTARTS, RESTART_WINDOW_MS / 60_000, spoolDir.resolve(LOG_FILE));
    try {
      launch();
    } catch (IOException e) {
      LOG.error("spark-statebackend: executor {} could not restart its sidecar {}: {}", executorId, argv, e);
    }
  }

  /**
   * With no sidecar, nothing uploads: tell {@link CommitGate} that the backup lags from now on (it reads
   * {@code status.json}, which only a sidecar writes), so commits block after maxCommitDelay and fail after
   * commitTimeout instead of staging snapshots nobody uploads while the query runs on without backups.
   */
  private void markBackupsStopped(long sinceMs) {
    SpoolDocuments.SidecarGivenUpStatus status = new SpoolDocuments.SidecarGivenUpStatus(sinceMs,
        "stopped after " + (MAX_RESTARTS + 1) + " deaths; not restarted");
    try {
      Spool.writeJsonAtomically(spoolDir.resolve(CommitGate.STATUS_FILE), status.toJson());
    } catch (IOException e) {
      LOG.error("spark-statebackend: could not write {}: {}", spoolDir.resolve(CommitGate.STATUS_FILE), e.toString());
    }
  }

  Path spoolDir() {
    return spoolDir;
  }

  synchronized long pid() {
    return process.pid();
  }

  /** Plugin shutdown: stop the process and drop the JVM-exit hook. */
  void close() {
    close(drainTimeoutMs);
  }

  /** Plugin shutdown with {@code drainMs} left of drainTimeout for the sidecar's drain (see {@link #stop}). */
  void close(long drainMs) {
    synchronized (SidecarProcess.class) {
      RUNNING.remove(executorId, this);
    }
    stop("plugin shutdown", drainMs);
    try {
      Runtime.getRuntime().removeShutdownHook(shutdownHook);
    } catch (IllegalStateException e) {
      // the JVM is already exiting; the hook runs stop() again, which is a no-op by then
    }
  }

  /**
   * SIGTERM, then up to {@code spark.statebackend.drainTimeout} (plus 5 s) for the sidecar to finish the
   * uploads and checkpoints of batches already done (it drains on SIGTERM, see sidecar.py), then SIGKILL.
   */
  synchronized void stop(String why) {
    stop(why, drainTimeoutMs);
  }

  private synchronized void stop(String why, long drainMs) {
    stopped = true;
    if (!process.isAlive()) {
      logForwarder.close();
      return;
    }
    long waitMs = drainMs + 5_000;
    process.destroy();
    try {
      if (!process.waitFor(waitMs, TimeUnit.MILLISECONDS)) {
        LOG.warn("spark-statebackend: sidecar pid={} did not exit within {} ms of SIGTERM; killing it",
            process.pid(), waitMs);
        process.destroyForcibly();
        process.waitFor(5, TimeUnit.SECONDS);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      process.destroyForcibly();
    }
    logForwarder.close();
    LOG.info("spark-statebackend: sidecar pid={} of {} stopped ({}), alive={}", process.pid(), spoolDir, why,
        process.isAlive());
  }
}
