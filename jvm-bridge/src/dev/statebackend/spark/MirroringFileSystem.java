package dev.statebackend.spark;

import java.io.IOException;
import java.net.URI;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FileUtil;
import org.apache.hadoop.fs.FilterFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;

/**
 * The Hadoop file system of a remote scheme ({@code fs.<scheme>.impl}, installed by the plugin for the
 * common remote schemes whose classes exist, the schemes the user configured, and {@code
 * spark.statebackend.remoteSchemes}): the scheme's own file system in every respect but one. The files
 * of a remote location's state store dirs ({@link RemoteLocations#mirrorOf}) are read and written in
 * their local mirror instead.
 *
 * <p>Why this hook: Spark's RocksDBFileManager reaches a store dir through two objects, its checkpoint
 * file manager ({@link StateBackendCheckpointFileManager}, which maps a remote store dir to its mirror)
 * and {@code fs}, {@code new Path(<store dir>).getFileSystem(hadoopConf)}: it copies each SST and log
 * file with {@code fs.copyFromLocalFile} when it saves a version and {@code fs.copyToLocalFile} when it
 * loads one, and without file checksums it reads {@code <v>.zip} with {@code fs.open}. Those three are
 * mapped; a copy into the mirror is a hard link where {@link LinkingLocalFileSystem} would link one
 * ({@code linkSstFiles}), else a local copy. Everything else, including every path that is not in a
 * store dir, passes to the scheme's own file system untouched. Not recorded in a checkpoint: remove the
 * keys and Spark reads and writes the location as before (its state then is the location's own, which
 * the backend's mirrors do not hold: docs/how-it-works.md, "Remote checkpoint locations"; export the
 * state back first, docs/operations.md, "Disabling the backend").
 *
 * <p>The scheme's own file system is the class the user or Hadoop had for it, recorded by the plugin
 * under {@link #originalImplKey} (empty: Hadoop's service loader picks it), obtained through Hadoop's
 * cache with the user's own {@code disable.cache} setting, so it is the instance every other caller
 * shares; {@link #close} therefore leaves it open. This wrapper is not cached ({@code
 * fs.<scheme>.impl.disable.cache=true}, set by the plugin), since Hadoop's cache would otherwise hand
 * whichever instance was created first, ours or a plain one, to every caller.
 */
public class MirroringFileSystem extends FilterFileSystem {
  private RawLocalFileSystem local;
  private String scheme;

  public MirroringFileSystem() {}

  /** The bare Hadoop key recording the class {@code fs.<scheme>.impl} named before the plugin wrapped it. */
  static String originalImplKey(String scheme) {
    return "statebackend.fs." + scheme + ".impl.original";
  }

  /** The bare Hadoop key recording {@code fs.<scheme>.impl.disable.cache} before the plugin set it. */
  static String originalNoCacheKey(String scheme) {
    return "statebackend.fs." + scheme + ".impl.disable.cache.original";
  }

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    scheme = name.getScheme();
    Configuration own = new Configuration(conf);
    restore(own, "fs." + scheme + ".impl", conf.get(originalImplKey(scheme), ""));
    restore(own, "fs." + scheme + ".impl.disable.cache", conf.get(originalNoCacheKey(scheme), ""));
    if (MirroringFileSystem.class.getName().equals(own.get("fs." + scheme + ".impl"))) {
      throw new IOException("spark-statebackend: " + originalImplKey(scheme) + " names "
          + MirroringFileSystem.class.getName() + " itself");
    }
    this.fs = FileSystem.get(name, own);
    super.initialize(name, conf);
    RawLocalFileSystem raw = new RawLocalFileSystem();
    raw.initialize(URI.create("file:///"), conf);
    this.local = raw;
  }

  private static void restore(Configuration conf, String key, String value) {
    if (value.trim().isEmpty()) conf.unset(key); else conf.set(key, value.trim());
  }

  /** The scheme's own file system, which this one wraps (Hadoop's cached instance: never close it). */
  FileSystem own() {
    return fs;
  }

  @Override
  public String getScheme() {
    return scheme;
  }

  @Override
  public FSDataInputStream open(Path f, int bufferSize) throws IOException {
    java.nio.file.Path mirror = RemoteLocations.mirrorOf(qualified(f));
    return mirror == null ? fs.open(f, bufferSize) : local.open(localPath(mirror), bufferSize);
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    copyFromLocalFile(delSrc, true, src, dst);
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, boolean overwrite, Path src, Path dst) throws IOException {
    java.nio.file.Path mirror = RemoteLocations.mirrorOf(qualified(dst));
    if (mirror == null) {
      fs.copyFromLocalFile(delSrc, overwrite, src, dst);
      return;
    }
    Path target = localPath(mirror);
    if (!delSrc && linking() && LinkingLocalFileSystem.linkSst(src, target, true)) return;
    FileUtil.copy(local, src, local, target, delSrc, overwrite, getConf());
  }

  @Override
  public void copyToLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    java.nio.file.Path mirror = RemoteLocations.mirrorOf(qualified(src));
    if (mirror == null) {
      fs.copyToLocalFile(delSrc, src, dst);
      return;
    }
    Path source = localPath(mirror);
    if (!delSrc && linking() && LinkingLocalFileSystem.linkSst(source, dst, false)) return;
    FileUtil.copy(local, source, local, dst, delSrc, true, getConf());
  }

  /** Leaves the scheme's own file system open: it is Hadoop's cached instance, shared with every caller. */
  @Override
  public void close() throws IOException {
    if (local != null) local.close();
  }

  private boolean linking() {
    return Conf.current().linkSstFiles();
  }

  private Path qualified(Path p) {
    return p.toUri().getScheme() != null ? p : fs.makeQualified(p);
  }

  private static Path localPath(java.nio.file.Path p) {
    return new Path(p.toUri());
  }
}
