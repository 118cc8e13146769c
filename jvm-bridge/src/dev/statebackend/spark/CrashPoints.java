package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Test-only crash points of the JVM shim: {@code spark.statebackend.test.crashAt} (unset in production)
 * halts this JVM at a named step, as kill -9 would.
 *
 * <p>Why it exists: the crash tests prove that a crash at every step of the commit lifecycle loses and
 * leaks nothing. The grammar and the once-per-application rule are those of {@code
 * spark_statebackend/common/crashpoints.py}: {@code <point>[@<n>][/<process>]}, comma-separated; the JVM
 * handles only {@link #AFTER_STAGING} ([C2]), in processes named {@code jvm-<executor id>} (filter
 * {@code jvm} or {@code jvm-<id>}, or none). Before halting, the JVM creates {@code <spool root>/<app
 * id>/test-crash-fired/ <point>} exclusively, so a relaunched executor of the same application does not
 * crash again. {@code Runtime.halt} runs no shutdown hook: the executor's sidecar is not told, exactly
 * as after kill -9. Hooks no Spark member.
 */
final class CrashPoints {
  private static final Logger LOG = LoggerFactory.getLogger(CrashPoints.class);
  static final String KEY = Conf.PREFIX + "test.crashAt";
  static final String AFTER_STAGING = "after_staging";
  static final String FIRED_DIR = "test-crash-fired";
  private static final ConcurrentHashMap<String, AtomicLong> HITS = new ConcurrentHashMap<>();

  private CrashPoints() {}

  /** Reaching {@code point} in the store context {@code ctx}: halts the JVM if an armed entry is due. */
  static void reached(String point, ExecutorEnv ctx) {
    SparkEnv env = SparkEnv.get();
    if (env == null) return;
    SparkConf conf = env.conf();
    String spec = conf.get(KEY, "").trim();
    if (spec.isEmpty()) return; // production: one map lookup
    long hit = HITS.computeIfAbsent(point, k -> new AtomicLong()).incrementAndGet();
    if (!due(spec, point, "jvm-" + ctx.executorId, hit)) return;
    Path fired = Conf.of(conf).spoolRoot().resolve(Conf.sanitizeId(ctx.appId)).resolve(FIRED_DIR);
    try {
      PrivateDirs.ensure(Conf.of(conf).spoolRoot(), fired);
      Files.createFile(fired.resolve(point));
    } catch (FileAlreadyExistsException e) {
      return; // another JVM of this application crashed here already
    } catch (IOException e) {
      throw new IllegalStateException("spark-statebackend: test crash point " + point + ": cannot record it in "
          + fired + ": " + e, e);
    }
    String msg = "spark-statebackend TEST CRASH POINT " + point + " (hit " + hit + ") in jvm-" + ctx.executorId
        + " pid " + ProcessHandle.current().pid() + ": halt(137)";
    LOG.error(msg);
    System.err.println(msg);
    System.err.flush();
    Runtime.getRuntime().halt(137);
  }

  /** Whether an entry of {@code spec} fires at this {@code hit} of {@code point} in {@code process}. */
  static boolean due(String spec, String point, String process, long hit) {
    for (String raw : spec.split(",")) {
      String entry = raw.trim();
      if (entry.isEmpty()) continue;
      String proc = null;
      int slash = entry.indexOf('/');
      if (slash >= 0) {
        proc = entry.substring(slash + 1).trim();
        entry = entry.substring(0, slash);
      }
      long nth = 1;
      int at = entry.indexOf('@');
      if (at >= 0) {
        try {
          nth = Long.parseLong(entry.substring(at + 1).trim());
        } catch (NumberFormatException e) {
          throw new IllegalArgumentException(KEY + ": bad hit count in '" + raw.trim() + "'", e);
        }
        entry = entry.substring(0, at);
      }
      if (!entry.trim().toLowerCase(Locale.ROOT).equals(point) || nth != hit) continue;
      boolean anyJvm = proc == null || proc.isEmpty() || (proc.equals("jvm") && process.startsWith("jvm-"));
      if (anyJvm || proc.equals(process)) return true;
    }
    return false;
  }
}
