package dev.statebackend.spark;

import java.util.Collections;
import java.util.Map;

import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code spark.plugins=dev.statebackend.spark.StateBackendPlugin}: per-executor sidecar and start-up checks.
 *
 * <p>Why it exists: Spark's plugin API (org.apache.spark.api.plugin, a public API) is the one hook that
 * runs once per executor JVM, at start and at stop. The driver side runs {@link SignatureCheck} so a
 * Spark version the shim does not match fails the application at start. The executor side, when
 * {@code spark.statebackend.sidecar.mode=process}, starts that executor's {@link SidecarProcess} and stops
 * it in {@code shutdown()}. It never calls {@code PluginContext.hostname()}, which threw a
 * NullPointerException inside ExecutorPlugin.init on Spark 4.3 standalone.
 */
public class StateBackendPlugin implements SparkPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(StateBackendPlugin.class);

  @Override
  public DriverPlugin driverPlugin() {
    return new DriverPlugin() {
      private SparkContext sc;
      private SidecarProcess driverSidecar;

      @Override
      public Map<String, String> init(SparkContext sc, PluginContext ctx) {
        this.sc = sc;
        if (Conf.of(ctx.conf()).enabled()) SignatureCheck.verify();
        return Collections.emptyMap();
      }

      /**
       * Called once the application id is known. Outside local mode no executor lives in the driver JVM,
       * so the driver gets a sidecar of its own: it runs the committer on the progress events that
       * {@link ProgressSpoolListener} writes to {@code <spool root>/<app id>/driver/}. In local mode the
       * executor plugin's sidecar (executor id "driver") serves that directory already.
       */
      @Override
      public synchronized void registerMetrics(String appId, PluginContext ctx) {
        Conf conf = Conf.of(ctx.conf());
        String master = sc == null ? "" : sc.master();
        boolean local = master.equals("local") || master.startsWith("local[");
        if (conf.enabled() && "process".equals(conf.sidecarMode()) && !local && driverSidecar == null) {
          driverSidecar = SidecarProcess.start(conf, appId, "driver");
        }
      }

      @Override
      public synchronized void shutdown() {
        if (driverSidecar != null) driverSidecar.close();
        driverSidecar = null;
      }
    };
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new SidecarExecutorPlugin();
  }

  /** Starts the sidecar at init, or at the first task if spark.app.id is not known yet (local mode). */
  static final class SidecarExecutorPlugin implements ExecutorPlugin {
    private String executorId;
    private boolean wanted;
    private SidecarProcess sidecar;

    @Override
    public synchronized void init(PluginContext ctx, Map<String, String> extraConf) {
      Conf conf = Conf.of(ctx.conf());
      executorId = ctx.executorID();
      if (conf.enabled()) WarmUp.startInBackground(executorId);
      wanted = conf.enabled() && "process".equals(conf.sidecarMode());
      if (!wanted) {
        LOG.info("spark-statebackend: executor {}: sidecar.mode={}, no sidecar process", executorId,
            conf.sidecarMode());
        return;
      }
      if (conf.appIdOrNull() != null) sidecar = SidecarProcess.start(conf, conf.appIdOrNull(), executorId);
    }

    @Override
    public void onTaskStart() {
      if (!wanted) return;
      synchronized (this) {
        if (sidecar != null) return;
        Conf conf = Conf.current();
        String app = conf.appIdOrNull();
        if (app == null) throw new IllegalStateException("spark-statebackend: spark.app.id is unknown on "
            + "executor " + executorId + "; cannot place its spool dir");
        sidecar = SidecarProcess.start(conf, app, executorId);
      }
    }

    @Override
    public synchronized void shutdown() {
      if (sidecar != null) sidecar.close();
      sidecar = null;
    }
  }
}
