package dev.statebackend.spark;

import java.io.Closeable;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.OverlappingFileLockException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.OpenOption;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.FileTime;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The lock that keeps a mirror root ({@link RemoteLocations}) from being cleaned up while a JVM on this
 * host uses it.
 *
 * <p>Why it exists: {@link MirrorCleaner} removes mirrors nobody uses any more, and the one sure sign of
 * use is a live process. Every JVM takes a shared OS lock ({@code FileChannel.lock}, shared: a POSIX
 * {@code fcntl} read lock on Linux) on {@value #FILE} in a mirror root at its first use of the root and
 * holds it until it exits; the cleaner takes the exclusive lock with {@code tryLock}. A running
 * executor's or driver's mirror is therefore never touched, and a dead JVM's lock went with its process.
 * Each holder stamps the file's mtime when it takes the lock: the root's last use, which the cleaner's
 * retention counts from.
 *
 * <p>Two properties of fcntl locks shape the code. They belong to the process, and closing any
 * descriptor of the file drops all of them (the JDK's own too: {@code Files.setLastModifiedTime} opens
 * and closes one): so in one JVM every lock operation on these files runs under {@link #MONITOR}, a
 * held lock file is never opened again, and the cleaner never opens the lock file of a root this JVM
 * holds. And a holder waiting for
 * the shared lock while a cleaner moves the root away would get the lock of the moved file: the cleaner
 * writes {@link #REMOVED} into the file before it moves the root, and a holder that finds it there lets
 * go and makes the root again.
 */
final class MirrorLock {
  /** The lock file in a mirror root. */
  static final String FILE = "mirror.lock";
  /** What the cleaner writes into the lock file of a root it moves away; a used root's file is empty. */
  private static final byte[] REMOVED = "removed\n".getBytes(StandardCharsets.US_ASCII);
  /** How often a holder makes the root again after a cleaner moved it away, before giving up. */
  private static final int ATTEMPTS = 3;
  /** Serialises this JVM's lock operations on mirror lock files (see the class doc). */
  static final ReentrantLock MONITOR = new ReentrantLock();
  /** Roots this JVM holds; their channels stay open (and locked) until the JVM exits. */
  private static final Map<Path, FileChannel> HELD = new ConcurrentHashMap<>();
  private static final Set<OpenOption> HOLDER_OPEN = Set.of(StandardOpenOption.CREATE, StandardOpenOption.READ,
      StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS);

  private MirrorLock() {}

  /** Something that makes a mirror root exist (dirs and its {@code location} file). */
  interface Maker {
    void make() throws IOException;
  }

  /** Whether this JVM holds {@code root}'s shared lock. */
  static boolean heldHere(Path root) {
    return HELD.containsKey(root);
  }

  /**
   * Takes this JVM's shared lock on {@code root} unless it holds it already: {@code maker} makes the root
   * exist first, and again if a cleaner moved it away meanwhile. Waits while a cleaner holds the exclusive
   * lock (a few file operations). Throws naming the root when it cannot.
   */
  static void hold(Path root, Maker maker) throws IOException {
    if (HELD.containsKey(root)) return;
    MONITOR.lock();
    try {
      if (HELD.containsKey(root)) return;
      for (int attempt = 1; ; attempt++) {
        maker.make();
        FileChannel ch = lockShared(root.resolve(FILE));
        if (ch != null) {
          HELD.put(root, ch);
          return;
        }
        if (attempt >= ATTEMPTS) {
          throw new IOException("the mirror " + root + " was removed by a cleaner " + ATTEMPTS + " times while "
              + "this JVM was taking its lock " + root.resolve(FILE));
        }
      }
    } finally {
      MONITOR.unlock();
    }
  }

  /** The shared lock on {@code file}, stamped; null if the root was moved away (by a cleaner) meanwhile. */
  private static FileChannel lockShared(Path file) throws IOException {
    FileChannel ch;
    try {
      ch = FileChannel.open(file, HOLDER_OPEN, PrivateDirs.FILE_0600);
    } catch (NoSuchFileException e) {
      return null;   // the root went between making it and opening its lock file
    }
    boolean held = false;
    try {
      // Stamped before the lock is taken: the JDK sets times through a descriptor of its own, and its
      // close would drop this process' locks on the file (class doc). A cleaner that reads the stamp
      // after this keeps the root; one that read it before and moves the root, we learn of below.
      Files.setLastModifiedTime(file, FileTime.fromMillis(System.currentTimeMillis()));
      ch.lock(0, Long.MAX_VALUE, true);
      if (ch.size() > 0) return null;   // a cleaner moved this root away while we waited (class doc)
      held = true;
      return ch;
    } finally {
      if (!held) ch.close();
    }
  }

  /**
   * For the cleaner: the exclusive lock of {@code root} if no JVM holds the root (neither this one nor
   * another), else null. {@code lockFileExisted}: whether the cleaner saw {@value #FILE} when it looked
   * at the root; if it did not, the file must still be missing (a JVM that made it since has used the
   * root: null). The returned lock must be closed; while it is open this JVM takes no other mirror lock.
   */
  static Exclusive tryExclusive(Path root, boolean lockFileExisted) throws IOException {
    MONITOR.lock();
    FileChannel ch = null;
    Exclusive taken = null;
    try {
      if (HELD.containsKey(root)) return null;
      ch = openForCleaner(root.resolve(FILE), lockFileExisted);
      if (ch == null) return null;
      FileLock lock;
      try {
        lock = ch.tryLock(0, Long.MAX_VALUE, false);
      } catch (OverlappingFileLockException e) {
        lock = null;   // not reached while HELD is checked under MONITOR; in use either way
      }
      if (lock == null) return null;
      taken = new Exclusive(root, ch, lock);
      return taken;
    } finally {
      if (taken == null) {
        try {
          if (ch != null) ch.close();
        } finally {
          MONITOR.unlock();   // an Exclusive releases it at its close
        }
      }
    }
  }

  /** The lock file opened for the cleaner, or null if it was made or removed since the cleaner looked. */
  private static FileChannel openForCleaner(Path file, boolean existed) throws IOException {
    try {
      if (existed) {
        return FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS);
      }
      FileChannel ch = FileChannel.open(file, Set.of(StandardOpenOption.CREATE_NEW, StandardOpenOption.READ,
          StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS), PrivateDirs.FILE_0600);
      try {
        // Its mtime says when a JVM last used the root; the cleaner making it is no use (a root it keeps
        // must not look young for a whole retention). No lock of this JVM is on the file yet.
        Files.setLastModifiedTime(file, FileTime.fromMillis(0));
      } catch (IOException | RuntimeException e) {
        ch.close();
        throw e;
      }
      return ch;
    } catch (FileAlreadyExistsException | NoSuchFileException e) {
      return null;   // a JVM made it since (it used the root), or the root went
    }
  }

  /** The cleaner's exclusive lock on one root; closing it releases the lock and this JVM's monitor. */
  static final class Exclusive implements Closeable {
    private final Path root;
    private final FileChannel channel;
    private final FileLock lock;

    private Exclusive(Path root, FileChannel channel, FileLock lock) {
      this.root = root;
      this.channel = channel;
      this.lock = lock;
    }

    /**
     * Marks the lock file (a JVM that waited for this lock then makes the root again) and moves the root
     * to {@code to} in one rename; on failure the mark is taken back and the root stays as it was.
     */
    void moveRootTo(Path to) throws IOException {
      channel.write(ByteBuffer.wrap(REMOVED), 0);
      channel.force(false);
      try {
        Files.move(root, to, StandardCopyOption.ATOMIC_MOVE);
      } catch (IOException | RuntimeException e) {
        channel.truncate(0);
        throw e;
      }
    }

    @Override
    public void close() throws IOException {
      try {
        lock.release();
        channel.close();
      } finally {
        MONITOR.unlock();
      }
    }
  }
}
