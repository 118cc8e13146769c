package dev.statebackend.spark;

import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;

/**
 * Checks by reflection that every Spark (and Hadoop) member the shim implements, constructs or calls, and
 * every Spark constant it mirrors, is still what the shim was written against (Spark 4.3.0), and that the
 * running Spark is in one of {@link #SUPPORTED_LINES} (in all of them the shim compiles to the same bytes
 * and these expectations hold; docs/compatibility.md "Spark versions").
 *
 * <p>Why it exists: the hooks rely on Spark internals that may change in any release (how RocksDB
 * stores write and read their files, the names of those files, task local properties). A change would not
 * break the build of a user's job: backups would silently stop. So the plugin calls {@link #verify()} when
 * the application starts (driver and executors); it throws an IllegalStateException naming the running
 * Spark version and every member that does not match. It loads classes by name, so it also reports
 * classes that moved, instead of failing with a NoClassDefFoundError.
 */
public final class SignatureCheck {
  /** Spark release lines (major.minor) the shim runs on; keep in step with spark_statebackend/spark/compat.py. */
  static final List<String> SUPPORTED_LINES = List.of("4.1", "4.2", "4.3");

  private static final String STATE = "org.apache.spark.sql.execution.streaming.state.";
  private static final String RUNTIME = "org.apache.spark.sql.execution.streaming.runtime.";
  private static final String STR = "java.lang.String";
  private static final String HCONF = "org.apache.hadoop.conf.Configuration";
  private static final String HPATH = "org.apache.hadoop.fs.Path";
  private static final String CKPT = "org.apache.spark.sql.execution.streaming.checkpointing.";

  private static volatile boolean verified;

  private SignatureCheck() {}

  /** What we rely on, one line each; see jvm-bridge/README.md for why each is needed. */
  static List<Expectation> expectations() {
    List<Expectation> e = new ArrayList<>();
    // The hook: Spark builds every checkpoint file manager from this key, with a (Path, Configuration)
    // constructor, and RocksDBFileManager writes and lists a store's files through one (its field fm).
    e.add(Expectation.constant("org.apache.spark.sql.internal.SQLConf$",
        "STREAMING_CHECKPOINT_FILE_MANAGER_CLASS.parent.key", Conf.CHECKPOINT_FILE_MANAGER_KEY));
    e.add(Expectation.implementedBy(CKPT + "CheckpointFileManager",
        StateBackendCheckpointFileManager.class.getName()));
    e.add(Expectation.implementedBy(CKPT + "CheckpointFileManager", LocalCheckpointFileManager.class.getName()));
    e.add(Expectation.field(STATE + "RocksDBFileManager", "fm", CKPT + "CheckpointFileManager"));
    e.add(Expectation.callable(CKPT + "CheckpointFileManager", "createCheckpointDirectory", HPATH));
    e.add(Expectation.constructor(CKPT + "CheckpointFileManager$CancellableFSDataOutputStream", "java.io.OutputStream"));
    e.add(Expectation.constructor(CKPT + "FileContextBasedCheckpointFileManager", HPATH, HCONF));
    e.add(Expectation.constructor(CKPT + "FileSystemBasedCheckpointFileManager", HPATH, HCONF));
    // ProgressFigures: a query's progress carries its observed metrics in this field, swapped whole.
    e.add(Expectation.field("org.apache.spark.sql.streaming.StreamingQueryProgress", "observedMetrics",
        "java.util.Map"));
    // linkSstFiles: RocksDBFileManager copies SSTs with the location's Hadoop FileSystem (its field fs),
    // whose two-argument copies reach the three-argument ones LinkingLocalFileSystem overrides.
    e.add(Expectation.field(STATE + "RocksDBFileManager", "fs", "org.apache.hadoop.fs.FileSystem"));
    e.add(Expectation.callable("org.apache.hadoop.fs.LocalFileSystem", "copyFromLocalFile", "void", "boolean",
        HPATH, HPATH));
    e.add(Expectation.callable("org.apache.hadoop.fs.LocalFileSystem", "copyToLocalFile", "void", "boolean",
        HPATH, HPATH));
    // Store files we stage and restore (file layout, metadata format, checksum suffix, changelog header).
    e.add(Expectation.constant(STATE + "RocksDBCheckpointMetadata$", "VERSION", 1));
    e.add(Expectation.constant(STATE + "RocksDBImmutableFile$", "SST_FILES_DFS_SUBDIR", Recipe.SST_DIR));
    e.add(Expectation.constant(STATE + "RocksDBImmutableFile$", "LOG_FILES_DFS_SUBDIR", Recipe.LOG_DIR));
    e.add(Expectation.constant(CKPT + "ChecksumCheckpointFileManager$", "CHECKSUM_FILE_SUFFIX",
        Recipe.CHECKSUM_SUFFIX));
    e.add(Expectation.constant(STATE + "StateStoreId$", "DEFAULT_STORE_NAME", StoreDir.DEFAULT_STORE));
    e.add(Expectation.constant("org.apache.spark.sql.internal.SQLConf$", "STATE_STORE_COMPRESSION_CODEC.key",
        Recipe.CODEC_KEY));
    e.add(Expectation.callable(STATE + "StateStoreChangelogWriter", "writeLineage", "void",
        "[L" + STATE + "LineageItem;"));
    // Members ProgressSpoolListener calls to find a query's checkpoint location.
    e.add(Expectation.callable(RUNTIME + "StreamingQueryWrapper", "streamingQuery", RUNTIME + "StreamExecution"));
    e.add(Expectation.callable(RUNTIME + "StreamExecution", "resolvedCheckpointRoot", STR));
    // A clean stop waits for the listener bus before the driver's sidecar drains (StateBackendPlugin).
    e.add(Expectation.callable("org.apache.spark.SparkContext", "listenerBus",
        "org.apache.spark.scheduler.LiveListenerBus"));
    e.add(Expectation.callable("org.apache.spark.scheduler.LiveListenerBus", "waitUntilEmpty", "void", "long"));
    // TaskContext local property keys: which query and micro-batch a task runs.
    e.add(Expectation.constant(RUNTIME + "StreamExecution$", "QUERY_ID_KEY", StoreHooks.QUERY_ID_KEY));
    e.add(Expectation.constant(RUNTIME + "MicroBatchExecution$", "BATCH_ID_KEY", StoreHooks.BATCH_ID_KEY));
    return e;
  }

  /** Throws IllegalStateException listing every mismatch; cheap after the first success. */
  public static void verify() {
    if (verified) return;
    synchronized (SignatureCheck.class) {
      if (verified) return;
      check(expectations());
      verified = true;
    }
  }

  /**
   * Checks one method expectation given as strings (test hook, also usable from py4j when porting):
   * {@code paramTypesCsv} is a comma-separated list of type names ("long", "scala.Option", ...).
   */
  public static void verifyMethod(String owner, String name, String returnType, String paramTypesCsv) {
    String[] params = paramTypesCsv == null || paramTypesCsv.isBlank() ? new String[0]
        : Arrays.stream(paramTypesCsv.split(",")).map(String::trim).toArray(String[]::new);
    check(List.of(Expectation.overridable(owner, name, returnType, params)));
  }

  static void check(List<Expectation> expectations) {
    ClassLoader loader = SignatureCheck.class.getClassLoader();
    List<String> problems = new ArrayList<>();
    String running = sparkVersion();
    if (!supportedVersion(running)) {
      problems.add("Spark version " + running + " (supported: " + supportedText() + ")");
    }
    for (Expectation x : expectations) {
      String p = x.problem(loader);
      if (p != null) problems.add(x.describe() + ": " + p);
    }
    if (!problems.isEmpty()) {
      throw new IllegalStateException("spark-statebackend's JVM shim does not match the running Spark "
          + sparkVersion() + " (it was written against Spark " + supportedText() + "); mismatched: "
          + String.join("; ", problems) + ". Port the shim to this Spark version (see jvm-bridge/README.md) "
          + "or set spark.statebackend.enabled=false.");
    }
  }

  /** Whether {@code version} (e.g. "4.2.1", "4.3.1-SNAPSHOT") is a release of a supported line. */
  static boolean supportedVersion(String version) {
    for (String line : SUPPORTED_LINES) if (version.startsWith(line + ".")) return true;
    return false;
  }

  static String supportedText() {
    List<String> names = new ArrayList<>();
    for (String line : SUPPORTED_LINES) names.add(line + ".x");
    return String.join(", ", names);
  }

  /** The running Spark's version, from org.apache.spark.package$.SPARK_VERSION(). */
  public static String sparkVersion() {
    try {
      Class<?> pkg = Class.forName("org.apache.spark.package$");
      Object module = pkg.getField("MODULE$").get(null);
      return String.valueOf(pkg.getMethod("SPARK_VERSION").invoke(module));
    } catch (ReflectiveOperationException | LinkageError e) {
      return "unknown (" + e + ")";
    }
  }

  /** One thing we rely on. */
  static final class Expectation {
    enum Kind { EXTENDABLE, OVERRIDABLE, CONSTRUCTOR, CALLABLE, CONSTANT, IMPLEMENTED_BY, FIELD }

    final Kind kind;
    final String owner;
    final String name;
    final String returnType;
    final String[] params;
    final Object constant;
    final boolean needsNoArgConstructor;

    private Expectation(Kind kind, String owner, String name, String returnType, String[] params,
        Object constant, boolean needsNoArgConstructor) {
      this.kind = kind;
      this.owner = owner;
      this.name = name;
      this.returnType = returnType;
      this.params = params;
      this.constant = constant;
      this.needsNoArgConstructor = needsNoArgConstructor;
    }

    static Expectation extendable(String owner, boolean needsNoArgConstructor) {
      return new Expectation(Kind.EXTENDABLE, owner, null, null, new String[0], null, needsNoArgConstructor);
    }

    static Expectation overridable(String owner, String name, String returnType, String... params) {
      return new Expectation(Kind.OVERRIDABLE, owner, name, returnType, params, null, false);
    }

    static Expectation constructor(String owner, String... params) {
      return new Expectation(Kind.CONSTRUCTOR, owner, "<init>", null, params, null, false);
    }

    static Expectation callable(String owner, String name, String returnType, String... params) {
      return new Expectation(Kind.CALLABLE, owner, name, returnType, params, null, false);
    }

    static Expectation constant(String moduleClass, String accessor, Object value) {
      return new Expectation(Kind.CONSTANT, moduleClass, accessor, null, new String[0], value, false);
    }

    /** {@code owner} declares a field {@code name} of type {@code type}. */
    static Expectation field(String owner, String name, String type) {
      return new Expectation(Kind.FIELD, owner, name, type, new String[0], null, false);
    }

    /** Every abstract method of interface {@code owner} has a concrete implementation in {@code impl}. */
    static Expectation implementedBy(String owner, String impl) {
      return new Expectation(Kind.IMPLEMENTED_BY, owner, impl, null, new String[0], null, false);
    }

    String describe() {
      switch (kind) {
        case IMPLEMENTED_BY:
          return "interface " + owner + " implemented by " + name;
        case EXTENDABLE:
          return "class " + owner;
        case CONSTANT:
          return owner + "." + name + "() == " + constant;
        case FIELD:
          return "field " + returnType + " " + owner + "#" + name;
        case CONSTRUCTOR:
          return owner + "(" + String.join(", ", params) + ")";
        default:
          return returnType + " " + owner + "#" + name + "(" + String.join(", ", params) + ")";
      }
    }

    /** Null when the running classes match, else what is wrong. */
    String problem(ClassLoader loader) {
      Class<?> c;
      try {
        c = Class.forName(owner, false, loader);
      } catch (ClassNotFoundException | LinkageError e) {
        return "class not found";
      }
      try {
        switch (kind) {
          case EXTENDABLE: {
            if (Modifier.isFinal(c.getModifiers())) return "class is final";
            if (!Modifier.isPublic(c.getModifiers())) return "class is not public";
            if (needsNoArgConstructor) {
              Constructor<?> k = c.getDeclaredConstructor();
              if (!Modifier.isPublic(k.getModifiers())) return "no public zero-argument constructor";
            }
            return null;
          }
          case CONSTRUCTOR: {
            Constructor<?> k = c.getDeclaredConstructor(types(params, loader));
            int m = k.getModifiers();
            return Modifier.isPublic(m) || Modifier.isProtected(m) ? null : "constructor is not accessible";
          }
          case OVERRIDABLE:
          case CALLABLE: {
            Method m = findMethod(c, name, types(params, loader));
            if (m == null) return "no such method" + similar(c);
            int mod = m.getModifiers();
            if (!(Modifier.isPublic(mod) || Modifier.isProtected(mod))) return "method is not accessible";
            if (Modifier.isStatic(mod)) return "method is static";
            if (kind == Kind.OVERRIDABLE && Modifier.isFinal(mod)) return "method is final";
            Class<?> want = type(returnType, loader);
            if (!m.getReturnType().equals(want)) return "returns " + m.getReturnType().getName();
            return null;
          }
          case IMPLEMENTED_BY: {
            Class<?> impl = Class.forName(name, false, loader);
            List<String> missing = new ArrayList<>();
            for (Method m : c.getMethods()) {
              if (!Modifier.isAbstract(m.getModifiers())) continue;
              Method mine = impl.getMethod(m.getName(), m.getParameterTypes());
              if (Modifier.isAbstract(mine.getModifiers())) missing.add(m.toGenericString());
            }
            return missing.isEmpty() ? null : "not implemented: " + String.join(" | ", missing);
          }
          case CONSTANT: {
            Object v = c.getField("MODULE$").get(null);
            for (String accessor : name.split("\\.")) v = v.getClass().getMethod(accessor).invoke(v);
            return Objects.equals(v, constant) ? null : "is " + v;
          }
          case FIELD: {
            java.lang.reflect.Field f = c.getDeclaredField(name);
            return f.getType().equals(type(returnType, loader)) ? null : "has type " + f.getType().getName();
          }
          default:
            return "unknown expectation";
        }
      } catch (NoSuchFieldException e) {
        return "no such field";
      } catch (NoSuchMethodException e) {
        return kind == Kind.CONSTRUCTOR ? "no such constructor" : "no such member" + similar(c);
      } catch (ClassNotFoundException e) {
        return "parameter or return type not found: " + e.getMessage();
      } catch (ReflectiveOperationException | LinkageError | RuntimeException e) {
        return "cannot inspect: " + e;
      }
    }

    private String similar(Class<?> c) {
      List<String> found = new ArrayList<>();
      for (Class<?> k = c; k != null; k = k.getSuperclass()) {
        for (Method m : k.getDeclaredMethods()) {
          if (m.getName().equals(name)) found.add(m.toGenericString());
        }
      }
      return found.isEmpty() ? "" : " (found " + String.join(" | ", found) + ")";
    }

    private static Method findMethod(Class<?> c, String name, Class<?>[] params) {
      for (Class<?> k = c; k != null; k = k.getSuperclass()) {
        try {
          return k.getDeclaredMethod(name, params);
        } catch (NoSuchMethodException e) {
          // keep looking in the superclass: inherited members count
        }
      }
      return null;
    }

    private static Class<?>[] types(String[] names, ClassLoader loader) throws ClassNotFoundException {
      Class<?>[] out = new Class<?>[names.length];
      for (int i = 0; i < names.length; i++) out[i] = type(names[i], loader);
      return out;
    }

    private static Class<?> type(String n, ClassLoader loader) throws ClassNotFoundException {
      switch (n) {
        case "void": return void.class;
        case "boolean": return boolean.class;
        case "int": return int.class;
        case "long": return long.class;
        case "short": return short.class;
        case "byte": return byte.class;
        case "double": return double.class;
        case "float": return float.class;
        case "char": return char.class;
        default: return Class.forName(n, false, loader);   // also JVM array names, "[Lpkg.Cls;"
      }
    }
  }
}
