import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.count;
import static org.apache.spark.sql.functions.sum;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.api.java.function.VoidFunction2;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.StreamingQueryProgress;
import org.apache.spark.sql.streaming.Trigger;

/**
 * tests/apps/agg_job.py as a JVM-only job: {@code spark-submit --class AggJob app.jar <work dir> <until batch>
 * [--hold]}. The same query (demo_app's {@code agg} shape), the same output files and the same protocol
 * (prints FIRST and BATCH lines; with --hold waits for {@code <work>/release} before stopping Spark), so a
 * test compares it with the same reference and can hand one checkpoint back and forth between the two.
 * It knows nothing of spark-statebackend: spark-submit's conf keys are all it gets.
 */
public final class AggJob {
  private static final long TIMEOUT_MS = 300_000;

  public static void main(String[] args) throws Exception {
    Path work = Paths.get(args[0]);
    long until = Long.parseLong(args[1]);
    boolean hold = args.length > 2 && args[2].equals("--hold");
    SparkSession spark = SparkSession.builder().appName("ssb-submit-java-agg")
        .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false").getOrCreate();
    spark.sparkContext().setLogLevel("ERROR");
    Dataset<Row> df = spark.readStream().format("rate-micro-batch")
        .option("rowsPerBatch", 100).option("numPartitions", 2).option("startTimestamp", 0)
        .option("advanceMillisPerBatch", 1000).load()
        .withColumn("k", col("value").mod(7))
        .groupBy("k")
        .agg(count("*").alias("c"), sum("value").alias("s"));
    Path out = work.resolve("out");
    Files.createDirectories(out);
    AtomicLong first = new AtomicLong(-1);
    VoidFunction2<Dataset<Row>, Long> sink = (batch, id) -> {
      if (first.compareAndSet(-1, id)) System.out.println("FIRST " + id);
      List<long[]> rows = new ArrayList<>();
      for (Row r : batch.collectAsList()) rows.add(new long[] {r.getLong(0), r.getLong(1), r.getLong(2)});
      rows.sort(Comparator.comparingLong((long[] r) -> r[0]));
      StringBuilder json = new StringBuilder("[");
      for (long[] r : rows) {
        if (json.length() > 1) json.append(", ");
        json.append('[').append(r[0]).append(", ").append(r[1]).append(", ").append(r[2]).append(']');
      }
      Path tmp = out.resolve("." + id + ".tmp");
      Files.write(tmp, json.append(']').toString().getBytes(StandardCharsets.UTF_8));
      Files.move(tmp, out.resolve(id + ".json"), StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    };
    StreamingQuery q = df.writeStream().outputMode("update").foreachBatch(sink)
        .option("checkpointLocation", work.resolve("ckpt").toString())
        .trigger(Trigger.ProcessingTime(200)).start();
    long deadline = System.currentTimeMillis() + TIMEOUT_MS;
    long seen = -1;
    while (seen < until) {
      StreamingQueryProgress p = q.lastProgress();
      if (p != null && p.batchId() > seen) {
        seen = p.batchId();
        System.out.println("BATCH " + seen);
      }
      if (q.exception().isDefined()) {
        System.out.println("QUERY FAILED " + q.exception().get());
        System.exit(1);
      }
      if (System.currentTimeMillis() > deadline) {
        System.out.println("TIMEOUT");
        System.exit(2);
      }
      Thread.sleep(50);
    }
    q.stop();
    Path release = work.resolve("release");
    while (hold && !Files.exists(release)) {
      if (System.currentTimeMillis() > deadline) {
        System.out.println("TIMEOUT waiting for release");
        System.exit(2);
      }
      Thread.sleep(50);
    }
    Files.deleteIfExists(release);
    spark.stop();
  }
}
