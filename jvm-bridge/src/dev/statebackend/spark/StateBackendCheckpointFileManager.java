package dev.statebackend.spark;

import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;

/**
 * The hook: {@code spark.sql.streaming.checkpointFileManagerClass=dev.statebackend.spark.StateBackendCheckpointFileManager}
 * (set by the plugin at application start; a manager the user had configured is kept as the delegate).
 *
 * <p>Why this extension point: Spark builds every checkpoint file manager of a query through
 * {@code CheckpointFileManager.create(path, hadoopConf)}, which reads this class name from the session's
 * Hadoop conf, on the driver (offsets, commits, metadata) and on executors (each RocksDB store's dir:
 * RocksDBFileManager's {@code fm}). Unlike the state store provider class, Spark does not record it in
 * the query's offset log, and it is not among the names transformWithState and offline repartition
 * check, so users keep Spark's own RocksDBStateStoreProvider and a checkpoint stays Spark's: remove the
 * keys and Spark's provider continues it unchanged. Every call is delegated; what we add:
 * <ul>
 *   <li>a store dir ({@link StoreDir}): the commit and load hooks of {@link StoreHooks};</li>
 *   <li>{@link #createCheckpointDirectory()}: Spark's first touch of a query's checkpoint location when a
 *   query starts (ResolveWriteToStream, before the query id is read from {@code metadata}): the
 *   driver-side restore of {@link DriverHooks#beforeQueryStart};</li>
 *   <li>the driver's {@code offsets}/{@code commits}/{@code metadata} outside a running query (the state
 *   reader, offline repartition): {@link DriverHooks};</li>
 *   <li>a store dir of a location on another Hadoop scheme: the delegate is the local manager on the
 *   store's mirror ({@link RemoteLocations}), every path mapped into it and every listed path back.</li>
 * </ul>
 */
public class StateBackendCheckpointFileManager implements CheckpointFileManager {
  private final Path path;
  private final Configuration hadoopConf;
  private final CheckpointFileManager delegate;
  private final StoreHooks store;   // null unless path is a store dir
  private final java.nio.file.Path rootOfLog;   // the checkpoint root when path is <root>/offsets|commits
  /** A remote location's store dir (its files are in the local mirror, {@link RemoteLocations}); else null. */
  private final StoreDir mirrored;

  /** The constructor Spark calls by reflection: {@code (Path, Configuration)}. */
  public StateBackendCheckpointFileManager(Path path, Configuration hadoopConf) {
    this.path = path;
    this.hadoopConf = hadoopConf;
    StoreDir sd = StoreDir.parse(path);
    this.mirrored = sd != null && sd.remote != null ? sd : null;
    // A remote store dir's files are the mirror's: the manager that does the work is the local one
    // (LocalCheckpointFileManager, or the user's) on the mirror dir; Spark's paths are mapped both ways.
    this.delegate = createDelegate(mirrored != null ? new Path(sd.dir.toUri()) : path, hadoopConf);
    this.store = sd == null ? null : StoreHooks.of(sd, hadoopConf);
    java.nio.file.Path local = StoreDir.localPathOrNull(path);
    String name = path.getName();
    this.rootOfLog = local != null && (name.equals("offsets") || name.equals("commits"))
        ? local.getParent() : null;
    if (rootOfLog != null && TaskContext.get() == null) DriverHooks.beforeRead(rootOfLog);
  }

  /**
   * The manager that does the work: the class the user had configured (recorded by the plugin in
   * {@link Conf#DELEGATE_FILE_MANAGER}), else {@link LocalCheckpointFileManager} (java.nio for
   * {@code file:}, Spark's own otherwise; {@code spark.statebackend.localCheckpointFileManager}), else
   * exactly the manager Spark would pick.
   */
  static CheckpointFileManager createDelegate(Path path, Configuration hadoopConf) {
    String cls = hadoopConf.get(Conf.DELEGATE_FILE_MANAGER, "").trim();
    if (cls.isEmpty()) cls = Conf.current().delegateFileManagerOrNull();
    if (cls != null && !cls.isEmpty()) {
      if (cls.equals(StateBackendCheckpointFileManager.class.getName())) {
        throw new IllegalArgumentException(Conf.DELEGATE_FILE_MANAGER + " names "
            + StateBackendCheckpointFileManager.class.getName() + " itself");
      }
      try {
        Class<?> c = Class.forName(cls, true, Thread.currentThread().getContextClassLoader());
        Constructor<?> ctor = c.getConstructor(Path.class, Configuration.class);
        return (CheckpointFileManager) ctor.newInstance(path, hadoopConf);
      } catch (InvocationTargetException e) {
        Throwable t = e.getCause();
        throw t instanceof RuntimeException ? (RuntimeException) t : new IllegalStateException(t);
      } catch (ReflectiveOperationException | ClassCastException e) {
        throw new IllegalArgumentException("spark-statebackend: cannot create the checkpoint file manager "
            + cls + " (" + Conf.DELEGATE_FILE_MANAGER + ", the one configured before spark-statebackend): "
            + e, e);
      }
    }
    try {
      if (Conf.current().localCheckpointFileManager()) return new LocalCheckpointFileManager(path, hadoopConf);
      return LocalCheckpointFileManager.sparksOwn(path, hadoopConf);
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  CheckpointFileManager delegate() {
    return delegate;
  }

  private void beforeRead(Path p) {
    if (store != null) {
      store.beforeRead(p);
    } else if (TaskContext.get() == null && "metadata".equals(p.getName()) && p.getParent() != null) {
      java.nio.file.Path parent = StoreDir.localPathOrNull(p.getParent());
      java.nio.file.Path self = StoreDir.localPathOrNull(path);
      if (parent != null && parent.equals(self)) DriverHooks.beforeRead(parent);
    }
  }

  /**
   * {@code p} as the delegate sees it: for a remote store dir, the same file in its mirror ({@code p} is
   * the store dir or below it, as every path Spark's RocksDBFileManager passes); else {@code p}.
   */
  private Path toDelegate(Path p) {
    if (mirrored == null) return p;
    java.nio.file.Path rel = relativeToStoreDir(p);
    return new Path(mirrored.dir.resolve(rel).toUri());
  }

  private java.nio.file.Path relativeToStoreDir(Path p) {
    String dir = java.nio.file.Paths.get(mirrored.remote.toUri().getPath()).normalize().toString();
    String file = p.toUri().getPath() == null ? "" : java.nio.file.Paths.get(p.toUri().getPath()).normalize().toString();
    java.nio.file.Path rel = java.nio.file.Paths.get(dir).relativize(java.nio.file.Paths.get(file));
    if (!RemoteLocations.isRemote(p) || rel.startsWith("..") || rel.isAbsolute()) {
      throw new IllegalArgumentException("spark-statebackend: " + p + " is not in the state store dir "
          + mirrored.remote + " whose files are kept in " + mirrored.dir);
    }
    return rel;
  }

  /** A status of the delegate's (a mirror path) as Spark's path in the remote store dir. */
  private FileStatus fromDelegate(FileStatus s) {
    if (mirrored == null) return s;
    java.nio.file.Path local = java.nio.file.Paths.get(s.getPath().toUri().getPath());
    java.nio.file.Path rel = mirrored.dir.relativize(local);
    try {
      FileStatus out = new FileStatus(s);
      out.setPath(rel.toString().isEmpty() ? mirrored.remote : new Path(mirrored.remote, rel.toString()));
      return out;
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  private FileStatus[] fromDelegate(FileStatus[] all) {
    if (mirrored == null || all == null) return all;
    FileStatus[] out = new FileStatus[all.length];
    for (int i = 0; i < all.length; i++) out[i] = fromDelegate(all[i]);
    return out;
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path target, boolean overwriteIfPossible) {
    CancellableFSDataOutputStream out = delegate.createAtomic(toDelegate(target), overwriteIfPossible);
    if (store != null) return store.onCreate(target, out);
    if (rootOfLog != null && TaskContext.get() == null) {
      return DriverHooks.onLogWrite(rootOfLog, path.getName(), target, out);
    }
    return out;
  }

  @Override
  public FSDataInputStream open(Path p) {
    beforeRead(p);
    return delegate.open(toDelegate(p));
  }

  @Override
  public FileStatus[] list(Path p, PathFilter filter) {
    beforeRead(p);
    return fromDelegate(delegate.list(toDelegate(p), filter));
  }

  @Override
  public FileStatus[] list(Path p) {
    beforeRead(p);
    return fromDelegate(delegate.list(toDelegate(p)));
  }

  @Override
  public void mkdirs(Path p) {
    delegate.mkdirs(toDelegate(p));
  }

  @Override
  public boolean exists(Path p) {
    beforeRead(p);
    return delegate.exists(toDelegate(p));
  }

  @Override
  public void delete(Path p) {
    delegate.delete(toDelegate(p));
  }

  @Override
  public boolean isLocal() {
    return delegate.isLocal();
  }

  /**
   * Spark calls this once per query start, on the user's checkpoint location, before anything reads it:
   * the moment to make a location that is missing, behind or ahead of the latest durable checkpoint
   * resume from that checkpoint (or fail the start saying why).
   */
  @Override
  public Path createCheckpointDirectory() {
    if (TaskContext.get() == null) {
      Path qualified = qualified(path);
      java.nio.file.Path local = StoreDir.localPathOrNull(qualified);
      DriverHooks.beforeQueryStart(qualified, local, hadoopConf);
    }
    return delegate.createCheckpointDirectory();
  }

  private Path qualified(Path p) {
    try {
      org.apache.hadoop.fs.FileSystem fs = p.getFileSystem(hadoopConf);
      return p.makeQualified(fs.getUri(), fs.getWorkingDirectory());
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException("spark-statebackend: cannot resolve the checkpoint location " + p, e);
    }
  }

  @Override
  public void close() {
    delegate.close();
  }
}
