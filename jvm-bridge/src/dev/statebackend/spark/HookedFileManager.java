package dev.statebackend.spark;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.spark.sql.execution.streaming.state.ColumnFamilyInfo;
import org.apache.spark.sql.execution.streaming.state.RocksDBFileManager;
import org.apache.spark.sql.execution.streaming.state.RocksDBSnapshotFile;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import scala.collection.Map;

/**
 * Spark's RocksDBFileManager with two hooks:
 * <ul>
 *   <li>{@code saveCheckpointToDfs(File, long, long, long, Map, Option, Option, Option, boolean)}: after
 *   Spark has written version v into the store's checkpoint dir, stage exactly that version's files
 *   ({@link SnapshotStager}) and publish an event;</li>
 *   <li>{@code getFileSystem(String, Configuration)}: for a local checkpoint location, return a
 *   {@link HardLinkLocalFileSystem} so Spark's SST copies become hard links
 *   ({@code spark.statebackend.hardLinkCheckpoint}).</li>
 * </ul>
 *
 * <p>Why a subclass: saveCheckpointToDfs is the one place that sees a committed version's checkpoint
 * dir, its DFS file names and its unique id together, on the committing thread. Note that Spark calls
 * getFileSystem from the superclass constructor, before this class' fields exist, so it reads only the
 * static {@link Conf}; the store context is attached after construction by {@link HookedRocksDB}.
 */
public class HookedFileManager extends RocksDBFileManager {
  private static final Logger LOG = LoggerFactory.getLogger(HookedFileManager.class);

  private volatile StoreContext ctx;

  public HookedFileManager(String dfsRootDir, File localTempDir, Configuration hadoopConf, String codecName,
      String loggingId, StateStoreConf storeConf, boolean fileChecksumEnabled,
      Option<Object> fileChecksumThreadPoolSize) {
    super(dfsRootDir, localTempDir, hadoopConf, codecName, loggingId, storeConf, fileChecksumEnabled,
        fileChecksumThreadPoolSize);
  }

  /** Turns staging on for this store; null leaves the manager exactly Spark's (plus hard links). */
  void attach(StoreContext context) {
    this.ctx = context;
  }

  @Override
  public FileSystem getFileSystem(String dfsRootDir, Configuration hadoopConf) {
    FileSystem base = super.getFileSystem(dfsRootDir, hadoopConf);
    Conf conf = Conf.current();
    if (conf.enabled() && conf.hardLinkCheckpoint() && "file".equalsIgnoreCase(base.getScheme())) {
      try {
        return HardLinkLocalFileSystem.create(hadoopConf);
      } catch (IOException e) {
        throw new UncheckedIOException("spark-statebackend: cannot create the hard-link file system for "
            + dfsRootDir, e);
      }
    }
    return base;
  }

  @Override
  public void saveCheckpointToDfs(File checkpointDir, long version, long numKeys, long numInternalKeys,
      Map<String, RocksDBSnapshotFile> fileMapping, Option<Map<String, ColumnFamilyInfo>> columnFamilyMapping,
      Option<Object> maxColumnFamilyId, Option<String> checkpointUniqueId, boolean verifyNonEmptyFilesInZip) {
    StoreContext c = ctx;
    if (c != null) {
      Conf conf = Conf.current();
      CommitGate.await(c, version, conf.maxCommitDelayMs(), conf.commitTimeoutMs());
    }
    super.saveCheckpointToDfs(checkpointDir, version, numKeys, numInternalKeys, fileMapping,
        columnFamilyMapping, maxColumnFamilyId, checkpointUniqueId, verifyNonEmptyFilesInZip);
    if (c == null) {
      LOG.debug("spark-statebackend: staging off for {}", checkpointDir);
      return;
    }
    SnapshotStager.stage(c, version, checkpointUniqueId.isDefined() ? checkpointUniqueId.get() : null,
        checkpointDir);
  }
}
