package dev.statebackend.spark;

import java.io.File;
import java.io.FileNotFoundException;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's {@code CheckpointFileManager} for {@code file:} checkpoint locations, on java.nio; any other
 * scheme gets exactly the manager Spark would pick (FileContext-based, else FileSystem-based).
 * It is the default delegate of {@link StateBackendCheckpointFileManager}
 * ({@code spark.statebackend.localCheckpointFileManager}).
 *
 * <p>Why it exists: without Hadoop's native library (pyspark ships none), Hadoop's local file system
 * forks a {@code readlink} process for every {@code getFileLinkStatus} and a {@code chmod} process for
 * every create with a permission. Spark's default manager does several of each per atomic write (the
 * temp file and its {@code .crc}, then a FileContext rename that stats source and target), so writing a
 * 5 KB {@code <v>.zip} on a commit took 70-110 ms of forks from a multi-GB JVM, on the task thread;
 * the driver pays the same for every offsets/commits log entry. Here an atomic write is a temp file
 * in the same directory and one {@code rename(2)} (overwrite) or {@code link(2)} (no overwrite: fails
 * atomically if the target exists, as FileContext's rename does), with no side files.
 *
 * <p>Durability is Spark's: like its local managers this one does not fsync (the blob store is the
 * durable copy). Reads, listings and deletes use Hadoop's RawLocalFileSystem, which forks for none of
 * them; a stale {@code .crc} left by Spark's manager is never consulted because nothing here reads
 * through Hadoop's checksum layer.
 */
public class LocalCheckpointFileManager implements CheckpointFileManager {
  private final Path path;
  private final RawLocalFileSystem fs;             // local locations
  private final CheckpointFileManager delegate;    // everything else

  /** The constructor Spark calls by reflection: {@code (Path, Configuration)}. */
  public LocalCheckpointFileManager(Path path, Configuration hadoopConf) throws IOException {
    this.path = path;
    if (isFileScheme(path, hadoopConf)) {
      RawLocalFileSystem raw = new RawLocalFileSystem();
      raw.initialize(URI.create("file:///"), hadoopConf);
      this.fs = raw;
      this.delegate = null;
    } else {
      this.fs = null;
      this.delegate = sparksOwn(path, hadoopConf);
    }
  }

  /**
   * True if {@code path} is on the {@code file:} scheme: its own scheme, or the default file system's
   * for a path without one. Decided from the URI, not from {@code FileSystem.getScheme()}: many file
   * systems do not implement that (RawLocalFileSystem throws UnsupportedOperationException, which made
   * every checkpoint on a scheme mapped to it fail to load its manager), and a scheme mapped to the
   * local file system through {@code fs.<scheme>.impl} is still not a {@code file:} path to us.
   */
  static boolean isFileScheme(Path path, Configuration hadoopConf) {
    String scheme = path.toUri().getScheme();
    if (scheme == null) scheme = org.apache.hadoop.fs.FileSystem.getDefaultUri(hadoopConf).getScheme();
    return "file".equalsIgnoreCase(scheme);
  }

  /** What CheckpointFileManager.create picks when no class is configured (mirrored, not called: it would read our conf again). */
  static CheckpointFileManager sparksOwn(Path path, Configuration hadoopConf) {
    try {
      return new FileContextBasedCheckpointFileManager(path, hadoopConf);
    } catch (Exception e) {   // Scala throws it undeclared
      if (e instanceof UnsupportedFileSystemException) {
        return new FileSystemBasedCheckpointFileManager(path, hadoopConf);
      }
      throw e instanceof RuntimeException ? (RuntimeException) e : new IllegalStateException(e);
    }
  }

  boolean isNio() {
    return fs != null;
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path target, boolean overwriteIfPossible) {
    if (delegate != null) return delegate.createAtomic(target, overwriteIfPossible);
    File dst = fs.pathToFile(target);
    File tmp = new File(dst.getParentFile(), "." + dst.getName() + "." + UUID.randomUUID() + ".tmp");
    try {
      Files.createDirectories(dst.getParentFile().toPath());
      return new AtomicStream(new FileOutputStream(tmp), tmp, dst, overwriteIfPossible);
    } catch (IOException e) {
      throw new UncheckedIOException("spark-statebackend: cannot create " + tmp + " for " + dst, e);
    }
  }

  @Override
  public FSDataInputStream open(Path p) {
    if (delegate != null) return delegate.open(p);
    try {
      return fs.open(p);
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public FileStatus[] list(Path p, PathFilter filter) {
    if (delegate != null) return delegate.list(p, filter);
    try {
      return fs.listStatus(p, filter);
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public void mkdirs(Path p) {
    if (delegate != null) {
      delegate.mkdirs(p);
      return;
    }
    try {
      Files.createDirectories(fs.pathToFile(p).toPath());
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public boolean exists(Path p) {
    if (delegate != null) return delegate.exists(p);
    return fs.pathToFile(p).exists();
  }

  @Override
  public void delete(Path p) {
    if (delegate != null) {
      delegate.delete(p);
      return;
    }
    try {
      fs.delete(p, true);   // a missing path is not an error (Spark's contract)
    } catch (FileNotFoundException e) {
      // already gone
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public boolean isLocal() {
    return delegate == null || delegate.isLocal();
  }

  @Override
  public Path createCheckpointDirectory() {
    if (delegate != null) return delegate.createCheckpointDirectory();
    Path qualified = fs.makeQualified(path);
    mkdirs(qualified);
    return qualified;
  }

  @Override
  public void close() {
    if (delegate != null) delegate.close();
  }

  /** Spark's managers throw Hadoop's IOExceptions undeclared (Scala); keep their types for its catch blocks. */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> RuntimeException sneaky(Throwable e) throws E {
    throw (E) e;
  }

  /** Writes to the temp file; close() publishes it atomically, cancel() discards it. */
  static final class AtomicStream extends CancellableFSDataOutputStream {
    private final File tmp;
    private final File dst;
    private final boolean overwrite;
    private boolean terminated;

    AtomicStream(FileOutputStream out, File tmp, File dst, boolean overwrite) {
      super(out);
      this.tmp = tmp;
      this.dst = dst;
      this.overwrite = overwrite;
    }

    /**
     * The file being written: written front to back, never rewritten, and moved or linked into place
     * at close as the same inode (what lets the sidecar upload it while it grows, Stager#stream).
     */
    java.nio.file.Path writing() {
      return tmp.toPath();
    }

    @Override
    public synchronized void close() throws IOException {
      if (terminated) return;
      terminated = true;
      try {
        super.close();
        if (overwrite) {
          Files.move(tmp.toPath(), dst.toPath(), StandardCopyOption.ATOMIC_MOVE);
        } else {
          try {
            Files.createLink(dst.toPath(), tmp.toPath());
          } catch (java.nio.file.FileAlreadyExistsException e) {
            throw new FileAlreadyExistsException(dst + " already exists");
          }
        }
      } finally {
        Files.deleteIfExists(tmp.toPath());   // after a link, or after any failure
      }
    }

    @Override
    public synchronized void cancel() {
      if (terminated) return;
      terminated = true;
      try {
        underlyingStream().close();
      } catch (IOException e) {
        // the temp file is discarded anyway
      }
      if (!tmp.delete() && tmp.exists()) {
        throw new UncheckedIOException(new IOException("spark-statebackend: cannot delete " + tmp));
      }
    }
  }
}
