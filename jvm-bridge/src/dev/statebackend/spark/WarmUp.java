package dev.statebackend.spark;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;

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
 */
final class WarmUp {
  private static final Logger LOG = LoggerFactory.getLogger(WarmUp.class);

  /** The shape Spark writes: a version line, then the JSON document. */
  private static final String METADATA = "v1\n{\"sstFiles\":[{\"localFileName\":\"000001.sst\","
      + "\"dfsSstFileName\":\"000001-00000000-0000-0000-0000-000000000000.sst\",\"sizeBytes\":1}],"
      + "\"numKeys\":1,\"numInternalKeys\":0,\"columnFamilyMapping\":{},\"columnFamilyTypeMap\":{},"
      + "\"maxColumnFamilyId\":0}";

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
      f = File.createTempFile("ssb-warmup-", ".metadata");
      Files.write(f.toPath(), METADATA.getBytes(StandardCharsets.UTF_8));
      RocksDBCheckpointMetadata$.MODULE$.readFromFile(f);
      LOG.info("spark-statebackend: state store loader warmed up in {} ms", (System.nanoTime() - t0) / 1_000_000);
    } catch (Throwable e) {   // LinkageError on another Spark too: warming up is optional
      LOG.debug("spark-statebackend: warm-up skipped: {}", e.toString());
    } finally {
      if (f != null && !f.delete()) f.deleteOnExit();
    }
  }
}
