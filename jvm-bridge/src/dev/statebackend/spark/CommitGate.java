package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * [C1] of the commit path ({@code spark_statebackend/runtime/__init__.py}): Samza's max.commit.delay on
 * the task thread: before a store commits, wait while this executor's sidecar
 * has a snapshot not yet uploaded (in flight, or failed and waiting for a retry) that was staged more than
 * {@code spark.statebackend.maxCommitDelay} ago; fail the commit after {@code spark.statebackend.commitTimeout}.
 * A sidecar the plugin gave up restarting counts as lagging from that moment (the plugin writes the status).
 *
 * <p>Why it exists: uploads are asynchronous, so a slow blob store would otherwise let staged snapshots
 * (hard links pinning old SSTs on disk) and the checkpoint lag grow without bound. The sidecar writes
 * {@code status.json} ({"oldest_upload_staged_at_ms": long|null}) in the spool dir around every upload;
 * while this gate blocks it writes {@code commit-gate.json} there (removed when it lets go), so operators
 * and tests can see a blocked commit. Hooks no Spark member: it runs in
 * {@link StoreHooks} before the version file that commits a store version is published.
 */
final class CommitGate {
  private static final Logger LOG = LoggerFactory.getLogger(CommitGate.class);
  static final String STATUS_FILE = "status.json";
  static final String GATE_FILE = "commit-gate.json";
  private static final long POLL_MS = 20;

  private CommitGate() {}

  /** Staging time of the oldest snapshot not yet uploaded, or -1 if none (or no readable status). */
  static long oldestUploadStagedAtMs(Path spoolDir) {
    try {
      JsonNode n = Spool.MAPPER.readTree(Files.readAllBytes(spoolDir.resolve(STATUS_FILE)));
      JsonNode v = n == null ? null : n.get("oldest_upload_staged_at_ms");
      return v != null && v.canConvertToLong() ? v.asLong() : -1;
    } catch (NoSuchFileException e) {
      return -1;
    } catch (IOException e) {
      return -1;   // being replaced: the next poll reads the new one
    }
  }

  /**
   * Blocks the commit of {@code version} of store {@code instance} while this executor's sidecar (spool
   * dir {@code spoolDir}) lags beyond {@code maxDelayMs}; throws once that has lasted {@code timeoutMs}.
   */
  static void await(Path spoolDir, String instance, long version, long maxDelayMs, long timeoutMs) {
    long oldest = oldestUploadStagedAtMs(spoolDir);
    if (oldest < 0 || System.currentTimeMillis() - oldest <= maxDelayMs) return;
    long start = System.currentTimeMillis();
    Path gate = spoolDir.resolve(GATE_FILE);
    LOG.warn("spark-statebackend: store {} version {}: the sidecar's oldest upload was staged {} ms ago "
        + "(maxCommitDelay {} ms); blocking this commit until it finishes", instance, version, start - oldest,
        maxDelayMs);
    try {
      Map<String, Object> doc = new LinkedHashMap<>();
      doc.put("store", instance);
      doc.put("version", version);
      doc.put("blocked_since_ms", start);
      Spool.writeJsonAtomically(gate, doc);
      while (true) {
        oldest = oldestUploadStagedAtMs(spoolDir);
        long now = System.currentTimeMillis();
        if (oldest < 0 || now - oldest <= maxDelayMs) break;
        if (now - start > timeoutMs) {
          throw new IllegalStateException("spark-statebackend: store " + instance + " version " + version
              + ": the sidecar's upload has lagged beyond " + Conf.MAX_COMMIT_DELAY + " for more than "
              + Conf.COMMIT_TIMEOUT + " (" + timeoutMs + " ms); failing the commit");
        }
        Thread.sleep(POLL_MS);
      }
      LOG.info("spark-statebackend: store {} version {}: commit released after {} ms", instance, version,
          System.currentTimeMillis() - start);
    } catch (IOException e) {
      throw new IllegalStateException("spark-statebackend: cannot write " + gate + ": " + e, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("spark-statebackend: interrupted while waiting for the sidecar", e);
    } finally {
      try {
        Files.deleteIfExists(gate);
      } catch (IOException e) {
        LOG.warn("spark-statebackend: could not remove {}: {}", gate, e.toString());
      }
    }
  }
}
