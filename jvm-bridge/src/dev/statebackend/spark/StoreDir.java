package dev.statebackend.spark;

import java.net.URI;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One state store instance's directory in a query's checkpoint location, recognised from its path:
 * {@code <checkpoint root>/state/<operator>/<partition>[/<store name>]}.
 *
 * <p>Why it exists: Spark's RocksDBFileManager creates its CheckpointFileManager with exactly this
 * directory ({@code StateStoreId.storeCheckpointLocation}: the store name is omitted for the default
 * store), and that manager is the one object of ours every store's commits and loads pass through. The
 * path is all it is given, so the operator, partition, store and the query's checkpoint root are parsed
 * from it. Other managers Spark creates under {@code state/} (the operator metadata dir {@code
 * state/<op>}, the schema file {@code state/<op>/<part>/_metadata/schema}, {@code _stateSchema}) do not
 * match: their last component is not a partition number or starts with {@code _}.
 */
final class StoreDir {
  static final String DEFAULT_STORE = "default";
  private static final Pattern NUMBER = Pattern.compile("0|[1-9][0-9]{0,18}");

  final Path root;
  final Path dir;
  final long operator;
  final int partition;
  final String store;
  /** The store dir in a remote location, whose mirror {@link #dir} is; null for a local store dir. */
  final org.apache.hadoop.fs.Path remote;

  private StoreDir(Path root, Path dir, long operator, int partition, String store, org.apache.hadoop.fs.Path remote) {
    this.root = root;
    this.dir = dir;
    this.operator = operator;
    this.partition = partition;
    this.store = store;
    this.remote = remote;
  }

  /**
   * The store dir a path names, or null if it names none. A local path ({@code file:} or no scheme) is
   * the store dir itself; a path on another scheme (a remote location, {@link RemoteLocations}) gives the
   * store dir of its local mirror, the same operator, partition and store, with the mirror root as its
   * {@link #root} and the remote dir as {@link #remote}.
   */
  static StoreDir parse(org.apache.hadoop.fs.Path path) {
    Path p = localPathOrNull(path);
    if (p != null) return match(p, null);
    if (!RemoteLocations.isRemote(path)) return null;
    String uriPath = path.toUri().getPath();
    if (uriPath == null || uriPath.isEmpty()) return null;
    return match(Paths.get(uriPath).normalize(), path);
  }

  /** Matches {@code p} against Spark's store dir layout; {@code remote}: the remote dir {@code p} is the path of. */
  private static StoreDir match(Path p, org.apache.hadoop.fs.Path remote) {
    int n = p.getNameCount();
    // .../state/<op>/<part>
    if (n >= 4 && "state".equals(name(p, n - 3)) && isNumber(name(p, n - 2)) && isNumber(name(p, n - 1))) {
      return of(p, n - 3, name(p, n - 2), name(p, n - 1), DEFAULT_STORE, remote);
    }
    // .../state/<op>/<part>/<store>
    if (n >= 5 && "state".equals(name(p, n - 4)) && isNumber(name(p, n - 3)) && isNumber(name(p, n - 2))
        && isStoreName(name(p, n - 1))) {
      return of(p, n - 4, name(p, n - 3), name(p, n - 2), name(p, n - 1), remote);
    }
    return null;
  }

  /** {@code p}'s components from {@code stateAt} on are {@code state/<op>/<part>[/<store>]}. */
  private static StoreDir of(Path p, int stateAt, String op, String part, String store,
      org.apache.hadoop.fs.Path remote) {
    long operator;
    int partition;
    try {
      operator = Long.parseLong(op);
      partition = Integer.parseInt(part);
    } catch (NumberFormatException e) {
      return null;   // a partition number beyond int: not one of Spark's
    }
    Path rootRel = p.subpath(0, stateAt);
    Path root = p.getRoot().resolve(rootRel);
    Path dir = p;
    if (remote != null) {
      URI u = remote.toUri();
      String location = RemoteLocations.name(u.getScheme(), u.getRawAuthority(), "/" + rootRel);
      root = RemoteLocations.ensureMirrorRoot(Conf.current(), location);
      dir = root.resolve(p.subpath(stateAt, p.getNameCount()));
    }
    return new StoreDir(root, dir, operator, partition, store, remote);
  }

  private static String name(Path p, int i) {
    return p.getName(i).toString();
  }

  private static boolean isNumber(String s) {
    return NUMBER.matcher(s).matches();
  }

  /** Spark's store names ("default", "left-keyToNumValues", ...); never its internal "_..." dirs. */
  private static boolean isStoreName(String s) {
    return !s.isEmpty() && !s.startsWith("_") && !s.startsWith(".") && !isNumber(s);
  }

  /**
   * A {@code file:} URI or scheme-less path as an absolute, normalised local path; null for any other
   * scheme. Only local checkpoint locations are hooked: staging is a hard link into the same
   * filesystem, and restoring means writing the files back where Spark reads them.
   */
  static Path localPathOrNull(org.apache.hadoop.fs.Path path) {
    URI uri = path.toUri();
    if (uri.getScheme() != null && !"file".equalsIgnoreCase(uri.getScheme())) return null;
    String p = uri.getPath();
    if (p == null || p.isEmpty()) return null;
    return Paths.get(p).toAbsolutePath().normalize();
  }

  /** "op/part/store": the store instance key the sidecar and the checkpoint markers use. */
  String instance() {
    return operator + "/" + partition + "/" + store;
  }

  @Override
  public String toString() {
    return instance() + " (" + dir + (remote == null ? "" : ", mirror of " + remote) + ")";
  }

  /** What a version's file name says: version, optional checkpoint-format-v2 id and kind. */
  static final class VersionFile {
    private static final Pattern FILE =
        Pattern.compile("(0|[1-9][0-9]{0,18})(?:_([0-9A-Za-z-]{1,64}))?\\.(zip|changelog)");
    final long version;
    final String uniqueId;
    final boolean zip;

    private VersionFile(long version, String uniqueId, boolean zip) {
      this.version = version;
      this.uniqueId = uniqueId;
      this.zip = zip;
    }

    /** {@code <v>.zip}, {@code <v>_<id>.zip}, {@code <v>.changelog} or {@code <v>_<id>.changelog}; else null. */
    static VersionFile parse(String name) {
      Matcher m = FILE.matcher(name);
      if (!m.matches()) return null;
      try {
        return new VersionFile(Long.parseLong(m.group(1)), m.group(2), "zip".equals(m.group(3)));
      } catch (NumberFormatException e) {
        return null;
      }
    }

    static String name(long version, String uniqueId, boolean zip) {
      return version + (uniqueId == null ? "" : "_" + uniqueId) + (zip ? ".zip" : ".changelog");
    }

    String name() {
      return name(version, uniqueId, zip);
    }
  }
}
