package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Hadoop file system of {@code file:} checkpoint locations ({@code fs.file.impl}, installed by the
 * plugin when the user has not set one; {@code spark.statebackend.linkSstFiles}): Hadoop's own local
 * file system in every respect but one. The copies Spark's RocksDB state store makes of an SST file
 * between its local working dir and a store dir's {@code SSTs/} are hard links.
 *
 * <p>Why this hook: {@code RocksDBFileManager} moves SSTs with {@code fs.copyFromLocalFile} when it saves a
 * version and {@code fs.copyToLocalFile} when it loads one, where {@code fs} is the checkpoint location's
 * Hadoop file system ({@code new Path(storeDir).getFileSystem(hadoopConf)}), not the checkpoint file
 * manager. On a local location both ends are on one disk, so a load is a full read and write of the state
 * through Hadoop's checksummed stream, one file after another: after our restore has put the files back,
 * Spark would copy them all a second time. An SST is immutable once RocksDB has finished it (Spark itself
 * hard-links them into its local checkpoints, and RocksDB only ever unlinks them), so a link gives Spark
 * exactly the bytes a copy would, in constant time. The scheme's file system is not recorded in a
 * checkpoint: remove the keys and Hadoop's copies come back, with the same files.
 *
 * <p>Linked only when all of these hold, else Hadoop copies as it always did: the source is kept (not a
 * move); the checkpoint side is {@code <store dir>/SSTs/<name>.sst} ({@link StoreDir}); the source is a
 * regular file, not a symlink (a link to a symlink would give Spark a file that points out of the
 * location); it has no Hadoop {@code .crc} beside it (a file Hadoop checksummed keeps its verified copy);
 * the target does not exist (Hadoop's copy overwrites, and may write into a directory); and both are on
 * one file system (a failed link falls back to the copy, logged once per JVM).
 *
 * <p>Spark reaches it through the session's Hadoop conf, where the plugin also sets {@code
 * fs.file.impl.disable.cache}: Hadoop caches one instance per scheme whatever the conf asks for, and the
 * driver creates a plain local file system (the warehouse dir) before any query runs.
 */
public class LinkingLocalFileSystem extends LocalFileSystem {
  private static final Logger LOG = LoggerFactory.getLogger(LinkingLocalFileSystem.class);
  private static final AtomicBoolean WARNED = new AtomicBoolean();
  static final String SSTS = "SSTs";

  @Override
  public void copyFromLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    if (delSrc || !linkSst(src, dst, true)) super.copyFromLocalFile(delSrc, src, dst);
  }

  @Override
  public void copyToLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    if (delSrc || !linkSst(src, dst, false)) super.copyToLocalFile(delSrc, src, dst);
  }

  /**
   * Makes {@code dst} a hard link to {@code src} when the conditions of the class doc hold, the side in
   * the checkpoint location ({@code dst} on a save, {@code src} on a load) being an SST of a store dir.
   * False when they do not, or the link failed: the caller copies then.
   */
  static boolean linkSst(Path src, Path dst, boolean savingToLocation) {
    java.nio.file.Path s = StoreDir.localPathOrNull(src);
    java.nio.file.Path d = StoreDir.localPathOrNull(dst);
    if (s == null || d == null || !isStoreSst(savingToLocation ? d : s)) return false;
    BasicFileAttributes attrs;
    try {
      attrs = Files.readAttributes(s, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
    } catch (IOException e) {
      return false;   // missing or unreadable: Hadoop's copy raises what Spark expects
    }
    if (!attrs.isRegularFile()) return false;
    if (Files.exists(s.resolveSibling("." + s.getFileName() + ".crc"), LinkOption.NOFOLLOW_LINKS)) return false;
    try {
      java.nio.file.Path parent = d.getParent();
      if (parent != null) Files.createDirectories(parent);
      Files.createLink(d, s);   // link(2) refuses an existing name (a file, directory or symlink) atomically
      return true;
    } catch (FileAlreadyExistsException e) {
      return false;   // Hadoop's copy overwrites it (or copies into a directory), as Spark expects
    } catch (IOException | UnsupportedOperationException | SecurityException e) {
      if (WARNED.compareAndSet(false, true)) {
        LOG.warn("spark-statebackend: cannot hard-link {} -> {} ({}); Spark copies its SSTs instead. Put "
            + "spark.local.dir and the checkpoint location on one file system to load and save state "
            + "without copying. (Logged once per JVM.)", s, d, e.toString());
      }
      return false;
    }
  }

  /** {@code <store dir>/SSTs/<name>.sst}: the only files of a store dir that RocksDB never rewrites. */
  static boolean isStoreSst(java.nio.file.Path p) {
    java.nio.file.Path dir = p.getParent();
    if (dir == null || dir.getFileName() == null || !SSTS.equals(dir.getFileName().toString())) return false;
    if (!p.getFileName().toString().endsWith(".sst") || dir.getParent() == null) return false;
    return StoreDir.parse(new Path(dir.getParent().toUri())) != null;
  }
}
