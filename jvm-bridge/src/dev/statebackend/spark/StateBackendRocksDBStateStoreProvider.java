package dev.statebackend.spark;

import java.io.File;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.execution.streaming.state.RocksDB;
import org.apache.spark.sql.execution.streaming.state.RocksDBConf;
import org.apache.spark.sql.execution.streaming.state.RocksDBEventForwarder;
import org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider;
import scala.Option;

/**
 * The state store provider users configure:
 * {@code spark.sql.streaming.stateStore.providerClass=dev.statebackend.spark.StateBackendRocksDBStateStoreProvider}.
 *
 * <p>Why it exists: Spark creates providers by class name with a zero-argument constructor, so this is
 * the entry point of every hook. It overrides only {@code RocksDBStateStoreProvider.createRocksDB(String,
 * RocksDBConf, File, Configuration, String, boolean, boolean, int, Option, Option)} to build a
 * {@link HookedRocksDB}. The constructor runs {@link SignatureCheck}: if Spark changed any member we
 * override, our override would silently not be called, so we fail fast instead, naming the Spark
 * version. With {@code spark.statebackend.enabled=false} it is exactly Spark's provider.
 */
public class StateBackendRocksDBStateStoreProvider extends RocksDBStateStoreProvider {

  public StateBackendRocksDBStateStoreProvider() {
    super();
    if (Conf.current().enabled()) SignatureCheck.verify();
  }

  @Override
  public RocksDB createRocksDB(String dfsRootDir, RocksDBConf conf, File localRootDir, Configuration hadoopConf,
      String loggingId, boolean useColumnFamilies, boolean enableStateStoreCheckpointIds, int partitionId,
      Option<RocksDBEventForwarder> eventForwarder, Option<String> uniqueId) {
    Conf c = Conf.current();
    if (!c.enabled()) {
      return super.createRocksDB(dfsRootDir, conf, localRootDir, hadoopConf, loggingId, useColumnFamilies,
          enableStateStoreCheckpointIds, partitionId, eventForwarder, uniqueId);
    }
    StoreContext ctx = StoreContext.of(stateStoreId(), dfsRootDir, c);
    return new HookedRocksDB(dfsRootDir, conf, localRootDir, hadoopConf, loggingId, useColumnFamilies,
        enableStateStoreCheckpointIds, partitionId, eventForwarder, uniqueId, ctx);
  }
}
