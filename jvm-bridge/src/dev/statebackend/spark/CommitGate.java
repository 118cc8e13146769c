package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * [C1] of the commit path ({@code spark_statebackend/runtime/__init__.py}): Samza's max.commit.delay on
 * the task thread: before a store commits, wait while this executor's sidecar
 * has a snapshot of the store's query not yet uploaded (in flight, or failed and waiting for a retry) that
 * was staged more than {@code spark.statebackend.maxCommitDelay} ago; fail the commit after
 * {@code spark.statebackend.commitTimeout}. A sidecar the plugin gave up restarting counts as lagging for
 * every query from that moment (the plugin writes the status).
 *
 * <p>Why it exists: uploads are asynchronous, so a slow blob store would otherwise let staged snapshots
 * (hard links pinning old SSTs on disk) and the checkpoint lag grow without bound. The sidecar writes
 * {@code status.json} in the spool dir around every upload ({@code runtime/upload_lag.py}):
 * {"oldest_upload_staged_at_ms": long|null, "oldest_by_query": {query id: long}}. The gate reads the
 * committing store's query in {@code oldest_by_query}, so one query's failing uploads never hold
 * another's commits; a status without it (the plugin's, or an older sidecar's), or a store whose query
 * is unknown, goes by the overall figure. While commits are blocked it keeps {@code commit-gate.json}
 * there, listing every waiting store (removed when the last one lets go), so operators and tests can see
 * a blocked commit. Hooks no Spark member: it runs in {@link StoreHooks} before the version file that
 * commits a store version is published.
 */
final class CommitGate {
  private static final Logger LOG = LoggerFactory.getLogger(CommitGate.class);
  static final String STATUS_FILE = "status.json";
  static final String GATE_FILE = "commit-gate.json";
  /** The driver committer's per-query checkpoint lag (spark_statebackend/runtime/checkpoint_lag.py). */
  static final String CHECKPOINT_STATUS_FILE = "checkpoint-status.json";
  private static final long POLL_MS = 20;
  /** Spool dir -> the commits blocked there, in the order they blocked; guarded by itself. */
  private static final Map<Path, List<Map<String, Object>>> WAITING = new HashMap<>();

  private CommitGate() {}

  /**
   * Staging time of the oldest snapshot of query {@code queryId} not yet uploaded (of any query if the
   * status has no per-query figures or {@code queryId} is null), or -1 if none (or no readable status).
   */
  static long oldestUploadStagedAtMs(Path spoolDir, String queryId) {
    JsonNode n = readStatus(spoolDir, STATUS_FILE);
    if (n == null) return -1;
    JsonNode byQuery = n.get("oldest_by_query");
    JsonNode v = queryId != null && byQuery != null && byQuery.isObject()
        ? byQuery.get(queryId) : n.get("oldest_upload_staged_at_ms");
    return v != null && v.canConvertToLong() ? v.asLong() : -1;
  }

  /** The JSON of {@code spoolDir/file}, or null if it is missing or being replaced (the next poll reads it). */
  private static JsonNode readStatus(Path spoolDir, String file) {
    try {
      return Spool.MAPPER.readTree(Files.readAllBytes(spoolDir.resolve(file)));
    } catch (NoSuchFileException e) {
      return null;
    } catch (IOException e) {
      return null;
    }
  }

  /**
   * Blocks the commit of {@code version} of store {@code instance} of query {@code queryId} (null:
   * unknown) while this executor's sidecar (spool dir {@code spoolDir}) lags on that query beyond
   * {@code maxDelayMs}; throws once that has lasted {@code timeoutMs}.
   */
  static void await(Path spoolDir, String queryId, String instance, long version, long maxDelayMs,
      long timeoutMs) {
    Map<String, Object> waiter = new LinkedHashMap<>();
    waiter.put("query_id", queryId);
    waiter.put("store", instance);
    waiter.put("version", version);
    hold(spoolDir, waiter, "query " + queryId + " store " + instance + " version " + version,
        "the sidecar's oldest upload was staged", "the sidecar's upload has lagged",
        () -> oldestUploadStagedAtMs(spoolDir, queryId), () -> sidecarGivenUp(spoolDir), maxDelayMs, timeoutMs);
  }

  /**
   * Why nothing backs up the executor of {@code spoolDir} any more, naming its sidecar log, if the plugin
   * gave up restarting its sidecar ({@code status.json}'s "sidecar", which only the plugin writes); else null.
   */
  static String sidecarGivenUp(Path spoolDir) {
    JsonNode n = readStatus(spoolDir, STATUS_FILE);
    JsonNode v = n == null ? null : n.get("sidecar");
    if (v == null || !v.isTextual()) return null;
    return "the plugin gave up restarting this executor's sidecar (" + v.asText() + "), so its state is no "
        + "longer backed up (see " + spoolDir.resolve(SidecarProcess.LOG_FILE) + "); once the sidecar's "
        + "failure is fixed, a restart of the query resumes from its latest durable checkpoint";
  }

  /**
   * The driver's gate on Spark's commit log ([C5] of {@code spark_statebackend/runtime/__init__.py}):
   * blocks Spark's {@code commits/<batch>} of query {@code queryId} while the driver's committer has
   * failed to checkpoint the query for longer than {@code maxDelayMs} ({@code checkpoint-status.json} in
   * the driver's spool dir, {@code runtime/checkpoint_lag.py}: a symlink in the location, an unusable
   * marker, a checkpoint log refusing writes, a batch given up on); throws, naming the committer's last
   * cause, once that has lasted {@code timeoutMs}. So a query whose checkpoints keep failing stops at a
   * batch boundary instead of running on with no checkpoint (upload lag is the store gate's, above).
   */
  static void awaitCheckpoints(Path driverSpoolDir, String queryId, long batch, long maxDelayMs,
      long timeoutMs) {
    if (queryId == null) return;
    Map<String, Object> waiter = new LinkedHashMap<>();
    waiter.put("query_id", queryId);
    waiter.put("batch", batch);
    hold(driverSpoolDir, waiter, "query " + queryId + " batch " + batch,
        "its checkpoints began to fail", "its checkpoints have failed",
        () -> checkpointLagSinceMs(driverSpoolDir, queryId), () -> checkpointCause(driverSpoolDir, queryId),
        maxDelayMs, timeoutMs);
  }

  /** When query {@code queryId}'s checkpoint lag began, or -1 if it does not lag (or no readable status). */
  static long checkpointLagSinceMs(Path driverSpoolDir, String queryId) {
    JsonNode n = readStatus(driverSpoolDir, CHECKPOINT_STATUS_FILE);
    JsonNode v = n == null ? null : n.path("oldest_by_query").get(queryId);
    return v != null && v.canConvertToLong() ? v.asLong() : -1;
  }

  private static String checkpointCause(Path driverSpoolDir, String queryId) {
    JsonNode n = readStatus(driverSpoolDir, CHECKPOINT_STATUS_FILE);
    JsonNode v = n == null ? null : n.path("cause_by_query").get(queryId);
    return v != null && v.isTextual() ? v.asText() : null;
  }

  /**
   * Blocks while {@code oldest} (epoch ms, -1: none) is older than {@code maxDelayMs}; throws once that
   * has lasted {@code timeoutMs}, with {@code cause} if it names one. {@code waiter} is listed in the
   * gate file meanwhile.
   */
  private static void hold(Path spoolDir, Map<String, Object> waiter, String subject, String lagging,
      String lagged, java.util.function.LongSupplier oldest, java.util.function.Supplier<String> cause,
      long maxDelayMs, long timeoutMs) {
    long since = oldest.getAsLong();
    if (since < 0 || System.currentTimeMillis() - since <= maxDelayMs) return;
    long start = System.currentTimeMillis();
    LOG.warn("spark-statebackend: {}: {} {} ms ago (maxCommitDelay {} ms); blocking this commit until it "
        + "finishes{}", subject, lagging, start - since, maxDelayMs, causeText(cause.get()));
    waiter.put("blocked_since_ms", start);
    enter(spoolDir, waiter);
    try {
      while (true) {
        since = oldest.getAsLong();
        long now = System.currentTimeMillis();
        if (since < 0 || now - since <= maxDelayMs) break;
        if (now - start > timeoutMs) {
          throw new IllegalStateException("spark-statebackend: " + subject + ": " + lagged + " beyond "
              + Conf.MAX_COMMIT_DELAY + " for more than " + Conf.COMMIT_TIMEOUT + " (" + timeoutMs
              + " ms); failing the commit" + causeText(cause.get()));
        }
        Thread.sleep(POLL_MS);
      }
      LOG.info("spark-statebackend: {}: commit released after {} ms", subject, System.currentTimeMillis() - start);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("spark-statebackend: interrupted while waiting for the sidecar", e);
    } finally {
      leave(spoolDir, waiter);
    }
  }

  private static String causeText(String cause) {
    return cause == null || cause.isEmpty() ? "" : "; last cause: " + cause;
  }

  /** One more blocked commit in {@code spoolDir}: the gate file lists it. */
  private static void enter(Path spoolDir, Map<String, Object> waiter) {
    synchronized (WAITING) {
      WAITING.computeIfAbsent(spoolDir, d -> new ArrayList<>()).add(waiter);
      try {
        writeGateFile(spoolDir);
      } catch (IOException e) {
        leave(spoolDir, waiter);
        throw new IllegalStateException("spark-statebackend: cannot write " + spoolDir.resolve(GATE_FILE)
            + ": " + e, e);
      }
    }
  }

  /** A blocked commit let go: the gate file lists the others still waiting, and goes with the last. */
  private static void leave(Path spoolDir, Map<String, Object> waiter) {
    synchronized (WAITING) {
      List<Map<String, Object>> waiting = WAITING.get(spoolDir);
      if (waiting != null) waiting.remove(waiter);
      try {
        if (waiting == null || waiting.isEmpty()) {
          WAITING.remove(spoolDir);
          Files.deleteIfExists(spoolDir.resolve(GATE_FILE));
        } else {
          writeGateFile(spoolDir);
        }
      } catch (IOException e) {
        LOG.warn("spark-statebackend: could not update {}: {}", spoolDir.resolve(GATE_FILE), e.toString());
      }
    }
  }

  /** The first blocked commit's fields (as before), and every blocked commit under "waiting". */
  private static void writeGateFile(Path spoolDir) throws IOException {
    List<Map<String, Object>> waiting = WAITING.get(spoolDir);
    Map<String, Object> doc = new LinkedHashMap<>(waiting.get(0));
    doc.put("waiting", new ArrayList<>(waiting));
    Spool.writeJsonAtomically(spoolDir.resolve(GATE_FILE), doc);
  }
}
