package dev.statebackend.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.FileVisitResult;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.SimpleFileVisitor;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Pattern;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Removes the mirrors of remote checkpoint locations ({@link RemoteLocations}) that nobody on this host
 * uses any more, so a host's disk does not fill with the state of queries that moved away, ended or were
 * deleted.
 *
 * <p>Why it can never lose state: a mirror root is removed only when
 * <ol>
 *   <li>no live JVM uses it: each JVM holds a shared lock on it from its first use until it exits and
 *   this takes the exclusive one with tryLock ({@link MirrorLock});</li>
 *   <li>no JVM has used it for {@code spark.statebackend.mirrorRetention}: no file in it is younger,
 *   the lock file's stamp of its last holder included;</li>
 *   <li>nothing in it waits for an upload (see {@link #pendingUpload}).</li>
 * </ol>
 * (2) and (3) are checked before the lock and the quick ones again under it; the root is then moved
 * to a hidden tombstone in one rename, and the tombstone deleted without following a symlink and
 * without leaving it. Anything kept is logged at INFO with why, what is removed at INFO with the
 * location's name and the bytes, failures at WARN; nothing here ever fails a query.
 *
 * <p>It runs once per JVM at plugin start, driver and executors alike (each for its own host), on a
 * daemon thread, within {@link #BUDGET_MS}: what is left is the next start's.
 */
final class MirrorCleaner {
  private static final Logger LOG = LoggerFactory.getLogger(MirrorCleaner.class);
  static final String THREAD_NAME = "statebackend-mirror-clean";
  /** One run's time budget: a start's cleanup must stay small beside the work the JVM came for. */
  static final long BUDGET_MS = 5 * 60 * 1000L;
  /** A root moved away to be deleted; one a crash left is deleted at the next run. */
  static final String TOMBSTONE_PREFIX = ".removing-";
  private static final Pattern ROOT_NAME = Pattern.compile("[0-9a-f]{32}");
  private static final int MAX_LOCATION_BYTES = 4096;
  private static final AtomicBoolean STARTED = new AtomicBoolean();

  private MirrorCleaner() {}

  /** {@link #clean} of this JVM's mirror dir on a daemon thread, the first time it is called in the JVM. */
  static void startOnce(Conf conf) {
    if (!STARTED.compareAndSet(false, true)) return;
    Path mirrorDir = conf.mirrorDir();
    long retentionMs = conf.mirrorRetentionMs();
    Thread t = new Thread(() -> clean(mirrorDir, retentionMs, System.currentTimeMillis() + BUDGET_MS), THREAD_NAME);
    t.setDaemon(true);
    t.start();
  }

  /**
   * Removes every mirror root under {@code mirrorDir} that may go (class doc) until {@code deadline}
   * (epoch ms); never throws.
   */
  static void clean(Path mirrorDir, long retentionMs, long deadline) {
    try {
      if (!Files.isDirectory(mirrorDir, LinkOption.NOFOLLOW_LINKS)) return;
      PrivateDirs.ensure(mirrorDir, mirrorDir);   // a dir others could change under us is left alone
      Tally tally = new Tally();
      try (DirectoryStream<Path> entries = Files.newDirectoryStream(mirrorDir)) {
        for (Path entry : entries) {
          if (System.currentTimeMillis() > deadline) {
            LOG.info("spark-statebackend: mirror cleanup of {} stopped after {} ms; the next start goes on",
                mirrorDir, BUDGET_MS);
            break;
          }
          visit(entry, mirrorDir, System.currentTimeMillis() - retentionMs, deadline, tally);
        }
      }
      LOG.info("spark-statebackend: mirror cleanup of {}: {} mirror(s) removed ({} bytes), {} kept", mirrorDir,
          tally.removed, tally.bytes, tally.kept);
    } catch (IOException | RuntimeException e) {
      LOG.warn("spark-statebackend: could not clean up the mirrors under {} ({}): {}", mirrorDir,
          Conf.MIRROR_DIR, e.toString());
    }
  }

  /** What one run did. */
  private static final class Tally {
    int removed;
    int kept;
    long bytes;
  }

  private static void visit(Path entry, Path mirrorDir, long cutoff, long deadline, Tally tally) {
    String name = entry.getFileName().toString();
    try {
      if (name.startsWith(TOMBSTONE_PREFIX) && Files.isDirectory(entry, LinkOption.NOFOLLOW_LINKS)) {
        deleteTree(entry, deadline);   // a run before this one was stopped while deleting it
      } else if (ROOT_NAME.matcher(name).matches()) {
        long bytes = cleanRoot(entry, mirrorDir, cutoff, deadline);
        if (bytes >= 0) {
          tally.removed++;
          tally.bytes += bytes;
        } else {
          tally.kept++;
        }
      }
    } catch (IOException | RuntimeException e) {
      LOG.warn("spark-statebackend: could not clean up the mirror {}: {}", entry, e.toString());
    }
  }

  /** Removes {@code root} if it may go; returns the bytes removed, or -1 when it is kept (logged why). */
  private static long cleanRoot(Path root, Path mirrorDir, long cutoff, long deadline) throws IOException {
    if (!Files.isDirectory(root, LinkOption.NOFOLLOW_LINKS)) {
      LOG.info("spark-statebackend: {} is not a mirror directory (a symlink or a file); left as it is", root);
      return -1;
    }
    String location = locationName(root);
    Path lockFile = root.resolve(MirrorLock.FILE);
    boolean lockFileExisted = Files.exists(lockFile, LinkOption.NOFOLLOW_LINKS);
    long lastUse = newestFileMtime(root, deadline);
    if (lastUse >= cutoff) return kept(root, location, "used within " + Conf.MIRROR_RETENTION + " (last "
        + java.time.Instant.ofEpochMilli(lastUse) + ")");
    String pending = pendingUpload(root);
    if (pending != null) return kept(root, location, pending);
    Path tombstone = mirrorDir.resolve(TOMBSTONE_PREFIX + root.getFileName() + "-" + UUID.randomUUID());
    try (MirrorLock.Exclusive x = MirrorLock.tryExclusive(root, lockFileExisted)) {
      if (x == null) return kept(root, location, "in use by a running process on this host");
      // Quick checks again under the lock: a JVM that used the root since the look above stamped the lock
      // file; staging may have changed.
      if (lockFileExisted && Files.getLastModifiedTime(lockFile, LinkOption.NOFOLLOW_LINKS).toMillis() >= cutoff) {
        return kept(root, location, "used a moment ago");
      }
      pending = pendingUpload(root);
      if (pending != null) return kept(root, location, pending);
      x.moveRootTo(tombstone);
    }
    long bytes = deleteTree(tombstone, deadline);
    LOG.info("spark-statebackend: removed the mirror {} of checkpoint location {} ({} bytes): unused on this "
        + "host for longer than {}, nothing waiting for an upload; its state is in the blob store", root,
        location, bytes, Conf.MIRROR_RETENTION);
    return bytes;
  }

  private static long kept(Path root, String location, String why) {
    LOG.info("spark-statebackend: mirror {} of checkpoint location {} kept: {}", root, location, why);
    return -1;
  }

  /**
   * Why {@code root} may hold state the blob store lacks, or null: a staged version not yet uploaded.
   * The sidecar deletes a version's staged links only after its upload and report ([C4]), so anything
   * under the root's {@code _statebackend/staging} is pending. That matters most with {@code
   * durableCommit=false}: Spark has committed the version and moved on while its upload is still to come
   * (from a sidecar restarted for the same executor, or never), and on a remote location no checkpoint
   * gates the next batch, so the mirror is then the only copy. Staging there is not all: with {@code
   * stagingDir} set, versions are staged in that dir, whose layout does not name the location, and the
   * sidecar drops an event whose checkpoint root (this mirror) is gone. So the root also keeps while any
   * staging dir its JVMs recorded ({@link RemoteLocations#STAGING_DIRS}) holds anything. A path that
   * cannot be read counts as pending.
   */
  static String pendingUpload(Path root) {
    Path staging = root.resolve("_statebackend").resolve("staging");
    if (holdsAFile(staging)) return "staged versions wait for their upload in " + staging;
    Path records = root.resolve(RemoteLocations.STAGING_DIRS);
    if (!Files.exists(records, LinkOption.NOFOLLOW_LINKS)) return null;
    try (DirectoryStream<Path> all = Files.newDirectoryStream(records)) {
      for (Path record : all) {
        if (record.getFileName().toString().startsWith(".")) continue;   // a record being written
        Path dir = Paths.get(readSmall(record));
        if (!Files.exists(dir)) continue;
        // The configured path may pass through a link of the user's; below it nothing is followed.
        if (holdsAFile(dir.toRealPath())) {
          return "the staging dir " + dir + " (" + Conf.STAGING_DIR + " of an application that used it) holds "
              + "staged versions waiting for their upload";
        }
      }
    } catch (IOException | RuntimeException e) {
      return "cannot read " + records + " (" + e + ")";
    }
    return null;
  }

  /** Whether {@code dir} (not followed if a symlink) holds anything but directories; unreadable: true. */
  private static boolean holdsAFile(Path dir) {
    if (!Files.exists(dir, LinkOption.NOFOLLOW_LINKS)) return false;
    boolean[] found = {false};
    try {
      Files.walkFileTree(dir, new SimpleFileVisitor<Path>() {
        @Override
        public FileVisitResult visitFile(Path file, BasicFileAttributes attrs) {
          found[0] = true;
          return FileVisitResult.TERMINATE;
        }
      });
    } catch (IOException e) {
      return true;
    }
    return found[0];
  }

  /**
   * The newest mtime of a non-directory below {@code root} (a directory's changes with every entry added
   * or removed, the cleaner's own included). Past {@code deadline}, or unreadable: now (kept).
   */
  private static long newestFileMtime(Path root, long deadline) {
    long[] newest = {0L};
    try {
      Files.walkFileTree(root, new SimpleFileVisitor<Path>() {
        @Override
        public FileVisitResult visitFile(Path file, BasicFileAttributes attrs) {
          newest[0] = Math.max(newest[0], attrs.lastModifiedTime().toMillis());
          return System.currentTimeMillis() > deadline ? FileVisitResult.TERMINATE : FileVisitResult.CONTINUE;
        }
      });
    } catch (IOException e) {
      return System.currentTimeMillis();
    }
    return System.currentTimeMillis() > deadline ? System.currentTimeMillis() : newest[0];
  }

  /**
   * Deletes {@code top} and everything below it; returns the bytes of the regular files deleted. Never
   * follows a symlink (a link is deleted, its target never visited) and never deletes a path outside
   * {@code top}. Stops at {@code deadline}; failures are logged and skipped.
   */
  static long deleteTree(Path top, long deadline) throws IOException {
    Path base = top.toAbsolutePath().normalize();
    long[] bytes = {0L};
    Files.walkFileTree(base, new SimpleFileVisitor<Path>() {
      @Override
      public FileVisitResult visitFile(Path file, BasicFileAttributes attrs) {
        if (delete(base, file)) bytes[0] += attrs.isRegularFile() ? attrs.size() : 0;
        return System.currentTimeMillis() > deadline ? FileVisitResult.TERMINATE : FileVisitResult.CONTINUE;
      }

      @Override
      public FileVisitResult visitFileFailed(Path file, IOException e) {
        LOG.warn("spark-statebackend: could not delete {}: {}", file, e.toString());
        return FileVisitResult.CONTINUE;
      }

      @Override
      public FileVisitResult postVisitDirectory(Path dir, IOException e) {
        delete(base, dir);
        return System.currentTimeMillis() > deadline ? FileVisitResult.TERMINATE : FileVisitResult.CONTINUE;
      }
    });
    return bytes[0];
  }

  private static boolean delete(Path base, Path p) {
    Path n = p.toAbsolutePath().normalize();
    if (!n.startsWith(base)) {
      LOG.warn("spark-statebackend: not deleting {}: outside the mirror {} being removed", p, base);
      return false;
    }
    try {
      Files.delete(n);   // a symlink itself, never its target
      return true;
    } catch (IOException e) {
      LOG.warn("spark-statebackend: could not delete {}: {}", p, e.toString());
      return false;
    }
  }

  /** The location a root names in its {@code location} file, or a placeholder. */
  private static String locationName(Path root) {
    try {
      return readSmall(root.resolve(RemoteLocations.LOCATION_FILE));
    } catch (IOException | RuntimeException e) {
      return "<unknown: " + e.getClass().getSimpleName() + ">";
    }
  }

  /** A small regular file's text, trimmed; throws for a symlink, anything else, or a large file. */
  private static String readSmall(Path file) throws IOException {
    BasicFileAttributes a = Files.readAttributes(file, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
    if (!a.isRegularFile() || a.size() > MAX_LOCATION_BYTES) {
      throw new IOException(file + " is not a small regular file");
    }
    return new String(Files.readAllBytes(file), StandardCharsets.UTF_8).trim();
  }
}
