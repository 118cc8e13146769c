package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import com.codahale.metrics.Counter;
import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import com.fasterxml.jackson.databind.JsonNode;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A sidecar's metrics in this JVM's Spark metrics system (the plugin's metric registry), so JMX, Spark's
 * Prometheus servlet and every configured Spark sink show them.
 *
 * <p>Why it exists: the metrics are counted where the work happens, in the Python sidecar
 * (spark_statebackend.common.metrics); the sidecar writes them every second to {@code <spool>/metrics.json}
 * as {@code {"samples": [{"name", "labels", "type", "value"}]}}. One named daemon thread per plugin reads
 * that file every {@link #POLL_MS} ms and registers a metric for every sample it has not seen before (new
 * queries appear while the application runs), named {@code <name>.<label>.<value>...}: a sample of
 * {@code "type": "counter"} as a {@link Counter} holding the sidecar's count (so sinks see a counter), any
 * other as a {@link Gauge}. There is one sample per sidecar or per query, so the number of names follows
 * the queries; only with {@code metrics.perStore=true} do the backup and restore samples carry a
 * {@code store} label too (one name per store instance). A metric whose sample is no longer published (a query
 * renamed, a restarted sidecar) is removed. Reading is best effort: a missing or half-replaced file
 * leaves the last values.
 */
final class SidecarMetrics implements Runnable {
  private static final Logger LOG = LoggerFactory.getLogger(SidecarMetrics.class);
  static final String FILE = "metrics.json";
  static final long POLL_MS = 2_000;
  static final String AGE = "ssb_sidecar_metrics_age_seconds";

  private final Path file;
  private final MetricRegistry registry;
  private final Map<String, Double> values = new ConcurrentHashMap<>();
  private final Map<String, Counter> counters = new HashMap<>();
  private volatile boolean stopped;
  private Thread thread;
  private long lastModified = -1;

  private SidecarMetrics(Path spoolDir, MetricRegistry registry) {
    this.file = spoolDir.resolve(FILE);
    this.registry = registry;
  }

  /**
   * Starts publishing the sidecar metrics of {@code spoolDir} into {@code registry}. Registers one gauge
   * at once ({@code ssb_sidecar_metrics_age_seconds}: how old the sidecar's last publication is, -1
   * before the first): Spark adds a plugin's registry to its metrics system only if it is not empty
   * when registerMetrics returns, and follows it from then on.
   */
  static SidecarMetrics start(Path spoolDir, MetricRegistry registry, String who) {
    SidecarMetrics m = new SidecarMetrics(spoolDir, registry);
    registry.remove(AGE);
    registry.register(AGE, (Gauge<Double>) () -> {
      try {
        return (System.currentTimeMillis() - Files.getLastModifiedTime(m.file).toMillis()) / 1000.0;
      } catch (IOException e) {
        return -1.0;
      }
    });
    m.thread = new Thread(m, "statebackend-metrics-" + who);
    m.thread.setDaemon(true);
    m.thread.start();
    return m;
  }

  void stop() {
    stopped = true;
    if (thread != null) thread.interrupt();
  }

  @Override
  public void run() {
    while (!stopped) {
      try {
        refresh();
        Thread.sleep(POLL_MS);
      } catch (InterruptedException e) {
        return;
      } catch (RuntimeException e) {
        LOG.debug("spark-statebackend: reading {} failed: {}", file, e.toString());
      }
    }
  }

  /** Reads the file if it changed and updates (registers, removes) the metrics; visible for tests. */
  void refresh() {
    JsonNode root;
    try {
      long modified = Files.getLastModifiedTime(file).toMillis();
      if (modified == lastModified) return;
      root = Spool.MAPPER.readTree(Files.readAllBytes(file));
      lastModified = modified;
    } catch (NoSuchFileException e) {
      return;
    } catch (IOException e) {
      return;   // being replaced: the next poll reads the new one
    }
    JsonNode samples = root == null ? null : root.path("samples");
    if (samples == null || !samples.isArray()) return;
    Set<String> seen = new HashSet<>();
    for (JsonNode s : samples) {
      String name = metricName(s);
      if (name == null || !s.path("value").isNumber() || !seen.add(name)) continue;
      double value = s.path("value").asDouble();
      if ("counter".equals(s.path("type").asText(""))) {
        count(name, value);
      } else {
        gauge(name, value);
      }
    }
    for (String name : new HashSet<>(values.keySet())) {
      if (!seen.contains(name)) {
        values.remove(name);
        registry.remove(name);
      }
    }
    for (String name : new HashSet<>(counters.keySet())) {
      if (!seen.contains(name)) {
        counters.remove(name);
        registry.remove(name);
      }
    }
  }

  private void gauge(String name, double value) {
    if (counters.remove(name) != null) registry.remove(name);   // it changed type
    if (values.put(name, value) == null) {
      registry.remove(name);   // an earlier publisher's metric of the same name reads another map
      registry.register(name, (Gauge<Double>) () -> values.getOrDefault(name, Double.NaN));
    }
  }

  /** The Counter {@code name} made to hold {@code value}, the sidecar's count (a sidecar that restarted
   * counts from 0 again: the Counter goes down with it, which sinks read as a reset). */
  private void count(String name, double value) {
    if (values.remove(name) != null) registry.remove(name);   // it changed type
    Counter c = counters.get(name);
    if (c == null) {
      registry.remove(name);
      c = registry.counter(name);
      counters.put(name, c);
    }
    c.inc(Math.round(value) - c.getCount());
  }

  /** {@code ssb_x{query="counts"}} -> {@code ssb_x.query.counts}; null for a malformed sample. */
  static String metricName(JsonNode sample) {
    String name = sample.path("name").asText("");
    if (!name.matches("ssb_[a-z0-9_]{1,120}")) return null;
    StringBuilder sb = new StringBuilder(name);
    JsonNode labels = sample.path("labels");
    if (labels.isObject()) {
      java.util.List<String> keys = new java.util.ArrayList<>();
      labels.fieldNames().forEachRemaining(keys::add);
      java.util.Collections.sort(keys);
      for (String k : keys) {
        sb.append('.').append(clean(k)).append('.').append(clean(labels.path(k).asText("")));
      }
    }
    return sb.toString();
  }

  private static String clean(String s) {
    return s.replaceAll("[^A-Za-z0-9_-]", "_");
  }
}
