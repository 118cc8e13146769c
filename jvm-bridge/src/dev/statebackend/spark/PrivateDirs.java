package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.FileAttribute;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Directories and files of the spool that only this OS user can read or change.
 *
 * <p>Why it exists: the spool holds the sidecar's configuration (every spark.statebackend.* key,
 * connection strings included), and its requests decide what a sidecar writes and deletes. By default
 * it lives under the shared temporary directory, where any local user could pre-create the path or
 * read a world-readable file. So every directory we create there is 0700 and every file 0600, and a
 * directory on the way that exists already must be a real directory (not a symlink) owned by us and
 * writable by no one else; otherwise we refuse, naming it. Above the spool root, whoever can write to a
 * directory can rename what lies below it and put a directory of theirs in its place after our check,
 * so the root's parent must be ours or root's (also through a symlink) and no directory above the root
 * may be writable by group or others unless it has the sticky bit (as /tmp). Checked once per directory
 * per JVM.
 */
final class PrivateDirs {
  static final FileAttribute<Set<PosixFilePermission>> DIR_0700 =
      PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------"));
  static final FileAttribute<Set<PosixFilePermission>> FILE_0600 =
      PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------"));
  private static final Set<Path> CHECKED = ConcurrentHashMap.newKeySet();
  private static final Set<Path> ABOVE_CHECKED = ConcurrentHashMap.newKeySet();
  private static volatile Integer myUid;

  private PrivateDirs() {}

  /**
   * Makes {@code dir} exist as a private directory: missing components from {@code anchor} down are
   * created 0700; {@code anchor} and every component below it must be ours (see the class doc).
   * {@code dir} must be {@code anchor} or below it.
   */
  static Path ensure(Path anchor, Path dir) throws IOException {
    Path a = anchor.toAbsolutePath().normalize();
    Path d = dir.toAbsolutePath().normalize();
    if (CHECKED.contains(d)) return d;
    if (!d.startsWith(a)) throw new IOException(d + " is not inside the spool root " + a);
    if (a.getParent() != null && !Files.isDirectory(a.getParent())) {
      Files.createDirectories(a.getParent(), DIR_0700);
    }
    checkAbove(a);
    Path p = a;
    for (int i = a.getNameCount(); ; i++) {
      makeOrCheck(p);
      if (i >= d.getNameCount()) break;
      p = p.resolve(d.getName(i));
    }
    CHECKED.add(d);
    return d;
  }

  private static void makeOrCheck(Path p) throws IOException {
    if (CHECKED.contains(p)) return;
    try {
      Files.createDirectory(p, DIR_0700);
      CHECKED.add(p);
      return;
    } catch (FileAlreadyExistsException e) {
      // check what is there
    }
    if (Files.isSymbolicLink(p) || !Files.isDirectory(p, LinkOption.NOFOLLOW_LINKS)) {
      throw new IOException("spark-statebackend: " + p + " is not a directory (a symlink or a file); refusing to "
          + "use it for the spool (spark.statebackend.spoolDir)");
    }
    int owner = (Integer) Files.getAttribute(p, "unix:uid", LinkOption.NOFOLLOW_LINKS);
    int mode = (Integer) Files.getAttribute(p, "unix:mode", LinkOption.NOFOLLOW_LINKS);
    if (owner != uid()) {
      throw new IOException("spark-statebackend: spool directory " + p + " belongs to uid " + owner + ", not to "
          + "this user (uid " + uid() + "); refusing to use it (another local user could read the sidecar's "
          + "configuration or plant requests). Remove it or set spark.statebackend.spoolDir");
    }
    if ((mode & 0022) != 0) {
      throw new IOException("spark-statebackend: spool directory " + p + " is writable by group or others (mode "
          + Integer.toOctalString(mode & 0777) + "); refusing to use it. Make it 0700 or set "
          + "spark.statebackend.spoolDir");
    }
    CHECKED.add(p);
  }

  /** The directories above the spool root {@code root} (see the class doc). */
  private static void checkAbove(Path root) throws IOException {
    if (ABOVE_CHECKED.contains(root)) return;
    Path parent = root.getParent();
    for (Path p = parent; p != null; p = p.getParent()) {
      if (Files.isSymbolicLink(p)) {
        int linkOwner = (Integer) Files.getAttribute(p, "unix:uid", LinkOption.NOFOLLOW_LINKS);
        if (linkOwner != 0 && linkOwner != uid()) {
          throw new IOException("spark-statebackend: " + p + ", above the spool root " + root + ", is a symlink "
              + "of uid " + linkOwner + ", neither root nor this user (uid " + uid() + "): that user decides where "
              + "the spool is. Remove it or set spark.statebackend.spoolDir");
        }
      }
      int owner = (Integer) Files.getAttribute(p, "unix:uid");
      int mode = (Integer) Files.getAttribute(p, "unix:mode");
      if (p.equals(parent) && owner != 0 && owner != uid()) {
        throw new IOException("spark-statebackend: " + p + ", the directory holding the spool root " + root
            + ", belongs to uid " + owner + ", neither root nor this user (uid " + uid() + "): that user could "
            + "replace the spool with a directory of theirs. Remove it or set spark.statebackend.spoolDir");
      }
      if ((mode & 0022) != 0 && (mode & 01000) == 0) {
        throw new IOException("spark-statebackend: " + p + ", above the spool root " + root + ", is writable by "
            + "group or others without the sticky bit (mode " + Integer.toOctalString(mode & 07777) + "): anyone "
            + "could replace the spool below it. Make it 0755 (or 1777) or set spark.statebackend.spoolDir");
      }
    }
    ABOVE_CHECKED.add(root);
  }

  /** This process' uid: the owner of {@code /proc/self} (Linux), else of a file we create. */
  static int uid() throws IOException {
    Integer u = myUid;
    if (u != null) return u;
    Path self = Paths.get("/proc/self");
    if (Files.exists(self)) {
      u = (Integer) Files.getAttribute(self, "unix:uid");
    } else {
      Path probe = Files.createTempFile("ssb-uid", ".probe", FILE_0600);
      try {
        u = (Integer) Files.getAttribute(probe, "unix:uid");
      } finally {
        Files.deleteIfExists(probe);
      }
    }
    myUid = u;
    return u;
  }
}
