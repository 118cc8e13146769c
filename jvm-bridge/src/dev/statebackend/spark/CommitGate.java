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
  private static final long POLL_MS = 20;
  /** Spool dir -> the commits blocked there, in the order they blocked; guarded by itself. */
  private static final Map<Path, List<Map<String, Object>>> WAITING = new HashMap<>();

  private CommitGate() {}

  /**
   * Staging time of the oldest snapshot of query {@code queryId} not yet uploaded (of any query if the
   * status has no per-query figures or {@code queryId} is null), or -1 if none (or no readable status).
   */
  static long oldestUploadStagedAtMs(Path spoolDir, String queryId) {
    try {
      JsonNode n = Spool.MAPPER.readTree(Files.readAllBytes(spoolDir.resolve(STATUS_FILE)));
      if (n == null) return -1;
      JsonNode byQuery = n.get("oldest_by_query");
      JsonNode v = queryId != null && byQuery != null && byQuery.isObject()
          ? byQuery.get(queryId) : n.get("oldest_upload_staged_at_ms");
      return v != null && v.canConvertToLong() ? v.asLong() : -1;
    } catch (NoSuchFileException e) {
      return -1;
    } catch (IOException e) {
      return -1;   // being replaced: the next poll reads the new one
    }
  }

  /**
   * Blocks the commit of {@code version} of store {@code instance} of query {@code queryId} (null:
   * unknown) while this executor's sidecar (spool dir {@code spoolDir}) lags on that query beyond
   * {@code maxDelayMs}; throws once that has lasted {@code timeoutMs}.
   */
  static void await(Path spoolDir, String queryId, String instance, long version, long maxDelayMs,
      long timeoutMs) {
    long oldest = oldestUploadStagedAtMs(spoolDir, queryId);
    if (oldest < 0 || System.currentTimeMillis() - oldest <= maxDelayMs) return;
    long start = System.currentTimeMillis();
    LOG.warn("spark-statebackend: query {} store {} version {}: the sidecar's oldest upload was staged {} ms "
        + "ago (maxCommitDelay {} ms); blocking this commit until it finishes", queryId, instance, version,
        start - oldest, maxDelayMs);
    Map<String, Object> waiter = new LinkedHashMap<>();
    waiter.put("query_id", queryId);
    waiter.put("store", instance);
    waiter.put("version", version);
    waiter.put("blocked_since_ms", start);
    enter(spoolDir, waiter);
    try {
      while (true) {
        oldest = oldestUploadStagedAtMs(spoolDir, queryId);
        long now = System.currentTimeMillis();
        if (oldest < 0 || now - oldest <= maxDelayMs) break;
        if (now - start > timeoutMs) {
          throw new IllegalStateException("spark-statebackend: query " + queryId + " store " + instance
              + " version " + version + ": the sidecar's upload has lagged beyond " + Conf.MAX_COMMIT_DELAY
              + " for more than " + Conf.COMMIT_TIMEOUT + " (" + timeoutMs + " ms); failing the commit");
        }
        Thread.sleep(POLL_MS);
      }
      LOG.info("spark-statebackend: query {} store {} version {}: commit released after {} ms", queryId,
          instance, version, System.currentTimeMillis() - start);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("spark-statebackend: interrupted while waiting for the sidecar", e);
    } finally {
      leave(spoolDir, waiter);
    }
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
