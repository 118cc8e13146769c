package dev.statebackend.spark;

import java.nio.file.Path;
import java.util.Base64;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.core.JsonProcessingException;

/**
 * Every JSON document the shim writes into a spool directory, one record per type: the Java half of
 * {@code spark_statebackend/runtime/spool/documents.py} (and of {@code runtime/progress.py} for the driver's
 * progress documents); the protocol is the docstring of {@code spark_statebackend/runtime/spool/__init__.py}.
 *
 * <p>Why it exists: the Python side reads these strictly (a missing or mistyped field is a
 * {@code SpoolFormatError} naming the file), so each document's fields are written in exactly one place,
 * from typed components that mirror the Python dataclass of the same name. {@code toJson()} gives the
 * document as an ordered map for {@link Spool#writeJsonAtomically}; a null component is written as JSON
 * null unless its comment says the field is left out. Paths are written with {@code toString()}: the
 * callers pass absolute, normalized paths. Public only so a test can run the writer against the Python
 * reader ({@code tests/runtime/test_spool_documents.py}).
 */
public final class SpoolDocuments {
  private SpoolDocuments() {}

  /** The bytes {@link Spool#writeJsonAtomically} writes for {@code document} (compact UTF-8 JSON). */
  public static byte[] json(Map<String, Object> document) throws JsonProcessingException {
    return Spool.MAPPER.writeValueAsBytes(document);
  }

  private static Map<String, Object> start(String type) {
    Map<String, Object> doc = new LinkedHashMap<>();
    doc.put("schema_version", Spool.SCHEMA_VERSION);
    doc.put("type", type);
    return doc;
  }

  /**
   * {@code events/}: one committed store version staged as hard links in {@code stagedDir} ([C2]);
   * Python {@code SnapshotEvent}. {@code requestId}: the committing task waits for the upload
   * (durableCommit) and the sidecar answers {@code responses/<requestId>.json}; null leaves the field out.
   */
  public record SnapshotEvent(String queryId, Long batchId, Path checkpointRoot, Path dfsDir, long operator,
      int partition, String store, long version, String sparkUniqueId, long snapshotVersion,
      List<Long> changelogVersions, boolean upgrade, Path stagedDir, List<String> files, String executorId,
      long createdAtMs, long stageNanos, String requestId) {
    public Map<String, Object> toJson() {
      Map<String, Object> doc = start("snapshot");
      doc.put("query_id", queryId);
      doc.put("batch_id", batchId);
      doc.put("checkpoint_root", checkpointRoot.toString());
      doc.put("dfs_dir", dfsDir.toString());
      doc.put("operator", operator);
      doc.put("partition", partition);
      doc.put("store", store);
      doc.put("version", version);
      doc.put("spark_unique_id", sparkUniqueId);
      doc.put("snapshot_version", snapshotVersion);
      doc.put("changelog_versions", changelogVersions);
      doc.put("upgrade", upgrade);
      doc.put("staged_dir", stagedDir.toString());
      doc.put("files", files);
      doc.put("executor_id", executorId);
      doc.put("created_at_ms", createdAtMs);
      doc.put("stage_nanos", stageNanos);
      if (requestId != null) doc.put("request_id", requestId);
      return Collections.unmodifiableMap(doc);
    }
  }

  /**
   * {@code streams/}: a changelog Spark is writing, hard-linked as {@code stagedDir/file} while it grows,
   * which the sidecar uploads before the commit. Python {@code ChangelogStream}.
   */
  public record ChangelogStream(String queryId, Path checkpointRoot, long operator, int partition, String store,
      long version, Path stagedDir, String file, String executorId, long createdAtMs) {
    public Map<String, Object> toJson() {
      Map<String, Object> doc = start("changelog_stream");
      doc.put("query_id", queryId);
      doc.put("checkpoint_root", checkpointRoot.toString());
      doc.put("operator", operator);
      doc.put("partition", partition);
      doc.put("store", store);
      doc.put("version", version);
      doc.put("staged_dir", stagedDir.toString());
      doc.put("file", file);
      doc.put("executor_id", executorId);
      doc.put("created_at_ms", createdAtMs);
      return Collections.unmodifiableMap(doc);
    }
  }

  /**
   * {@code requests/}: put {@code version} of one store back into {@code dfsDir} before Spark loads it
   * ([E1]); {@code version} null: the latest checkpointed version. Python {@code RestoreRequest}.
   */
  public record RestoreRequest(String requestId, String queryId, Path checkpointRoot, Path dfsDir,
      long operator, int partition, String store, Long version, String sparkUniqueId, String missing,
      String executorId, long createdAtMs) {
    public Map<String, Object> toJson() {
      Map<String, Object> doc = start("store");
      doc.put("request_id", requestId);
      doc.put("query_id", queryId);
      doc.put("checkpoint_root", checkpointRoot.toString());
      doc.put("dfs_dir", dfsDir.toString());
      doc.put("operator", operator);
      doc.put("partition", partition);
      doc.put("store", store);
      doc.put("version", version);
      doc.put("spark_unique_id", sparkUniqueId);
      doc.put("missing", missing);
      doc.put("executor_id", executorId);
      doc.put("created_at_ms", createdAtMs);
      return Collections.unmodifiableMap(doc);
    }
  }

  /**
   * {@code requests/} of the driver: make checkpoint location {@code checkpointRoot} resume from its
   * query's latest durable checkpoint ([D1]); {@code mode} "start" or "read". Python
   * {@code CheckpointLocationRequest}.
   */
  public record CheckpointLocationRequest(String requestId, Path checkpointRoot, String mode,
      String executorId, long createdAtMs, boolean restoreStores) {
    public Map<String, Object> toJson() {
      Map<String, Object> doc = start("checkpoint_location");
      doc.put("request_id", requestId);
      doc.put("checkpoint_root", checkpointRoot.toString());
      doc.put("mode", mode);
      doc.put("executor_id", executorId);
      doc.put("created_at_ms", createdAtMs);
      doc.put("restore_stores", restoreStores);
      return Collections.unmodifiableMap(doc);
    }
  }

  /**
   * {@code requests/} of the driver: store the plan of {@code batchId} ([C0]); {@code offsets} are the
   * bytes Spark writes as {@code offsets/<batchId>}, sent as base64. Python {@code PlanRequest}.
   */
  public record PlanRequest(String requestId, String queryId, Path checkpointRoot, long batchId,
      byte[] offsets, String executorId, long createdAtMs) {
    public Map<String, Object> toJson() {
      Map<String, Object> doc = start("plan");
      doc.put("request_id", requestId);
      doc.put("query_id", queryId);
      doc.put("checkpoint_root", checkpointRoot.toString());
      doc.put("batch_id", batchId);
      doc.put("offsets", Base64.getEncoder().encodeToString(offsets));
      doc.put("executor_id", executorId);
      doc.put("created_at_ms", createdAtMs);
      return Collections.unmodifiableMap(doc);
    }
  }

  /**
   * {@code progress/} of the driver: micro-batch {@code batchId} finished ([C5]); {@code progressJson} is
   * Spark's {@code StreamingQueryProgress.json()}, {@code checkpointRoot} the query's resolved location as
   * a local path (a remote location's: its local mirror root on the driver), {@code checkpointLocation}
   * a remote location's name ({@link RemoteLocations#name}; left out for a local one). Read by Python's
   * {@code read_progress_event}.
   */
  public record Progress(String queryId, String runId, String name, long batchId, String checkpointRoot,
      String checkpointLocation, String progressJson, long createdAtMs) {
    public Map<String, Object> toJson() {
      Map<String, Object> doc = start("progress");
      doc.put("query_id", queryId);
      doc.put("run_id", runId);
      doc.put("name", name);
      doc.put("batch_id", batchId);
      doc.put("checkpoint_root", checkpointRoot);
      if (checkpointLocation != null) doc.put("checkpoint_location", checkpointLocation);
      doc.put("progress_json", progressJson);
      doc.put("created_at_ms", createdAtMs);
      return Collections.unmodifiableMap(doc);
    }
  }

  /**
   * {@code progress/} of the driver: {@code commits/<batchId>} was written while no query ran on
   * {@code checkpointRoot} (offline state repartition); {@code queryId} null: the committer resolves it.
   * Read by Python's {@code read_progress_event} ({@code ProgressEvent.offline_commit}).
   */
  public record OfflineCommit(String queryId, long batchId, Path checkpointRoot, long createdAtMs) {
    public Map<String, Object> toJson() {
      Map<String, Object> doc = start("offline_commit");
      doc.put("query_id", queryId);
      doc.put("batch_id", batchId);
      doc.put("checkpoint_root", checkpointRoot.toString());
      doc.put("created_at_ms", createdAtMs);
      return Collections.unmodifiableMap(doc);
    }
  }

  /**
   * {@code status.json} as the plugin writes it when it gave up restarting an executor's sidecar: the
   * upload lag of {@code runtime/upload_lag.py} (schema 1, no type), lagging since {@code sinceMs}, plus
   * {@code sidecar}, why nothing uploads, which {@link CommitGate} reads. A new sidecar overwrites it.
   */
  public record SidecarGivenUpStatus(long sinceMs, String sidecar) {
    public Map<String, Object> toJson() {
      Map<String, Object> doc = new LinkedHashMap<>();
      doc.put("schema_version", 1);
      doc.put("oldest_upload_staged_at_ms", sinceMs);
      doc.put("updated_at_ms", sinceMs);
      doc.put("sidecar", sidecar);
      return Collections.unmodifiableMap(doc);
    }
  }
}
