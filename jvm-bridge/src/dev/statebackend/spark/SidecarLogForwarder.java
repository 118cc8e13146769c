package dev.statebackend.spark;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Copies a sidecar's log lines into this JVM's logging (log4j through slf4j), so they go where Spark's
 * own logs go: the driver's console or log file, the executor's {@code stderr} behind the Spark UI's
 * executor log links, and whatever YARN or Kubernetes aggregates from it.
 *
 * <p>Why a tail of {@code sidecar.log} rather than a pipe from the child: the file is written by the
 * sidecar itself (stdout and stderr appended by the OS), so nothing the sidecar says is lost when this
 * JVM is killed (a sidecar logs the death of its JVM after it), and a slow logger here can never block
 * the sidecar. The price is a delay of at most {@link #POLL_MS}. One named single-thread scheduler per
 * sidecar; each poll reads at most {@link #MAX_READ} bytes, so a burst is forwarded over several polls.
 *
 * <p>Lines go to the logger {@code dev.statebackend.sidecar} at the level the sidecar wrote them with
 * (its format: {@code <date> <time> <LEVEL> <thread> <logger>: <message>}); continuation lines
 * (tracebacks) keep the level of the line they continue. Each line is prefixed with the executor id.
 */
final class SidecarLogForwarder implements AutoCloseable {
  static final Logger SIDECAR_LOG = LoggerFactory.getLogger("dev.statebackend.sidecar");
  static final long POLL_MS = 500;
  static final int MAX_READ = 1 << 20;
  private static final Pattern LEVEL = Pattern.compile("^\\S+ \\S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ");

  private final Path file;
  private final String prefix;
  private final ScheduledExecutorService poller;
  private long offset; // guarded by this
  private String level = "INFO"; // guarded by this
  private final StringBuilder partial = new StringBuilder(); // guarded by this: a line not yet ended

  /** Forwards what is appended to {@code file} from now on (earlier lines belong to earlier JVMs). */
  SidecarLogForwarder(Path file, String executorId) {
    this.file = file;
    this.prefix = "[sidecar " + executorId + "] ";
    long start = 0;
    try {
      if (Files.exists(file, LinkOption.NOFOLLOW_LINKS)) start = Files.size(file);
    } catch (IOException e) {
      start = 0;
    }
    this.offset = start;
    this.poller = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "statebackend-sidecar-log-" + executorId);
      t.setDaemon(true);
      return t;
    });
    poller.scheduleWithFixedDelay(this::poll, POLL_MS, POLL_MS, TimeUnit.MILLISECONDS);
  }

  /** One read of what was appended since the last; never throws (a logging aid must not kill anything). */
  synchronized void poll() {
    try {
      if (Files.isSymbolicLink(file) || !Files.exists(file, LinkOption.NOFOLLOW_LINKS)) return;
      try (RandomAccessFile in = new RandomAccessFile(file.toFile(), "r")) {
        long size = in.length();
        if (size < offset) offset = 0; // truncated or replaced: start over
        if (size == offset) return;
        int n = (int) Math.min(MAX_READ, size - offset);
        byte[] buf = new byte[n];
        in.seek(offset);
        in.readFully(buf);
        offset += n;
        partial.append(new String(buf, StandardCharsets.UTF_8));
      }
      int nl;
      while ((nl = partial.indexOf("\n")) >= 0) {
        emit(partial.substring(0, nl));
        partial.delete(0, nl + 1);
      }
    } catch (IOException | RuntimeException e) {
      SIDECAR_LOG.debug("spark-statebackend: could not read {}: {}", file, e.toString());
    }
  }

  private void emit(String line) {
    if (line.isEmpty()) return;
    Matcher m = LEVEL.matcher(line);
    if (m.find()) level = m.group(1);
    String text = prefix + line;
    switch (level) {
      case "ERROR", "CRITICAL" -> SIDECAR_LOG.error(text);
      case "WARNING" -> SIDECAR_LOG.warn(text);
      case "DEBUG" -> SIDECAR_LOG.debug(text);
      default -> SIDECAR_LOG.info(text);
    }
  }

  /** Forwards what is left (the sidecar has exited by now) and stops the poller. */
  @Override
  public void close() {
    poller.shutdownNow();
    try {
      poller.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    poll();
    synchronized (this) {
      if (partial.length() > 0) {
        emit(partial.toString());
        partial.setLength(0);
      }
    }
  }
}
