package ssbtest;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.nio.file.Paths;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FileUtil;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * A Hadoop file system for tests that behaves like an object store: scheme {@code objfs}, {@code
 * objfs://<bucket>/<key>} kept as the file {@code <fs.objfs.root>/<bucket>/<key>}, registered with
 * {@code fs.objfs.impl=ssbtest.ObjectStoreFileSystem}. Like S3A: no hard links, no append, and rename
 * is a copy then a delete (not atomic; it refuses an existing target file); it has no
 * AbstractFileSystem, so Spark's checkpoint file manager for it is its FileSystem-based one. Every
 * write (create) is counted in {@link #CREATES} and logged on stderr as {@code OBJFS create <path>}, so
 * a test can tell what reached the "remote" store.
 */
public class ObjectStoreFileSystem extends FileSystem {
  public static final AtomicLong CREATES = new AtomicLong();
  private URI uri;
  private java.nio.file.Path base;
  private RawLocalFileSystem local;
  private Path workingDir;

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    String root = conf.get("fs.objfs.root");
    if (root == null || root.isEmpty()) throw new IOException("fs.objfs.root is not set");
    uri = URI.create("objfs://" + name.getAuthority());
    base = Paths.get(root).resolve(name.getAuthority()).toAbsolutePath();
    local = new RawLocalFileSystem();
    local.initialize(URI.create("file:///"), conf);
    workingDir = new Path(uri.toString() + "/");
    setConf(conf);
  }

  @Override
  public String getScheme() {
    return "objfs";
  }

  @Override
  public URI getUri() {
    return uri;
  }

  private Path toLocal(Path p) {
    String key = makeQualified(p).toUri().getPath();
    return new Path(base.resolve(key.startsWith("/") ? key.substring(1) : key).toUri());
  }

  private Path fromLocal(Path p) {
    String rel = base.relativize(Paths.get(p.toUri().getPath())).toString();
    return new Path(uri.toString() + "/" + rel);
  }

  private FileStatus fromLocal(FileStatus s) {
    return new FileStatus(s.getLen(), s.isDirectory(), 1, s.getBlockSize(), s.getModificationTime(),
        fromLocal(s.getPath()));
  }

  @Override
  public FSDataInputStream open(Path f, int bufferSize) throws IOException {
    return local.open(toLocal(f), bufferSize);
  }

  @Override
  public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite, int bufferSize,
      short replication, long blockSize, Progressable progress) throws IOException {
    CREATES.incrementAndGet();
    System.err.println("OBJFS create " + makeQualified(f));
    return local.create(toLocal(f), permission, overwrite, bufferSize, replication, blockSize, progress);
  }

  @Override
  public FSDataOutputStream append(Path f, int bufferSize, Progressable progress) throws IOException {
    throw new UnsupportedOperationException("objfs: no append (an object store)");
  }

  /**
   * Not atomic, as S3's: each object is copied to the target (an object appears whole, as a PUT or COPY
   * does), then the source is deleted, so both exist for a while, and a directory is renamed object by
   * object. An existing target file is refused (false).
   */
  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    Path s = toLocal(src);
    Path d = toLocal(dst);
    if (!local.exists(s)) return false;
    if (local.exists(d)) {
      if (local.getFileStatus(d).isFile()) return false;
      d = new Path(d, s.getName());
    }
    copyObjects(s, d);
    return local.delete(s, true);
  }

  private void copyObjects(Path s, Path d) throws IOException {
    if (local.getFileStatus(s).isDirectory()) {
      local.mkdirs(d);
      for (FileStatus child : local.listStatus(s)) copyObjects(child.getPath(), new Path(d, child.getPath().getName()));
      return;
    }
    Path part = new Path(d.getParent(), "." + d.getName() + ".objfs-put");
    FileUtil.copy(local, s, local, part, false, true, getConf());
    if (!local.rename(part, d)) throw new IOException("objfs: cannot put " + d);
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    return local.delete(toLocal(f), recursive);
  }

  @Override
  public FileStatus[] listStatus(Path f) throws IOException {
    FileStatus[] all = local.listStatus(toLocal(f));
    FileStatus[] out = new FileStatus[all.length];
    for (int i = 0; i < all.length; i++) out[i] = fromLocal(all[i]);
    return out;
  }

  @Override
  public void setWorkingDirectory(Path newDir) {
    workingDir = makeQualified(newDir);
  }

  @Override
  public Path getWorkingDirectory() {
    return workingDir;
  }

  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    return local.mkdirs(toLocal(f), permission);
  }

  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    try {
      return fromLocal(local.getFileStatus(toLocal(f)));
    } catch (FileNotFoundException e) {
      throw new FileNotFoundException("objfs: " + f + " not found");
    }
  }
}
