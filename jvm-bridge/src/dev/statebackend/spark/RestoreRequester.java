package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;

import com.fasterxml.jackson.databind.JsonNode;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Asks the sidecar to put version v of a store back into its checkpoint dir, and waits (bounded): [E1]
 * of the executor restore path ({@code spark_statebackend/runtime/__init__.py}); the sidecar's restore
 * loop does [E2]-[E5]. The same wait serves the driver's checkpoint-location requests ([D1]).
 *
 * <p>Why it exists: Spark's own load copies files one by one from the checkpoint location; when they
 * are missing locally (new host, lost disk) the blob store has them. Every outcome other than
 * "restored" falls back to Spark's own load: Spark's checkpoint files are the second backend, and Spark
 * fails loudly (CANNOT_LOAD_STATE_STORE) if they are missing too, never starting from empty state.
 *
 * <p>Waits are bounded twice: by the restore timeout, and by sidecar liveness. If no live sidecar has
 * registered ({@code sidecar.json}) for {@link #LIVENESS_GRACE_MS}, we stop waiting; after one such
 * give-up the JVM only waits {@link #SHORT_GRACE_MS} until a sidecar is seen again, so a query without a
 * sidecar does not wait per partition.
 */
public final class RestoreRequester {
  private static final Logger LOG = LoggerFactory.getLogger(RestoreRequester.class);
  // A restore from a local store takes ~10-25 ms, so a 20 ms poll doubled it; a response check is one stat.
  static final long POLL_MS = 3;
  static final long LIVENESS_GRACE_MS = 30_000;
  static final long SHORT_GRACE_MS = 1_000;
  private static volatile boolean sidecarMissingBefore;

  enum Status { RESTORED, UPLOADED, NOT_FOUND, ERROR, TIMEOUT, NO_SIDECAR }

  /** How a request ended; {@code message} says why in words fit for a log line. */
  static final class Outcome {
    final Status status;
    final String message;
    final String requestId;

    Outcome(Status status, String message, String requestId) {
      this.status = status;
      this.message = message;
      this.requestId = requestId;
    }

    @Override
    public String toString() {
      return status + ": " + message;
    }
  }

  private RestoreRequester() {}

  /**
   * Requests a restore of {@code version} of {@code store} (null: the query's latest checkpointed version)
   * before Spark loads it, and logs the outcome; never throws for a failed restore: Spark's own load
   * then reads its own files and fails loudly if they are missing too.
   */
  static Outcome restoreBeforeLoad(ExecutorEnv env, StoreDir store, String queryId, Long version,
      String uniqueId, String missing, Recipe.Codec codec) {
    String v = version == null ? "latest" : Long.toString(version);
    LOG.info("spark-statebackend: query={} store={} version={}: {}; requesting a restore", queryId,
        store.instance(), v, missing);
    Outcome o;
    try {
      long grace = sidecarMissingBefore ? SHORT_GRACE_MS : LIVENESS_GRACE_MS;
      o = request(env.spool(), describe(env, store, queryId, version, uniqueId, missing),
          env.conf.restoreTimeoutMs(), grace);
    } catch (IOException e) {
      o = new Outcome(Status.ERROR, "could not write the restore request: " + e, null);
    }
    if (o.status == Status.RESTORED) {
      String still = null;
      if (version != null) {
        try {
          Recipe.of(store.dir, version, uniqueId, codec);
        } catch (Recipe.Missing | IOException e) {
          still = e.getMessage();
        }
      }
      if (still != null) {
        LOG.error("spark-statebackend: query={} store={} version={}: sidecar reported restored but {}; "
            + "Spark's own load decides now", queryId, store.instance(), v, still);
      } else {
        LOG.info("spark-statebackend: query={} store={} version={} restored ({})", queryId, store.instance(),
            v, o.message);
      }
    } else if (version == null && o.status == Status.NOT_FOUND) {
      // A task outside a micro-batch (state reader, offline repartition) on a store the latest
      // checkpoint does not have: offline repartition's new partitions, which Spark creates empty.
      // Spark's own load decides, and fails loudly if a store it must read has no files.
      LOG.warn("spark-statebackend: query={} store={}: the latest checkpoint has no snapshot of this store ({}); "
          + "Spark's own files in {} decide (a store new since then, such as a partition added by offline "
          + "state repartition, starts empty)", queryId, store.instance(), o, store.dir);
    } else {
      LOG.error("spark-statebackend: query={} store={} version={}: no restore from the blob store ({}); "
          + "falling back to Spark's checkpoint files in {}", queryId, store.instance(), v, o, store.dir);
    }
    return o;
  }

  static Map<String, Object> describe(ExecutorEnv env, StoreDir store, String queryId, Long version,
      String uniqueId, String missing) {
    return new SpoolDocuments.RestoreRequest(UUID.randomUUID().toString(), queryId, store.root, store.dir,
        store.operator, store.partition, store.store, version, uniqueId, missing, env.executorId,
        System.currentTimeMillis()).toJson();
  }

  /**
   * Asks the driver's sidecar to make checkpoint location {@code root} resume from its query's latest
   * durable checkpoint ({@code mode} "start": rebuild if missing, behind or ahead; "read": only if it has
   * no files) and waits; RESTORED means done (the message says what was done).
   */
  static Outcome prepareCheckpointLocation(ExecutorEnv driver, Path root, String mode) {
    Map<String, Object> r = new SpoolDocuments.CheckpointLocationRequest(UUID.randomUUID().toString(), root, mode,
        driver.executorId, System.currentTimeMillis(), ExecutorEnv.driverRunsTasks).toJson();
    try {
      return request(driver.spool(), r, driver.conf.restoreTimeoutMs(), LIVENESS_GRACE_MS);
    } catch (IOException e) {
      return new Outcome(Status.ERROR, "could not write the request into " + driver.spoolDir + ": " + e, null);
    }
  }

  /**
   * Asks the driver's sidecar to store the plan of {@code batch} of the query on {@code root} (the bytes
   * Spark is writing as {@code offsets/<batch>}) and waits up to commitTimeout; UPLOADED means stored
   * (the message names the blob). With the driver's sidecar given up (no plan can be stored any more) it
   * answers NO_SIDECAR at once, naming that cause, instead of waiting up to commitTimeout; a request left
   * unanswered while the plugin gave up names that cause too.
   */
  static Outcome storePlan(ExecutorEnv driver, Path root, String queryId, long batch, byte[] offsets) {
    String givenUp = CommitGate.sidecarGivenUp(driver.spoolDir);
    if (givenUp != null) return new Outcome(Status.NO_SIDECAR, givenUp, null);
    Map<String, Object> r = new SpoolDocuments.PlanRequest(UUID.randomUUID().toString(), queryId, root, batch,
        offsets, driver.executorId, System.currentTimeMillis()).toJson();
    try {
      Outcome o = request(driver.spool(), r, driver.conf.commitTimeoutMs(), LIVENESS_GRACE_MS);
      // Given up while this request waited (it timed out, or no sidecar came back): name that cause.
      boolean unanswered = o.status == Status.NO_SIDECAR || o.status == Status.TIMEOUT;
      givenUp = unanswered ? CommitGate.sidecarGivenUp(driver.spoolDir) : null;
      return givenUp == null ? o : new Outcome(o.status, givenUp + " (" + o.message + ")", o.requestId);
    } catch (IOException e) {
      return new Outcome(Status.ERROR, "could not write the request into " + driver.spoolDir + ": " + e, null);
    }
  }

  /**
   * Writes {@code request} (which carries its request_id) and waits for the response, polling every
   * {@link #POLL_MS} ms, at most {@code timeoutMs}, and at most {@code graceMs} while no live sidecar is
   * registered. The request file is removed when we stop waiting without an answer, so a late sidecar
   * skips it. Interruption (task kill) aborts the wait and throws.
   */
  static Outcome request(Spool spool, Map<String, Object> request, long timeoutMs, long graceMs)
      throws IOException {
    String id = (String) request.get("request_id");
    Path reqFile = spool.writeRequest(request);
    try {
      return awaitResponse(spool, id, timeoutMs, graceMs);
    } finally {
      Files.deleteIfExists(reqFile);
    }
  }

  /**
   * Waits for {@code responses/<id>.json} (a restore request's answer, or a snapshot event's the task
   * waits for: durableCommit), polling every {@link #POLL_MS} ms, at most {@code timeoutMs}, and at most
   * {@code graceMs} while no live sidecar is registered. Interruption (task kill) aborts the wait and
   * throws.
   */
  static Outcome awaitResponse(Spool spool, String id, long timeoutMs, long graceMs) throws IOException {
    long start = System.currentTimeMillis();
    long deadline = start + timeoutMs;
    long lastAlive = start;
    long nextLivenessCheck = start;
    try {
      while (true) {
        Optional<JsonNode> resp = spool.takeResponse(id);
        if (resp.isPresent()) return interpret(resp.get(), id);
        long now = System.currentTimeMillis();
        if (now >= nextLivenessCheck) {
          if (spool.sidecarAlive()) {
            lastAlive = now;
            sidecarMissingBefore = false;
          } else if (now - lastAlive >= graceMs) {
            sidecarMissingBefore = true;
            return new Outcome(Status.NO_SIDECAR, "no live sidecar registered in " + spool.dir()
                + " (sidecar.json) for " + (now - lastAlive) + " ms", id);
          }
          nextLivenessCheck = now + 250;
        }
        if (now >= deadline) {
          return new Outcome(Status.TIMEOUT, "no response within " + timeoutMs + " ms", id);
        }
        Thread.sleep(Math.min(POLL_MS, Math.max(1, deadline - now)));
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("spark-statebackend: interrupted while waiting for the sidecar's answer "
          + id, e);
    }
  }

  private static Outcome interpret(JsonNode r, String id) {
    String status = r.path("status").asText("");
    String message = r.path("message").asText("");
    String detail = message + (r.has("files") ? " files=" + r.path("files").asText() : "")
        + (r.has("bytes") ? " bytes=" + r.path("bytes").asText() : "")
        + (r.has("duration_ms") ? " duration_ms=" + r.path("duration_ms").asText() : "");
    switch (status) {
      case "restored":
        return new Outcome(Status.RESTORED, detail.trim(), id);
      case "uploaded":
        return new Outcome(Status.UPLOADED, detail.trim(), id);
      case "not_found":
        return new Outcome(Status.NOT_FOUND, "sidecar: not found: " + message, id);
      case "error":
        return new Outcome(Status.ERROR, "sidecar: error: " + message, id);
      default:
        return new Outcome(Status.ERROR, "sidecar answered unknown status '" + status + "': " + message, id);
    }
  }

  /**
   * py4j test hook: writes a request for an imaginary store into {@code spoolDir} and waits like the load
   * hook does (with the given sidecar-liveness grace). Returns "STATUS: message".
   */
  public static String requestForTest(String spoolDir, long version, long timeoutMs, long graceMs)
      throws IOException {
    Map<String, Object> r = new SpoolDocuments.RestoreRequest(UUID.randomUUID().toString(), null,
        java.nio.file.Paths.get("/nonexistent/ckpt"), java.nio.file.Paths.get("/nonexistent/ckpt/state/0/0"), 0L,
        0, "default", version, null, version + ".zip is absent", "test", System.currentTimeMillis()).toJson();
    return request(new Spool(java.nio.file.Paths.get(spoolDir)), r, timeoutMs, graceMs).toString();
  }
}
