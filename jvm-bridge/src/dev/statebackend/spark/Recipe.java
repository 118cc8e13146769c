package dev.statebackend.spark;

import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.TreeMap;
import java.util.stream.Stream;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.SparkConf;
import org.apache.spark.io.CompressionCodec;

/**
 * The exact set of files in a store's checkpoint dir that Spark needs to load one version: a snapshot
 * (its zip and the files the zip's metadata references) plus the changelogs Spark replays on top.
 *
 * <p>Why it exists: staging (what the sidecar uploads for a committed version) and the load hook (is a
 * version loadable from local files, or must it be restored first?) must agree with what Spark's
 * RocksDB load reads, measured in the 4.3.0 bytecode:
 * <ul>
 *   <li>a snapshot {@code <s>.zip} (checkpoint format v2: {@code <s>_<id>.zip}) holds CURRENT, MANIFEST,
 *   OPTIONS, the empty WAL and a {@code metadata} file ("v1" line + JSON) whose {@code sstFiles[]
 *   .dfsSstFileName} live in {@code SSTs/} and {@code logFiles[].dfsLogFileName} in {@code logs/}, each
 *   with {@code sizeBytes} (Spark checks sizes). With file checksums on (format v2) each zip and
 *   changelog has a visible {@code <name>.crc} beside it, which is optional on load;</li>
 *   <li>format v1: to load v, Spark takes the newest {@code <s>.zip} with s &lt;= v and replays {@code
 *   <s+1>.changelog} .. {@code <v>.changelog} (none when s = v; from empty state when there is no zip).
 *   Without changelog checkpointing every version is a zip, so the recipe of v is {@code <v>.zip};</li>
 *   <li>format v2: {@code <v>_<id>.zip} if it exists, else {@code <v>_<id>.changelog}, whose header
 *   carries the lineage (version, id) back to a snapshot; Spark loads the newest lineage entry with a
 *   zip and replays the lineage's changelogs after it.</li>
 * </ul>
 * So a recipe is what Spark would replay if it restarted now from its own files: never more changelogs.
 * Names come from files we did not write: none may escape the store dir.
 */
final class Recipe {
  static final String METADATA = "metadata";
  static final String SST_DIR = "SSTs";
  static final String LOG_DIR = "logs";
  /** Spark's visible per-file checksum suffix (ChecksumCheckpointFileManager). */
  static final String CHECKSUM_SUFFIX = ".crc";
  static final String CODEC_KEY = "spark.sql.streaming.stateStore.compression.codec";

  final long version;
  final String uniqueId;
  /** The snapshot version the recipe starts from; 0 when Spark replays from empty state. */
  final long snapshotVersion;
  final List<Long> changelogVersions;
  /** Paths relative to the store dir, each an existing regular file when the recipe was built. */
  final List<String> files;

  private Recipe(long version, String uniqueId, long snapshotVersion, List<Long> changelogVersions,
      List<String> files) {
    this.version = version;
    this.uniqueId = uniqueId;
    this.snapshotVersion = snapshotVersion;
    this.changelogVersions = Collections.unmodifiableList(changelogVersions);
    this.files = Collections.unmodifiableList(files);
  }

  boolean changelogMode() {
    return !changelogVersions.isEmpty();
  }

  /** Thrown when a version cannot be loaded from a dir; the message says which file and why. */
  static final class Missing extends Exception {
    Missing(String message) {
      super(message);
    }
  }

  /**
   * The recipe of {@code version} (v2: with {@code uniqueId}; null = format v1, or v2 with the id
   * unknown, then any id of that version is tried) in {@code dir}, or {@link Missing} saying what is
   * absent. {@code codec} reads v2 changelog headers; it may be null when the dir has none.
   */
  static Recipe of(Path dir, long version, String uniqueId, Codec codec) throws Missing, IOException {
    if (version <= 0) return new Recipe(version, uniqueId, 0, new ArrayList<>(), new ArrayList<>());
    Set<String> names = listNames(dir);
    if (uniqueId != null) return ofV2(dir, version, uniqueId, names, codec);
    String v1zip = StoreDir.VersionFile.name(version, null, true);
    String v1log = StoreDir.VersionFile.name(version, null, false);
    if (names.contains(v1zip) || names.contains(v1log)) return ofV1(dir, version, names);
    // Format v2 with the id not known to the caller: any id of this version will do.
    Missing first = null;
    for (String n : names) {
      StoreDir.VersionFile f = StoreDir.VersionFile.parse(n);
      if (f == null || f.version != version || f.uniqueId == null) continue;
      try {
        return ofV2(dir, version, f.uniqueId, names, codec);
      } catch (Missing m) {
        if (first == null) first = m;
      }
    }
    throw first != null ? first : new Missing("neither " + v1zip + " nor " + v1log + " (nor a checkpoint "
        + "format v2 file of version " + version + ") is in " + dir);
  }

  private static Recipe ofV1(Path dir, long version, Set<String> names) throws Missing, IOException {
    TreeMap<Long, String> zips = new TreeMap<>();
    for (String n : names) {
      StoreDir.VersionFile f = StoreDir.VersionFile.parse(n);
      if (f != null && f.zip && f.uniqueId == null && f.version <= version) zips.put(f.version, n);
    }
    Missing why = null;
    // The newest snapshot whose files are all there and from which every changelog up to v exists.
    for (Long s : zips.descendingKeySet()) {
      try {
        List<String> files = new ArrayList<>(snapshotFiles(dir, zips.get(s), names));
        List<Long> logs = new ArrayList<>();
        for (long i = s + 1; i <= version; i++) {
          addChangelog(dir, StoreDir.VersionFile.name(i, null, false), names, files);
          logs.add(i);
        }
        return new Recipe(version, null, s, logs, files);
      } catch (Missing m) {
        if (why == null) why = m;
      }
    }
    // No usable snapshot: Spark replays every changelog from version 1 onto empty state.
    try {
      List<String> files = new ArrayList<>();
      List<Long> logs = new ArrayList<>();
      for (long i = 1; i <= version; i++) {
        addChangelog(dir, StoreDir.VersionFile.name(i, null, false), names, files);
        logs.add(i);
      }
      return new Recipe(version, null, 0, logs, files);
    } catch (Missing m) {
      throw why != null ? why : m;
    }
  }

  private static Recipe ofV2(Path dir, long version, String id, Set<String> names, Codec codec)
      throws Missing, IOException {
    String zip = StoreDir.VersionFile.name(version, id, true);
    if (names.contains(zip)) {
      return new Recipe(version, id, version, new ArrayList<>(), snapshotFiles(dir, zip, names));
    }
    String log = StoreDir.VersionFile.name(version, id, false);
    if (!names.contains(log)) throw new Missing("neither " + zip + " nor " + log + " is in " + dir);
    if (codec == null) throw new Missing(log + " needs its lineage read, and no codec is known");
    TreeMap<Long, String> lineage = codec.lineage(dir.resolve(log));
    lineage.put(version, id);
    Missing why = null;
    for (Long s : lineage.descendingKeySet()) {
      String z = StoreDir.VersionFile.name(s, lineage.get(s), true);
      if (!names.contains(z)) continue;
      try {
        List<String> files = new ArrayList<>(snapshotFiles(dir, z, names));
        return new Recipe(version, id, s, chain(dir, lineage, s, version, names, files), files);
      } catch (Missing m) {
        if (why == null) why = m;
      }
    }
    if (why != null) throw why;
    List<String> files = new ArrayList<>();
    return new Recipe(version, id, 0, chain(dir, lineage, 0, version, names, files), files);
  }

  /** Adds the changelogs of lineage versions s+1..v (each must be in the lineage and in the dir). */
  private static List<Long> chain(Path dir, TreeMap<Long, String> lineage, long s, long v, Set<String> names,
      List<String> files) throws Missing, IOException {
    List<Long> logs = new ArrayList<>();
    for (long i = s + 1; i <= v; i++) {
      String id = lineage.get(i);
      if (id == null) throw new Missing("version " + i + " is not in the lineage of version " + v + " in " + dir);
      addChangelog(dir, StoreDir.VersionFile.name(i, id, false), names, files);
      logs.add(i);
    }
    return logs;
  }

  private static void addChangelog(Path dir, String name, Set<String> names, List<String> files)
      throws Missing {
    if (!names.contains(name)) throw new Missing(name + " is absent from " + dir);
    files.add(name);
    if (names.contains(name + CHECKSUM_SUFFIX)) files.add(name + CHECKSUM_SUFFIX);
  }

  /** The zip (+ its .crc) and every file its metadata references, each present with its recorded size. */
  private static List<String> snapshotFiles(Path dir, String zip, Set<String> names) throws Missing {
    List<String> out = new ArrayList<>();
    out.add(zip);
    if (names.contains(zip + CHECKSUM_SUFFIX)) out.add(zip + CHECKSUM_SUFFIX);
    List<Ref> refs;
    try {
      refs = refsOfZip(dir.resolve(zip));
    } catch (IOException e) {
      throw new Missing(zip + " in " + dir + " is unreadable (" + e.getMessage() + ")");
    }
    for (Ref r : refs) {
      Path f = dir.resolve(r.relPath);
      try {
        if (!Files.isRegularFile(f)) throw new Missing(r.relPath + " (referenced by " + zip + ") is absent from " + dir);
        long size = Files.size(f);
        if (size != r.sizeBytes) {
          throw new Missing(r.relPath + " in " + dir + " has " + size + " bytes, " + zip + " expects " + r.sizeBytes);
        }
      } catch (IOException e) {
        throw new Missing(r.relPath + " in " + dir + " is unreadable (" + e.getMessage() + ")");
      }
      out.add(r.relPath);
    }
    return out;
  }

  private static Set<String> listNames(Path dir) throws IOException {
    if (!Files.isDirectory(dir)) return Collections.emptySet();
    try (Stream<Path> s = Files.list(dir)) {
      Set<String> out = new HashSet<>();
      s.forEach(p -> out.add(p.getFileName().toString()));
      return out;
    }
  }

  /** One immutable file a snapshot references: path relative to the store dir, and its size. */
  static final class Ref {
    final String relPath;
    final long sizeBytes;

    Ref(String relPath, long sizeBytes) {
      this.relPath = relPath;
      this.sizeBytes = sizeBytes;
    }
  }

  /** Files referenced by the {@code metadata} entry of a version zip. */
  static List<Ref> refsOfZip(Path zip) throws IOException {
    try (ZipFile zf = new ZipFile(zip.toFile())) {
      ZipEntry e = zf.getEntry(METADATA);
      if (e == null) throw new IOException(zip + " has no '" + METADATA + "' entry");
      try (InputStream in = zf.getInputStream(e)) {
        return parseMetadata(in.readAllBytes(), zip + "!" + METADATA);
      }
    }
  }

  /** Parses Spark's RocksDBCheckpointMetadata file: a "v1" line, then one JSON object. */
  static List<Ref> parseMetadata(byte[] content, String source) throws IOException {
    String text = new String(content, StandardCharsets.UTF_8);
    int nl = text.indexOf('\n');
    if (nl < 0 || !text.substring(0, nl).trim().equals("v1")) {
      throw new IOException(source + ": expected a 'v1' first line (Spark RocksDB checkpoint metadata)");
    }
    JsonNode root = Spool.MAPPER.readTree(text.substring(nl + 1));
    if (root == null || !root.isObject()) throw new IOException(source + ": metadata is not a JSON object");
    List<Ref> out = new ArrayList<>();
    addRefs(root.path("sstFiles"), "dfsSstFileName", SST_DIR, source, out);
    addRefs(root.path("logFiles"), "dfsLogFileName", LOG_DIR, source, out);
    return out;
  }

  private static void addRefs(JsonNode arr, String nameField, String dir, String source, List<Ref> out)
      throws IOException {
    if (arr.isMissingNode() || arr.isNull()) return;
    if (!arr.isArray()) throw new IOException(source + ": field for " + dir + " is not an array");
    for (JsonNode f : arr) {
      String name = f.path(nameField).asText("");
      if (!safeName(name)) throw new IOException(source + ": bad " + nameField + " '" + name + "'");
      if (!f.path("sizeBytes").canConvertToLong()) throw new IOException(source + ": no sizeBytes for " + name);
      out.add(new Ref(dir + "/" + name, f.path("sizeBytes").asLong()));
    }
  }

  static boolean safeName(String name) {
    return !name.isEmpty() && !name.contains("/") && !name.contains("\\") && !name.equals(".")
        && !name.equals("..") && name.indexOf('\0') < 0;
  }

  /**
   * Reads the lineage in a checkpoint-format-v2 changelog header: the codec's stream holds a
   * writeUTF'd version line ("v3"/"v4") and a writeUTF'd JSON array of {version, checkpointUniqueId}
   * (StateStoreChangelogWriter.writeVersion/writeLineage in the 4.3.0 bytecode).
   */
  static final class Codec {
    private final CompressionCodec codec;

    Codec(CompressionCodec codec) {
      this.codec = codec;
    }

    /** The codec Spark's state store uses for changelogs, from the store's Hadoop conf. */
    static Codec fromConf(org.apache.hadoop.conf.Configuration hadoopConf) {
      String name = hadoopConf.get(CODEC_KEY, "lz4");
      SparkConf sc = org.apache.spark.SparkEnv.get() == null ? new SparkConf(false)
          : org.apache.spark.SparkEnv.get().conf();
      return new Codec(CompressionCodec.createCodec(sc, name));
    }

    TreeMap<Long, String> lineage(Path changelog) throws Missing {
      try (InputStream raw = Files.newInputStream(changelog);
           DataInputStream in = new DataInputStream(codec.compressedInputStream(raw))) {
        String v = in.readUTF();
        if (!v.equals("v3") && !v.equals("v4")) {
          throw new Missing(changelog + ": changelog format " + v + " carries no lineage");
        }
        JsonNode arr = Spool.MAPPER.readTree(in.readUTF());
        TreeMap<Long, String> out = new TreeMap<>();
        if (arr == null || !arr.isArray()) throw new Missing(changelog + ": lineage is not a JSON array");
        for (JsonNode item : arr) {
          String id = item.path("checkpointUniqueId").asText("");
          if (!item.path("version").canConvertToLong() || !safeName(id)) {
            throw new Missing(changelog + ": bad lineage entry " + item);
          }
          out.put(item.path("version").asLong(), id);
        }
        return out;
      } catch (IOException e) {
        throw new Missing(changelog + " is unreadable (" + e + ")");
      }
    }
  }
}
