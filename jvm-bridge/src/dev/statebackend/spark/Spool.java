package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLong;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * One executor's spool directory: the file protocol between the JVM shim and the Python sidecar.
 *
 * <p>Why it exists: the task thread must hand a staged snapshot to Python without blocking on it, and a
 * restore must be requested from Python and awaited; plain files with atomic renames survive either side
 * dying and need no RPC. The protocol's spec is the docstring of
 * spark_statebackend/runtime/spool/__init__.py; this class (the files) and {@link SpoolDocuments} (the
 * documents) are its Java half and must stay in sync with it. Hooks no Spark member; uses the Jackson
 * ObjectMapper that Spark ships.
 *
 * <p>Layout under {@code <spoolRoot>/<appId>/<executorId>/}: {@code events/}, {@code requests/} (JVM
 * writes), {@code responses/<request_id>.json} and {@code sidecar.json} (sidecar writes). Every file is
 * written as {@code .<name>.tmp} in the same directory and renamed into place, so a reader never sees a
 * partial file. The JVM does not fsync: the spool is a live hand-off between two processes on one host;
 * after a host crash the app (and its spool dir, named by app id) is gone anyway.
 */
final class Spool {
  static final int SCHEMA_VERSION = 2;
  static final String EVENTS = "events";
  static final String REQUESTS = "requests";
  static final String RESPONSES = "responses";
  static final String STREAMS = "streams";
  static final String SIDECAR_MARKER = "sidecar.json";

  static final ObjectMapper MAPPER = new ObjectMapper();

  // File names sort by creation: epoch nanoseconds derived from a monotonic clock, strictly increasing in
  // this JVM, so "oldest first" is a plain name sort for the sidecar.
  private static final long EPOCH_NANOS_AT_START = System.currentTimeMillis() * 1_000_000L;
  private static final long NANO_AT_START = System.nanoTime();
  private static final AtomicLong LAST_STAMP = new AtomicLong();

  private final Path dir;

  Spool(Path dir) {
    this.dir = dir;
  }

  Path dir() {
    return dir;
  }

  /** {@code <20-digit epoch nanos>-<uuid>}: unique, and ordered by creation within this JVM. */
  static String nextStem() {
    long now = EPOCH_NANOS_AT_START + (System.nanoTime() - NANO_AT_START);
    long stamp = LAST_STAMP.updateAndGet(prev -> Math.max(prev + 1, now));
    return String.format("%020d-%s", stamp, UUID.randomUUID());
  }

  /** Publishes one snapshot event; returns its path. */
  Path publishEvent(SpoolDocuments.SnapshotEvent event) throws IOException {
    return writeJsonAtomically(dir.resolve(EVENTS).resolve(nextStem() + ".json"), event.toJson());
  }

  /** Publishes one changelog stream document; returns its path. */
  Path publishStream(SpoolDocuments.ChangelogStream stream) throws IOException {
    return writeJsonAtomically(dir.resolve(STREAMS).resolve(nextStem() + ".json"), stream.toJson());
  }

  /** Writes one restore request; returns its path. */
  Path writeRequest(Map<String, Object> request) throws IOException {
    return writeJsonAtomically(dir.resolve(REQUESTS).resolve(nextStem() + ".json"), request);
  }

  Path responsePath(String requestId) {
    return dir.resolve(RESPONSES).resolve(requestId + ".json");
  }

  /**
   * Reads and deletes the response to {@code requestId} if it has arrived. A response that is not a JSON
   * object, or answers another request, is an error naming the file.
   */
  Optional<JsonNode> takeResponse(String requestId) throws IOException {
    Path p = responsePath(requestId);
    byte[] data;
    try {
      data = Files.readAllBytes(p);
    } catch (NoSuchFileException e) {
      return Optional.empty();
    }
    Files.deleteIfExists(p);
    JsonNode node;
    try {
      node = MAPPER.readTree(data);
    } catch (IOException e) {
      throw new IOException("malformed restore response " + p + ": " + e.getMessage(), e);
    }
    if (node == null || !node.isObject()) throw new IOException("malformed restore response " + p + ": not a JSON object");
    if (!requestId.equals(node.path("request_id").asText(null))) {
      throw new IOException("restore response " + p + " names request_id " + node.path("request_id")
          + ", expected " + requestId);
    }
    return Optional.of(node);
  }

  /**
   * True when {@code sidecar.json} names a process that is alive on this host. The sidecar writes it at
   * start (spool.write_sidecar_marker); a missing or unreadable marker means "no sidecar".
   */
  boolean sidecarAlive() {
    Path p = dir.resolve(SIDECAR_MARKER);
    try {
      JsonNode n = MAPPER.readTree(Files.readAllBytes(p));
      if (n == null || !n.path("pid").canConvertToLong()) return false;
      return ProcessHandle.of(n.path("pid").asLong()).map(ProcessHandle::isAlive).orElse(false);
    } catch (NoSuchFileException e) {
      return false;
    } catch (IOException e) {
      return false;   // being replaced or malformed: treat as absent; the caller's grace period absorbs it
    }
  }

  /** Writes {@code value} as JSON to {@code target} via a hidden temp file and an atomic rename. */
  static Path writeJsonAtomically(Path target, Object value) throws IOException {
    return writeAtomically(target, MAPPER.writeValueAsBytes(value));
  }

  /**
   * Writes {@code data} to {@code target} (0600) via a hidden temp file and an atomic rename. Inside the
   * spool root the directories on the way are private ({@link PrivateDirs}).
   */
  static Path writeAtomically(Path target, byte[] data) throws IOException {
    Path parent = target.getParent().toAbsolutePath().normalize();
    Path root = Conf.current().spoolRoot();
    if (parent.startsWith(root)) {
      PrivateDirs.ensure(root, parent);
    } else {
      Files.createDirectories(parent);
    }
    Path tmp = parent.resolve("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
    try {
      Files.createFile(tmp, PrivateDirs.FILE_0600);
      Files.write(tmp, data);
      Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    } finally {
      Files.deleteIfExists(tmp);
    }
    return target;
  }
}
