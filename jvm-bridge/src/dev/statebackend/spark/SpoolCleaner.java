package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.Stream;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Keeps the spool from growing: an executor's protocol files go when its sidecar stops, and the spool
 * dirs of applications long gone go when a later application starts on the host.
 *
 * <p>Why it exists: every application (each attempt of one, {@link Conf#appIdentityOrNull()}) leaves
 * {@code <spool root>/<app identity>/<executor id>/} behind, and its sidecar-conf.json holds secrets.
 * At a clean stop (plugin shutdown, after the sidecar drained and exited) we delete the protocol files
 * and keep only {@code sidecar.log}; an application that died (kill -9) leaves everything, so at each
 * start we delete whole application dirs whose newest file is older than {@link #RETENTION_MS} and
 * whose sidecars are all gone. Never follows a symlink.
 */
final class SpoolCleaner {
  private static final Logger LOG = LoggerFactory.getLogger(SpoolCleaner.class);
  static final long RETENTION_MS = 7L * 24 * 3600 * 1000;
  /** What the shim and sidecar write into an executor's spool dir, except the log (spool.py). */
  static final List<String> PROTOCOL = List.of("events", "requests", "responses", "progress", "bad",
      "sidecar-conf.json", "status.json", "metrics.json", "sidecar.json", "commit-gate.json", "driver-staging");

  private SpoolCleaner() {}

  /** After the executor's sidecar stopped: remove its protocol files, keep its log. */
  static void atStop(Path executorSpool) {
    for (String name : PROTOCOL) HardLinks.deleteTree(executorSpool.resolve(name));
    LOG.info("spark-statebackend: spool {} cleaned (sidecar.log kept)", executorSpool);
  }

  /**
   * {@link #pruneOld} on a daemon thread, so a start never waits for it: the driver and every executor
   * run it at start, each for its own host (an executor killed before its shutdown hook left its spool,
   * the sidecar's conf with its secrets included, on a host the driver never sees).
   */
  static void pruneOldInBackground(Path root, String currentApp) {
    Thread pruner = new Thread(() -> pruneOld(root, currentApp), "statebackend-spool-prune");
    pruner.setDaemon(true);
    pruner.start();
  }

  /**
   * Remove application spool dirs under {@code root} older than the retention with no live sidecar, except
   * {@code currentApp}'s (an application identity). Another attempt of the same application is pruned by
   * the same rule: a zombie attempt still running keeps its dir through its live sidecars.
   */
  static void pruneOld(Path root, String currentApp) {
    if (!Files.isDirectory(root, LinkOption.NOFOLLOW_LINKS)) return;
    long now = System.currentTimeMillis();
    try (DirectoryStream<Path> apps = Files.newDirectoryStream(root)) {
      for (Path app : apps) {
        if (!Files.isDirectory(app, LinkOption.NOFOLLOW_LINKS)) continue;
        if (app.getFileName().toString().equals(Conf.sanitizeId(currentApp))) continue;
        if (now - newestMtime(app) < RETENTION_MS || anySidecarAlive(app)) continue;
        HardLinks.deleteTree(app);
        LOG.info("spark-statebackend: removed the spool of a finished application: {}", app);
      }
    } catch (IOException e) {
      LOG.warn("spark-statebackend: could not prune old spool dirs under {}: {}", root, e.toString());
    }
  }

  private static long newestMtime(Path dir) throws IOException {
    try (Stream<Path> s = Files.walk(dir)) {
      return s.mapToLong(p -> {
        try {
          return Files.getLastModifiedTime(p, LinkOption.NOFOLLOW_LINKS).toMillis();
        } catch (IOException e) {
          return Long.MAX_VALUE;   // unreadable: treat as new, keep it
        }
      }).max().orElse(0L);
    }
  }

  private static boolean anySidecarAlive(Path app) throws IOException {
    try (DirectoryStream<Path> execs = Files.newDirectoryStream(app)) {
      for (Path exec : execs) {
        if (Files.isDirectory(exec, LinkOption.NOFOLLOW_LINKS) && new Spool(exec).sidecarAlive()) return true;
      }
    }
    return false;
  }
}
