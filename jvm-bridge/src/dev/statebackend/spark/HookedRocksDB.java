package dev.statebackend.spark;

import java.io.File;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.execution.streaming.state.RocksDB;
import org.apache.spark.sql.execution.streaming.state.RocksDBConf;
import org.apache.spark.sql.execution.streaming.state.RocksDBEventForwarder;
import org.apache.spark.sql.execution.streaming.state.RocksDBFileManager;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;

/**
 * Spark's RocksDB with two hooks:
 * <ul>
 *   <li>{@code createFileManager(String, File, Configuration, String, String, StateStoreConf)}: install
 *   {@link HookedFileManager} (staging after each committed snapshot);</li>
 *   <li>{@code load(long, Option, boolean, boolean)}: before Spark loads version v from the checkpoint
 *   dir, if v's files are missing there, ask the sidecar to restore them and wait
 *   ({@link RestoreRequester}).</li>
 * </ul>
 *
 * <p>"Missing" (format v1 and v2 without changelog checkpointing): Spark loads the newest {@code
 * <s>.zip} with s &lt;= v and replays changelogs s+1..v, which do not exist in this mode; so v is
 * loadable only if {@code <v>.zip} (v2: {@code <v>_<uniqueId>.zip}, the id Spark passes to load) and
 * every file its metadata references are present with their recorded sizes. The check runs only when
 * this instance does not already hold v (a provider that stays loaded never touches the disk).
 *
 * <p>Changelog checkpointing is out of scope for this version: the instance logs an error and behaves
 * exactly like Spark's (no staging, no restore requests). Neither is a non-local checkpoint location.
 */
public class HookedRocksDB extends RocksDB {
  private static final Logger LOG = LoggerFactory.getLogger(HookedRocksDB.class);

  private final StoreContext ctx;
  private final boolean active;

  public HookedRocksDB(String dfsRootDir, RocksDBConf conf, File localRootDir, Configuration hadoopConf,
      String loggingId, boolean useColumnFamilies, boolean enableStateStoreCheckpointIds, int partitionId,
      Option<RocksDBEventForwarder> eventForwarder, Option<String> uniqueId, StoreContext ctx) {
    super(dfsRootDir, conf, localRootDir, hadoopConf, loggingId, useColumnFamilies,
        enableStateStoreCheckpointIds, partitionId, eventForwarder, uniqueId);
    this.ctx = ctx;
    boolean act = true;
    if (conf.enableChangelogCheckpointing()) {
      LOG.error("spark-statebackend: store {} ({}) uses changelog checkpointing "
          + "(spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true), which this version "
          + "does not back up: no snapshots are staged and no restores requested for it", ctx.instance(),
          dfsRootDir);
      act = false;
    } else if (!ctx.isLocal()) {
      LOG.error("spark-statebackend: store {} has a non-local checkpoint location {}; the blob-store backend "
          + "needs a local one: no snapshots are staged and no restores requested for it", ctx.instance(),
          dfsRootDir);
      act = false;
    }
    this.active = act;
    ((HookedFileManager) fileManager()).attach(act ? ctx : null);
  }

  /** Called from RocksDB's constructor: must not read this subclass' fields (they are not set yet). */
  @Override
  public RocksDBFileManager createFileManager(String dfsRootDir, File localTempDir, Configuration hadoopConf,
      String codecName, String loggingId, StateStoreConf storeConf) {
    return new HookedFileManager(dfsRootDir, localTempDir, hadoopConf, codecName, loggingId, storeConf,
        conf().fileChecksumEnabled(), fileChecksumThreadPoolSize());
  }

  @Override
  public RocksDB load(long version, Option<String> stateStoreCkptId, boolean readOnly, boolean loadEmpty) {
    if (active && version > 0 && !loadEmpty && !holds(version, stateStoreCkptId)) {
      String uid = stateStoreCkptId.isDefined() ? stateStoreCkptId.get() : null;
      String missing = SnapshotFiles.whatIsMissing(ctx.dfsDir, version, uid);
      if (missing != null) {
        RestoreRequester.restoreBeforeLoad(ctx, version, uid, missing);
      }
    }
    return super.load(version, stateStoreCkptId, readOnly, loadEmpty);
  }

  /** True when this instance already has exactly that version open, so Spark reads nothing. */
  private boolean holds(long version, Option<String> ckptId) {
    if (loadedVersion() != version) return false;
    return ckptId.isEmpty() || ckptId.equals(loadedStateStoreCkptId());
  }
}
