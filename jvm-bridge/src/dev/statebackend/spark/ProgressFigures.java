package dev.statebackend.spark;

import java.io.IOException;
import java.lang.reflect.Field;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.streaming.StreamingQueryProgress;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The backend's figures for a query in its {@link StreamingQueryProgress}: {@code
 * observedMetrics["statebackend"]}, so {@code query.lastProgress}, every listener's {@code onQueryProgress}
 * and the progress JSON show them beside Spark's own (docs/operations.md, "In the query's progress").
 *
 * <p>Why this way: Spark 4.3 has no public way for a plugin to add to a query's progress (its
 * observedMetrics come only from {@code Dataset.observe} in the user's query, a source's or sink's
 * metrics only from that connector). {@link ProgressSpoolListener}, on Spark's listener bus, gets each
 * progress before the listeners registered after it and {@link #addTo} replaces the progress's
 * observedMetrics map by a copy holding one more entry. It replaces the map rather than adding to it:
 * the query's thread logs the same progress (iterating that map) right after posting the event, and a
 * put into a HashMap another thread iterates could fail the query with a ConcurrentModificationException.
 * The replacement is one reference write (reflection on the final field, a volatile write), so a reader
 * sees the old map or the new one, whole. A Spark whose progress has no such field gets nothing added
 * (one WARN); the figures stay in the metrics and {@code spark_statebackend.status()}.
 *
 * <p>The figures are those of {@code spark_statebackend.status()} (spark/query_status.py), read from the
 * same file, the driver sidecar's {@code metrics.json}, when Spark delivers the progress and before its
 * batch is handed to the committer: the batch of the progress itself is never durable yet. -1: not
 * known yet (this application has not checkpointed the query).
 */
public final class ProgressFigures {
  private static final Logger LOG = LoggerFactory.getLogger(ProgressFigures.class);
  /** The key of the figures in observedMetrics. */
  public static final String NAME = "statebackend";
  static final StructType SCHEMA = new StructType()
      .add("lastDurableBatch", DataTypes.LongType, false)
      .add("checkpointLagSeconds", DataTypes.DoubleType, false)
      .add("uploadLagSeconds", DataTypes.DoubleType, false)
      .add("checkpointBytes", DataTypes.LongType, false)
      .add("predictedRestoreSeconds", DataTypes.DoubleType, false)
      .add("checkpointsWritten", DataTypes.LongType, false);

  private static final Field OBSERVED = observedMetricsField();
  private static final AtomicBoolean WARNED = new AtomicBoolean();

  private ProgressFigures() {}

  private static Field observedMetricsField() {
    try {
      Field f = StreamingQueryProgress.class.getDeclaredField("observedMetrics");
      f.setAccessible(true);
      return f;
    } catch (ReflectiveOperationException | RuntimeException e) {
      LOG.warn("spark-statebackend: this Spark's StreamingQueryProgress cannot carry the backend's figures "
          + "({}); they stay in the metrics and status()", e.toString());
      return null;
    }
  }

  /**
   * The figures of query {@code queryId} in the samples the sidecar of {@code spoolDir} last published
   * ({@code metrics.json}); every figure -1 (checkpointsWritten 0) when it has published none of them.
   * Reads one small local file and never waits.
   */
  public static Row read(Path spoolDir, String queryId) {
    JsonNode samples = null;
    try {
      JsonNode root = Spool.MAPPER.readTree(Files.readAllBytes(spoolDir.resolve(SidecarMetrics.FILE)));
      if (root != null) samples = root.path("samples");
    } catch (NoSuchFileException e) {
      // before the sidecar's first publication: nothing known yet
    } catch (IOException e) {
      LOG.debug("spark-statebackend: reading {} failed: {}", spoolDir.resolve(SidecarMetrics.FILE), e.toString());
    }
    return new GenericRowWithSchema(new Object[] {
        (long) value(samples, "ssb_query_last_durable_batch", queryId, -1),
        value(samples, "ssb_query_checkpoint_lag_seconds", queryId, -1),
        value(samples, "ssb_upload_lag_seconds", null, -1),
        (long) value(samples, "ssb_query_checkpoint_bytes", queryId, -1),
        value(samples, "ssb_query_predicted_restore_seconds", queryId, -1),
        (long) value(samples, "ssb_checkpoints_written_total", queryId, 0),
    }, SCHEMA);
  }

  /**
   * The value of sample {@code name} of {@code queryId} (null: the sidecar's own sample, no query), as
   * query_status() in spark/query_status.py picks it; {@code otherwise} when there is none.
   */
  private static double value(JsonNode samples, String name, String queryId, double otherwise) {
    if (samples == null || !samples.isArray()) return otherwise;
    for (JsonNode s : samples) {
      if (!name.equals(s.path("name").asText()) || !s.path("value").isNumber()) continue;
      // A query's samples carry its id as query_id; their query label is its name when it has one.
      String id = s.hasNonNull("query_id") ? s.path("query_id").asText() : s.path("labels").path("query").asText(null);
      if (queryId == null ? id == null : queryId.equals(id)) return s.path("value").asDouble();
    }
    return otherwise;
  }

  /**
   * Puts {@code figures} into {@code progress}'s observedMetrics under {@link #NAME} (a new map replaces
   * the old one: class doc); false, changing nothing, when this Spark's progress cannot take them or the
   * query observes a metric of that name itself (the user's is kept).
   */
  public static boolean addTo(StreamingQueryProgress progress, Row figures) {
    if (OBSERVED == null) return false;
    Map<String, Row> old = progress.observedMetrics();
    if (old != null && old.containsKey(NAME)) {
      if (WARNED.compareAndSet(false, true)) {
        LOG.warn("spark-statebackend: query {} observes a metric named '{}' itself: its progress keeps that one "
            + "and not the backend's figures", progress.id(), NAME);
      }
      return false;
    }
    Map<String, Row> copy = new HashMap<>(old == null ? Map.of() : old);
    copy.put(NAME, figures);
    try {
      OBSERVED.set(progress, Collections.unmodifiableMap(copy));
      return true;
    } catch (IllegalAccessException | RuntimeException e) {
      if (WARNED.compareAndSet(false, true)) {
        LOG.warn("spark-statebackend: the backend's figures cannot be added to query progress: {}", e.toString());
      }
      return false;
    }
  }
}
