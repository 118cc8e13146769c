package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One executor's Python sidecar process: started with the documented argv, stopped on plugin shutdown
 * or JVM exit.
 *
 * <p>Why it exists: uploads and restores run in Python (the blob SDKs), one long-lived process per
 * executor JVM, next to the spool dir it serves. The command line is the contract with
 * {@code spark_statebackend.sidecar}:
 * {@code <sidecar.python> -m spark_statebackend.sidecar --spool-dir <executor spool dir> --executor-id <id>
 * --conf <spool dir>/sidecar-conf.json}; stdout and stderr are appended to {@code <spool dir>/sidecar.log}.
 * A kill -9 of the JVM runs no hook: the sidecar must watch its parent pid itself. Hooks no Spark member.
 */
final class SidecarProcess {
  private static final Logger LOG = LoggerFactory.getLogger(SidecarProcess.class);
  static final String MODULE = "spark_statebackend.sidecar";
  static final String CONF_FILE = "sidecar-conf.json";
  static final String LOG_FILE = "sidecar.log";

  private final Process process;
  private final Path spoolDir;
  private final Thread shutdownHook;

  private SidecarProcess(Process process, Path spoolDir) {
    this.process = process;
    this.spoolDir = spoolDir;
    this.shutdownHook = new Thread(() -> stop("JVM shutdown"), "statebackend-sidecar-stop");
    Runtime.getRuntime().addShutdownHook(shutdownHook);
  }

  static List<String> argv(Conf conf, Path spoolDir, String executorId) {
    List<String> argv = new ArrayList<>();
    argv.add(conf.sidecarPython());
    argv.add("-m");
    argv.add(MODULE);
    argv.add("--spool-dir");
    argv.add(spoolDir.toString());
    argv.add("--executor-id");
    argv.add(executorId);
    argv.add("--conf");
    argv.add(spoolDir.resolve(CONF_FILE).toString());
    return argv;
  }

  /** Writes the conf file and starts the sidecar; throws with the command line if it cannot start. */
  static SidecarProcess start(Conf conf, String appId, String executorId) {
    Path spool = Conf.executorSpoolDir(conf.spoolRoot(), appId, executorId);
    List<String> argv = argv(conf, spool, executorId);
    try {
      Files.createDirectories(spool);
      Spool.writeJsonAtomically(spool.resolve(CONF_FILE), conf.sidecarConf());
      Process p = new ProcessBuilder(argv)
          .redirectErrorStream(true)
          .redirectOutput(ProcessBuilder.Redirect.appendTo(spool.resolve(LOG_FILE).toFile()))
          .start();
      LOG.info("spark-statebackend: executor {} started sidecar pid={} (jvm pid={}): {}; log {}", executorId,
          p.pid(), ProcessHandle.current().pid(), argv, spool.resolve(LOG_FILE));
      return new SidecarProcess(p, spool);
    } catch (IOException e) {
      throw new IllegalStateException("spark-statebackend: executor " + executorId + " could not start its "
          + "sidecar " + argv + " (check spark.statebackend.sidecar.python): " + e, e);
    }
  }

  long pid() {
    return process.pid();
  }

  /** Plugin shutdown: stop the process and drop the JVM-exit hook. */
  void close() {
    stop("plugin shutdown");
    try {
      Runtime.getRuntime().removeShutdownHook(shutdownHook);
    } catch (IllegalStateException e) {
      // the JVM is already exiting; the hook runs stop() again, which is a no-op by then
    }
  }

  /** SIGTERM, up to 10 s to exit, then SIGKILL (bounded: at most 15 s). */
  synchronized void stop(String why) {
    if (!process.isAlive()) return;
    process.destroy();
    try {
      if (!process.waitFor(10, TimeUnit.SECONDS)) {
        LOG.warn("spark-statebackend: sidecar pid={} ignored SIGTERM for 10 s; killing it", process.pid());
        process.destroyForcibly();
        process.waitFor(5, TimeUnit.SECONDS);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      process.destroyForcibly();
    }
    LOG.info("spark-statebackend: sidecar pid={} of {} stopped ({}), alive={}", process.pid(), spoolDir, why,
        process.isAlive());
  }
}
