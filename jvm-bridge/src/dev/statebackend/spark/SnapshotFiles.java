package dev.statebackend.spark;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;

import com.fasterxml.jackson.databind.JsonNode;

/**
 * The exact set of checkpoint-location files one committed RocksDB version consists of.
 *
 * <p>Why it exists: staging and the "is this version missing?" check must agree with what Spark's
 * RocksDBFileManager writes and reads (measured in the 4.3.0 bytecode): {@code <v>.zip} (format v1) or
 * {@code <v>_<uniqueId>.zip} (format v2) holds CURRENT, MANIFEST-*, OPTIONS-*, the (empty, WAL is off)
 * top-level *.log files and a {@code metadata} file ("v1" line + JSON); that JSON's {@code sstFiles[]
 * .dfsSstFileName} live in {@code SSTs/} and {@code logFiles[].dfsLogFileName} (archived WAL files,
 * normally none) in {@code logs/}, each with {@code sizeBytes}. We parse the JSON ourselves (Jackson)
 * rather than call Spark's RocksDBCheckpointMetadata, and SignatureCheck pins the constants we rely on
 * (metadata VERSION 1, "SSTs", "logs").
 */
final class SnapshotFiles {
  static final String METADATA = "metadata";
  static final String SST_DIR = "SSTs";
  static final String LOG_DIR = "logs";
  /** Suffix of Spark's visible per-file checksum (ChecksumCheckpointFileManager), e.g. {@code 3_<id>.zip.crc}. */
  static final String CHECKSUM_SUFFIX = ".crc";

  /** One immutable file a version references: path relative to the store's DFS dir, and its size. */
  static final class Ref {
    final String relPath;
    final long sizeBytes;

    Ref(String relPath, long sizeBytes) {
      this.relPath = relPath;
      this.sizeBytes = sizeBytes;
    }
  }

  private SnapshotFiles() {}

  static String zipName(long version, String uniqueId) {
    return uniqueId == null ? version + ".zip" : version + "_" + uniqueId + ".zip";
  }

  /** Files referenced by the {@code metadata} Spark wrote into a local RocksDB checkpoint dir. */
  static List<Ref> fromCheckpointDir(File checkpointDir) throws IOException {
    Path p = checkpointDir.toPath().resolve(METADATA);
    return parse(Files.readAllBytes(p), p.toString());
  }

  /** Files referenced by the {@code metadata} entry of a version zip. */
  static List<Ref> fromZip(Path zip) throws IOException {
    try (ZipFile zf = new ZipFile(zip.toFile())) {
      ZipEntry e = zf.getEntry(METADATA);
      if (e == null) throw new IOException(zip + " has no '" + METADATA + "' entry");
      try (InputStream in = zf.getInputStream(e)) {
        return parse(in.readAllBytes(), zip + "!" + METADATA);
      }
    }
  }

  /** Parses Spark's RocksDBCheckpointMetadata file: a "v1" line, then one JSON object. */
  static List<Ref> parse(byte[] content, String source) throws IOException {
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
    return Collections.unmodifiableList(out);
  }

  private static void addRefs(JsonNode arr, String nameField, String dir, String source, List<Ref> out)
      throws IOException {
    if (arr.isMissingNode() || arr.isNull()) return;
    if (!arr.isArray()) throw new IOException(source + ": field for " + dir + " is not an array");
    for (JsonNode f : arr) {
      String name = f.path(nameField).asText("");
      // Names come from a file we did not write: never let one escape the store dir.
      if (name.isEmpty() || name.contains("/") || name.contains("\\") || name.equals(".") || name.equals("..")) {
        throw new IOException(source + ": bad " + nameField + " '" + name + "'");
      }
      if (!f.path("sizeBytes").canConvertToLong()) throw new IOException(source + ": no sizeBytes for " + name);
      out.add(new Ref(dir + "/" + name, f.path("sizeBytes").asLong()));
    }
  }

  /**
   * What Spark would miss to load {@code version} from {@code dfsDir} without changelog replay, or null
   * if nothing: the version zip must exist and every file its metadata references must exist with the
   * recorded size (Spark checks the size too). An unreadable zip counts as missing.
   */
  static String whatIsMissing(Path dfsDir, long version, String uniqueId) {
    Path zip = dfsDir.resolve(zipName(version, uniqueId));
    if (!Files.isRegularFile(zip)) return zip.getFileName() + " is absent";
    List<Ref> refs;
    try {
      refs = fromZip(zip);
    } catch (IOException e) {
      return zip.getFileName() + " is unreadable (" + e.getMessage() + ")";
    }
    for (Ref r : refs) {
      Path f = dfsDir.resolve(r.relPath);
      try {
        if (!Files.isRegularFile(f)) return r.relPath + " (referenced by " + zip.getFileName() + ") is absent";
        long size = Files.size(f);
        if (size != r.sizeBytes) {
          return r.relPath + " has " + size + " bytes, " + zip.getFileName() + " expects " + r.sizeBytes;
        }
      } catch (IOException e) {
        return r.relPath + " is unreadable (" + e.getMessage() + ")";
      }
    }
    return null;
  }
}
