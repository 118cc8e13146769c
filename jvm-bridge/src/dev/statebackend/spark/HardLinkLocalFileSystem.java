package dev.statebackend.spark;

import java.io.File;
import java.io.IOException;
import java.net.URI;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;

/**
 * The file system {@link HookedFileManager} hands to Spark's RocksDBFileManager when the checkpoint
 * location is local: Spark's synchronous SST "upload" ({@code FileSystem.copyFromLocalFile}) and
 * "download" ({@code copyToLocalFile}) become hard links, so a commit copies and fsyncs no SST data.
 *
 * <p>Why it is safe: RocksDB SST files are immutable once written and Spark's DFS names are unique per
 * upload, so sharing an inode between the live DB, the checkpoint location and the staging dir never
 * lets one of them see another's writes. Hooks (Hadoop) {@code FileSystem.copyFromLocalFile(boolean,
 * boolean, Path, Path)} and {@code copyToLocalFile(boolean, Path, Path, boolean)}, which the two-argument
 * forms Spark calls delegate to. It extends RawLocalFileSystem, so it writes no {@code .crc} side files
 * (Hadoop reads files without them fine).
 */
public class HardLinkLocalFileSystem extends RawLocalFileSystem {

  /** A ready instance for {@code file:} paths. */
  static HardLinkLocalFileSystem create(Configuration hadoopConf) throws IOException {
    HardLinkLocalFileSystem fs = new HardLinkLocalFileSystem();
    fs.initialize(URI.create("file:///"), hadoopConf);
    return fs;
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, boolean overwrite, Path src, Path dst) throws IOException {
    File s = pathToFile(src);
    if (!s.isFile()) {   // directories and odd inputs: Hadoop's own semantics
      super.copyFromLocalFile(delSrc, overwrite, src, dst);
      return;
    }
    File d = pathToFile(dst);
    if (d.isDirectory()) d = new File(d, s.getName());
    HardLinks.linkOrCopy(s.toPath(), d.toPath(), overwrite);
    if (delSrc && !s.delete()) throw new IOException("could not delete source " + s + " after linking");
  }

  @Override
  public void copyToLocalFile(boolean delSrc, Path src, Path dst, boolean useRawLocalFileSystem)
      throws IOException {
    File s = pathToFile(src);
    if (!s.isFile()) {
      super.copyToLocalFile(delSrc, src, dst, useRawLocalFileSystem);
      return;
    }
    File d = pathToFile(dst);
    if (d.isDirectory()) d = new File(d, s.getName());
    HardLinks.linkOrCopy(s.toPath(), d.toPath(), true);
    if (delSrc && !s.delete()) throw new IOException("could not delete source " + s + " after linking");
  }
}
