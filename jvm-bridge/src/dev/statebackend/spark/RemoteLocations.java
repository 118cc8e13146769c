package dev.statebackend.spark;

import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * Checkpoint locations on a Hadoop scheme other than {@code file:} ({@code s3a://}, {@code abfss://},
 * {@code gs://}, {@code hdfs://}, any Hadoop file system): Spark's own metadata stays in the location,
 * written by Spark, while each state store dir's files ({@code <v>.zip}, {@code <v>.changelog}, {@code
 * SSTs/}, {@code logs/}, their {@code .crc}) live in a local <em>mirror</em> dir on this host and are
 * backed up to the blob store like a {@code file:} location's.
 *
 * <p>Why a mirror: a commit to object storage waits for every upload of the version (Spark's own
 * provider), while the backend's commit is hard links and a spool event; and the backend stages, diffs
 * and restores through local files. The store dir is what Spark's RocksDBFileManager reads and writes
 * through two objects: its checkpoint file manager ({@link StateBackendCheckpointFileManager}, which
 * delegates a remote store dir to a local manager on the mirror) and the location's Hadoop file system
 * ({@link MirroringFileSystem}, for the SST and log copies and the zip read). Both map a remote store
 * dir's paths to the mirror with {@link #mirrorOf}; nothing else of the location is touched.
 *
 * <p>The mirror of a location is {@code <mirrorDir>/<first 32 hex of sha256(location name)>/}, with the
 * store dirs at their relative paths ({@code state/<op>/<part>[/<store>]}), so it is stable per
 * (location, operator, partition, store) on a host and behaves as a {@code file:} location holding only
 * state: staging hard-links within it ({@code _statebackend/staging}), the sidecar restores into it. Its
 * file {@value #LOCATION_FILE} names the location, for operators. Private: 0700 dirs ({@link PrivateDirs}).
 * Every JVM that uses a mirror holds its lock until it exits ({@link MirrorLock}), so that {@link
 * MirrorCleaner} removes only mirrors nobody uses any more.
 */
final class RemoteLocations {
  /** The file in a mirror root naming the remote location it mirrors. */
  static final String LOCATION_FILE = "location";
  /** The dir in a mirror root recording the explicit staging dirs its JVMs staged into, one file each. */
  static final String STAGING_DIRS = "staging-dirs";

  private RemoteLocations() {}

  /** Whether {@code path} names another scheme than {@code file:} (a path without one counts as local). */
  static boolean isRemote(org.apache.hadoop.fs.Path path) {
    String scheme = path.toUri().getScheme();
    return scheme != null && !"file".equalsIgnoreCase(scheme);
  }

  /**
   * The name of a remote location: {@code <scheme>://<authority><normalised path>}, the scheme in lower
   * case, no trailing '/'. The same for every spelling Spark gives one location (its resolved root, the
   * store dirs derived from it), so the mirror and the blob store's locator agree on it.
   */
  static String name(URI location) {
    return name(location.getScheme(), location.getRawAuthority(), location.getPath());
  }

  /** {@link #name(URI)} from a location's parts ({@code authority} may be null). */
  static String name(String scheme, String authority, String path) {
    String p = path == null || path.isEmpty() ? "/" : path;
    String normal = Paths.get(p).normalize().toString();
    return scheme.toLowerCase(java.util.Locale.ROOT) + "://" + (authority == null ? "" : authority)
        + (normal.equals("/") ? "" : normal);
  }

  /** The mirror root of the remote location named {@code locationName} ({@link #name}) on this host. */
  static Path mirrorRoot(Conf conf, String locationName) {
    return conf.mirrorDir().resolve(sha256Hex(locationName).substring(0, 32));
  }

  /**
   * Makes the mirror root of {@code locationName} exist, private, and name its location in {@value
   * #LOCATION_FILE}, and holds its lock until this JVM exits ({@link MirrorLock}: no cleaner removes it
   * meanwhile); returns it. Throws naming the dir when it cannot (a store dir without its mirror could
   * neither commit nor load).
   */
  static Path ensureMirrorRoot(Conf conf, String locationName) {
    Path root = mirrorRoot(conf, locationName);
    if (MirrorLock.heldHere(root)) return root;
    try {
      MirrorLock.hold(root, () -> makeRoot(conf, root, locationName));
    } catch (IOException | RuntimeException e) {
      throw new IllegalStateException("spark-statebackend: cannot create the local mirror " + root + " of "
          + "checkpoint location " + locationName + " (" + Conf.MIRROR_DIR + "): " + e, e);
    }
    return root;
  }

  /** Makes {@code root} exist with its {@value #LOCATION_FILE} file and, if any, its staging dir record. */
  private static void makeRoot(Conf conf, Path root, String locationName) throws IOException {
    ensurePrivateDir(conf, root);
    writeOnce(root.resolve(LOCATION_FILE), locationName);
    recordStagingDir(conf, root);
  }

  private static void ensurePrivateDir(Conf conf, Path dir) throws IOException {
    PrivateDirs.ensure(conf.mirrorDir(), dir);
    if (Files.isDirectory(dir, LinkOption.NOFOLLOW_LINKS)) return;
    // PrivateDirs checks a dir once per JVM: this one was checked, then a cleaner moved its root away
    try {
      Files.createDirectory(dir, PrivateDirs.DIR_0700);
    } catch (java.nio.file.FileAlreadyExistsException e) {
      // another JVM made it again first
    }
  }

  /**
   * With {@code spark.statebackend.stagingDir} set, this root's versions are staged there rather than in
   * its {@code _statebackend/staging}: the root records that dir ({@value #STAGING_DIRS}/), so the cleaner
   * can see uploads still pending for it ({@link MirrorCleaner}).
   */
  private static void recordStagingDir(Conf conf, Path root) throws IOException {
    String explicit = conf.stagingDirOrNull();
    if (explicit == null) return;
    String dir = Paths.get(explicit).toAbsolutePath().normalize().toString();
    Path records = root.resolve(STAGING_DIRS);
    ensurePrivateDir(conf, records);
    writeOnce(records.resolve(sha256Hex(dir).substring(0, 32)), dir);
  }

  /** Writes {@code line} into {@code target} (0600) unless it exists, atomically: a hidden temp file renamed. */
  private static void writeOnce(Path target, String line) throws IOException {
    if (Files.exists(target, LinkOption.NOFOLLOW_LINKS)) return;
    Path tmp = target.resolveSibling("." + target.getFileName() + "." + java.util.UUID.randomUUID() + ".tmp");
    try {
      Files.createFile(tmp, PrivateDirs.FILE_0600);
      Files.write(tmp, (line + "\n").getBytes(StandardCharsets.UTF_8), StandardOpenOption.WRITE);
      Files.move(tmp, target, java.nio.file.StandardCopyOption.ATOMIC_MOVE);
    } finally {
      Files.deleteIfExists(tmp);
    }
  }

  /**
   * The local mirror of {@code file}, a path in a remote location's store dir: {@code <store dir>/<name>}
   * or {@code <store dir>/SSTs|logs/<name>}; null for any other path (Spark's metadata, a local path).
   */
  static Path mirrorOf(org.apache.hadoop.fs.Path file) {
    if (!isRemote(file) || file.getParent() == null) return null;
    org.apache.hadoop.fs.Path parent = file.getParent();
    String dirName = parent.getName();
    if ((LinkingLocalFileSystem.SSTS.equals(dirName) || "logs".equals(dirName)) && parent.getParent() != null) {
      StoreDir sd = StoreDir.parse(parent.getParent());
      if (sd != null) return sd.dir.resolve(dirName).resolve(file.getName());
    }
    StoreDir sd = StoreDir.parse(parent);
    return sd == null ? null : sd.dir.resolve(file.getName());
  }

  /**
   * Copies the files of {@code store}'s dir in its remote location ({@code <v>.zip}, {@code <v>_<id>.zip},
   * {@code <v>.changelog}, {@code SSTs/}, {@code logs/}, their {@code .crc}) that its mirror lacks into
   * the mirror, each under a hidden name and renamed into place; returns how many. For a location Spark
   * wrote before the backend was enabled (or while it was off): Spark then loads its own state from the
   * mirror, and the store's first backup takes it. Directories other than {@code SSTs}/{@code logs}
   * (Spark's {@code _metadata}, other stores' dirs) are not state of this store and stay where they are.
   */
  static int importFromLocation(StoreDir store, org.apache.hadoop.conf.Configuration hadoopConf) throws IOException {
    org.apache.hadoop.fs.FileSystem fs = store.remote.getFileSystem(hadoopConf);
    if (fs instanceof MirroringFileSystem) fs = ((MirroringFileSystem) fs).own();
    return copyMissing(fs, store.remote, store.dir, true);
  }

  private static int copyMissing(org.apache.hadoop.fs.FileSystem fs, org.apache.hadoop.fs.Path from, Path into,
      boolean top) throws IOException {
    org.apache.hadoop.fs.FileStatus[] all;
    try {
      all = fs.listStatus(from);
    } catch (java.io.FileNotFoundException e) {
      return 0;
    }
    int copied = 0;
    for (org.apache.hadoop.fs.FileStatus s : all) {
      String name = s.getPath().getName();
      if (name.isEmpty() || name.equals(".") || name.equals("..") || name.startsWith(".")) continue;
      Path target = into.resolve(name);
      if (s.isDirectory()) {
        if (top && (LinkingLocalFileSystem.SSTS.equals(name) || "logs".equals(name))) {
          copied += copyMissing(fs, s.getPath(), target, false);
        }
        continue;
      }
      if (Files.exists(target, LinkOption.NOFOLLOW_LINKS)) continue;
      Files.createDirectories(into);
      Path tmp = into.resolve("." + name + ".import-" + java.util.UUID.randomUUID() + ".tmp");
      try (java.io.InputStream in = fs.open(s.getPath())) {
        Files.copy(in, tmp);
        Files.move(tmp, target, java.nio.file.StandardCopyOption.ATOMIC_MOVE);
      } finally {
        Files.deleteIfExists(tmp);
      }
      copied++;
    }
    return copied;
  }

  private static String sha256Hex(String s) {
    try {
      byte[] d = MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8));
      StringBuilder b = new StringBuilder(d.length * 2);
      for (byte x : d) b.append(String.format("%02x", x));
      return b.toString();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);   // every JVM has SHA-256
    }
  }
}
