package dev.statebackend.spark;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Stages one committed version for the sidecar: hard-links exactly the files Spark just wrote for it
 * ({@code <v>[_<id>].zip}, {@code SSTs/...}, {@code logs/...}) from the store's checkpoint dir into
 * {@code <staging>/<appId>/<op>/<part>/<store>/<v>-<random>/}, with the same relative layout (plus
 * Spark's {@code <zip>.crc} checksum file when it wrote one), and
 * publishes a snapshot event.
 *
 * <p>Why it exists: it is the synchronous half of the Samza-style commit. It runs on the task thread
 * right after Spark's {@code RocksDBFileManager.saveCheckpointToDfs} returns, so it must cost only hard
 * links and one small JSON write. The dir is built under a hidden temp name and renamed into place, so
 * the sidecar never sees a partial snapshot; restoring is copying these files back into the store dir.
 */
final class SnapshotStager {
  private static final Logger LOG = LoggerFactory.getLogger(SnapshotStager.class);

  private SnapshotStager() {}

  /**
   * Stages {@code version} and publishes its event. Throws if the snapshot cannot be staged: the commit
   * then fails loudly and Spark retries the task, instead of a version silently missing from the backup.
   */
  static void stage(StoreContext ctx, long version, String uniqueId, File checkpointDir) {
    long t0 = System.nanoTime();
    Path storeStaging = ctx.stagingRoot.resolve(Conf.sanitizeId(ctx.appId))
        .resolve(Long.toString(ctx.operator)).resolve(Integer.toString(ctx.partition))
        .resolve(Conf.sanitizeId(ctx.store));
    String leaf = version + "-" + UUID.randomUUID().toString().substring(0, 8);
    Path tmp = storeStaging.resolve("." + leaf + ".tmp");
    Path staged = storeStaging.resolve(leaf);
    List<String> files = new ArrayList<>();
    try {
      List<SnapshotFiles.Ref> refs = SnapshotFiles.fromCheckpointDir(checkpointDir);
      Files.createDirectories(tmp);
      String zip = SnapshotFiles.zipName(version, uniqueId);
      HardLinks.linkOrCopyNew(ctx.dfsDir.resolve(zip), tmp.resolve(zip));
      files.add(zip);
      // Spark's own checksum of the zip (ChecksumCheckpointFileManager, written when file checksums are on,
      // e.g. with checkpoint format v2). Optional on load (Spark warns and skips verification without
      // it), but restoring it keeps Spark's verification working.
      String crc = zip + SnapshotFiles.CHECKSUM_SUFFIX;
      if (Files.isRegularFile(ctx.dfsDir.resolve(crc))) {
        HardLinks.linkOrCopyNew(ctx.dfsDir.resolve(crc), tmp.resolve(crc));
        files.add(crc);
      }
      for (SnapshotFiles.Ref r : refs) {
        Path dst = tmp.resolve(r.relPath);
        Files.createDirectories(dst.getParent());
        HardLinks.linkOrCopyNew(ctx.dfsDir.resolve(r.relPath), dst);
        files.add(r.relPath);
      }
      Files.move(tmp, staged, StandardCopyOption.ATOMIC_MOVE);
    } catch (IOException | RuntimeException e) {
      HardLinks.deleteTree(tmp);
      throw new IllegalStateException("spark-statebackend: could not stage version " + version + " of store "
          + ctx.instance() + " (" + ctx.dfsDir + ") into " + staged + ": " + e, e);
    }
    long stageNanos = System.nanoTime() - t0;

    Map<String, Object> event = new LinkedHashMap<>();
    event.put("schema_version", Spool.SCHEMA_VERSION);
    event.put("type", "snapshot");
    event.put("query_id", StoreContext.queryId());
    event.put("batch_id", StoreContext.batchId());
    event.put("checkpoint_root", ctx.checkpointRoot.toString());
    event.put("dfs_dir", ctx.dfsDir.toString());
    event.put("operator", ctx.operator);
    event.put("partition", ctx.partition);
    event.put("store", ctx.store);
    event.put("version", version);
    event.put("spark_unique_id", uniqueId);
    event.put("staged_dir", staged.toString());
    event.put("files", files);
    event.put("executor_id", ctx.executorId);
    event.put("created_at_ms", System.currentTimeMillis());
    event.put("stage_nanos", stageNanos);
    Path eventFile;
    try {
      eventFile = ctx.spool().publishEvent(event);
    } catch (IOException e) {
      HardLinks.deleteTree(staged);
      throw new IllegalStateException("spark-statebackend: could not publish the snapshot event for version "
          + version + " of store " + ctx.instance() + " into " + ctx.spoolDir + ": " + e, e);
    }
    LOG.info("spark-statebackend: staged query={} store={} version={} files={} in {} us -> {} (event {})",
        event.get("query_id"), ctx.instance(), version, files.size(), stageNanos / 1000, staged,
        eventFile.getFileName());
    CrashPoints.reached(CrashPoints.AFTER_STAGING, ctx); // test only: a no-op unless test.crashAt is set
  }
}
