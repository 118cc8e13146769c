package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.UUID;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * [C2] of the commit path ({@code spark_statebackend/runtime/__init__.py}): stages one committed version
 * for the sidecar: hard-links its {@link Recipe} (the snapshot and the
 * changelogs Spark would replay) from the store's checkpoint dir into
 * {@code <staging>/<appId>/<op>/<part>/<store>/<v>-<random>/}, with the same relative layout, and
 * publishes a snapshot event.
 *
 * <p>Why it exists: it is the synchronous half of the Samza-style commit. It runs while Spark's commit
 * of the version is still in progress (inside the close of the version's zip or changelog), so it must
 * cost only hard links and one small JSON write. The dir is built under a hidden temp name and renamed
 * into place, so the sidecar never sees a partial snapshot; restoring is copying these files back.
 */
final class Stager {
  private static final Logger LOG = LoggerFactory.getLogger(Stager.class);

  private Stager() {}

  /**
   * Stages {@code recipe} of {@code store} and publishes its event; throws if it cannot, so the commit
   * fails loudly and Spark retries the task, instead of a version silently missing from the backup.
   * {@code upgrade}: the version was staged before and Spark has since published a snapshot that
   * shortens its recipe (changelog checkpointing, {@link StoreHooks}); the event says so. {@code
   * awaited}: the committing task will wait for the upload (durableCommit): the event carries a request
   * id, returned, that the sidecar answers in {@code responses/} once the version is uploaded; null
   * otherwise.
   */
  static String stage(ExecutorEnv env, StoreDir store, Recipe recipe, String queryId, Long batchId,
      boolean upgrade, boolean awaited) {
    long t0 = System.nanoTime();
    Path storeStaging = storeStaging(env, store);
    String leaf = recipe.version + "-" + UUID.randomUUID().toString().substring(0, 8);
    Path tmp = storeStaging.resolve("." + leaf + ".tmp");
    Path staged = storeStaging.resolve(leaf);
    try {
      Files.createDirectories(tmp);
      for (String rel : recipe.files) {
        Path dst = tmp.resolve(rel);
        if (!dst.getParent().equals(tmp)) Files.createDirectories(dst.getParent());
        HardLinks.linkOrCopyNew(store.dir.resolve(rel), dst);
      }
      Files.move(tmp, staged, StandardCopyOption.ATOMIC_MOVE);
    } catch (IOException | RuntimeException e) {
      HardLinks.deleteTree(tmp);
      throw new IllegalStateException("spark-statebackend: query " + queryId + " store " + store.instance()
          + ": could not stage version " + recipe.version + " (" + store.dir + ") into " + staged + ": " + e, e);
    }
    long stageNanos = System.nanoTime() - t0;

    String requestId = awaited ? UUID.randomUUID().toString() : null;
    SpoolDocuments.SnapshotEvent event = new SpoolDocuments.SnapshotEvent(queryId, batchId, store.root, store.dir,
        store.operator, store.partition, store.store, recipe.version, recipe.uniqueId, recipe.snapshotVersion,
        recipe.changelogVersions, upgrade, staged, recipe.files, env.executorId, System.currentTimeMillis(),
        stageNanos, requestId);
    Path eventFile;
    try {
      eventFile = env.spool().publishEvent(event);
    } catch (IOException e) {
      HardLinks.deleteTree(staged);
      throw new IllegalStateException("spark-statebackend: query " + queryId + " store " + store.instance()
          + ": could not publish the snapshot event for version " + recipe.version + " into "
          + env.spoolDir + ": " + e, e);
    }
    LOG.info("spark-statebackend: staged {}query={} store={} version={} (snapshot {}, {} changelog(s)) "
        + "files={} in {} us -> {} (event {})", upgrade ? "upgrade " : "", queryId, store.instance(),
        recipe.version, recipe.snapshotVersion, recipe.changelogVersions.size(), recipe.files.size(),
        stageNanos / 1000, staged, eventFile.getFileName());
    if (!upgrade) CrashPoints.reached(CrashPoints.AFTER_STAGING, env); // test only: a no-op unless armed
    return requestId;
  }

  /** {@code <staging>/<appId>/<op>/<part>/<store>}: where a store's versions are staged. */
  private static Path storeStaging(ExecutorEnv env, StoreDir store) {
    return env.stagingRoot(store.root).resolve(Conf.sanitizeId(env.appId))
        .resolve(Long.toString(store.operator)).resolve(Integer.toString(store.partition))
        .resolve(Conf.sanitizeId(store.store));
  }

  /**
   * Lets the sidecar upload changelog {@code name} of {@code version} while Spark writes it ({@code
   * writing}, the file being written), so the commit that waits for its upload (durableCommit) waits only
   * for its last part ({@code spark_statebackend/runtime/changelog_streams.py}): hard-links it into a
   * staging dir of the version and publishes a stream document. Costs one link and one small JSON write
   * when the writer opens. Never throws: without it the commit uploads the whole changelog, as before.
   * Returns the staging dir of the link (for the writer's cancel to remove), or null.
   */
  static Path stream(ExecutorEnv env, StoreDir store, long version, String name, String queryId, Path writing) {
    if (queryId == null) return null;   // outside a micro-batch: nothing waits for it
    Path dir = storeStaging(env, store).resolve(version + "-" + UUID.randomUUID().toString().substring(0, 8));
    try {
      Files.createDirectories(dir);
      Files.createLink(dir.resolve(name), writing);
      env.spool().publishStream(new SpoolDocuments.ChangelogStream(queryId, store.root, store.operator,
          store.partition, store.store, version, dir, name, env.executorId, System.currentTimeMillis()));
      return dir;
    } catch (IOException | RuntimeException e) {
      HardLinks.deleteTree(dir);
      LOG.warn("spark-statebackend: query={} store={} version={}: {} cannot be uploaded while it is written ({}); "
          + "its commit uploads all of it", queryId, store.instance(), version, name, e.toString());
      return null;
    }
  }
}
