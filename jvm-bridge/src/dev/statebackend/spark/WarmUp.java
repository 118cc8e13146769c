package dev.statebackend.spark;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;

import org.apache.spark.sql.execution.streaming.state.RocksDBCheckpointMetadata$;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads one tiny RocksDB checkpoint metadata file on a background thread when an executor starts.
 *
 * <p>Why it exists: the first store a fresh JVM loads spends about a second in json4s' Scala
 * reflection for {@code RocksDBCheckpointMetadata} (measured with JFR: {@code readFromFile ->
 * Extraction.extract}), on the task thread, while later loads take tens of milliseconds. After a
 * restart that second sits on the critical path of the first micro-batch of every executor. Doing it
 * once at executor start, while the driver is still planning the query, takes it off that path. Best
 * effort: any failure is logged at DEBUG and changes nothing.
 *
 * <p>The file lives a second in {@code java.io.tmpdir}; a JVM killed in that second leaves it behind,
 * so each warm-up first removes such files older than {@link #STALE_MS} (regular files only, never
 * through a symlink).
 */
final class WarmUp {
  private static final Logger LOG = LoggerFactory.getLogger(WarmUp.class);

  /** The shape Spark writes: a version line, then the JSON document. */
  private static final String METADATA = "v1\n{\"sstFiles\":[{\"localFileName\":\"000001.sst\","
      + "\"dfsSstFileName\":\"000001-00000000-0000-0000-0000-000000000000.sst\",\"sizeBytes\":1}],"
      + "\"numKeys\":1,\"numInternalKeys\":0,\"columnFamilyMapping\":{},\"columnFamilyTypeMap\":{},"
      + "\"maxColumnFamilyId\":0}";

  private static final String PREFIX = "ssb-warmup-";
  private static final String SUFFIX = ".metadata";
  static final long STALE_MS = 10 * 60 * 1000L;

  private WarmUp() {}

  /** Starts the daemon thread {@code ssb-warmup-<executor id>}; returns at once. */
  static Thread startInBackground(String executorId) {
    Thread t = new Thread(WarmUp::run, "ssb-warmup-" + executorId);
    t.setDaemon(true);
    t.start();
    return t;
  }

  static void run() {
    long t0 = System.nanoTime();
    File f = null;
    try {
      sweepStale(Paths.get(System.getProperty("java.io.tmpdir")), System.currentTimeMillis() - STALE_MS);
      f = File.createTempFile(PREFIX, SUFFIX);
      Files.write(f.toPath(), METADATA.getBytes(StandardCharsets.UTF_8));
      RocksDBCheckpointMetadata$.MODULE$.readFromFile(f);
      LOG.info("spark-statebackend: state store loader warmed up in {} ms", (System.nanoTime() - t0) / 1_000_000);
    } catch (Throwable e) {   // LinkageError on another Spark too: warming up is optional
      LOG.debug("spark-statebackend: warm-up skipped: {}", e.toString());
    } finally {
      if (f != null && !f.delete()) f.deleteOnExit();
    }
  }

  /** Deletes the warm-up files in {@code dir} last modified before {@code before} (epoch ms); best effort. */
  static void sweepStale(Path dir, long before) {
    try (DirectoryStream<Path> files = Files.newDirectoryStream(dir, PREFIX + "*" + SUFFIX)) {
      for (Path p : files) {
        try {
          if (Files.isRegularFile(p, LinkOption.NOFOLLOW_LINKS)
              && Files.getLastModifiedTime(p, LinkOption.NOFOLLOW_LINKS).toMillis() < before) {
            Files.deleteIfExists(p);   // a name, never a link's target
          }
        } catch (java.io.IOException | SecurityException e) {
          LOG.debug("spark-statebackend: cannot remove stale warm-up file {}: {}", p, e.toString());
        }
      }
    } catch (java.io.IOException | SecurityException e) {
      LOG.debug("spark-statebackend: cannot list {} for stale warm-up files: {}", dir, e.toString());
    }
  }
}
