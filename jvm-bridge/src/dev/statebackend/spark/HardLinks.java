package dev.statebackend.spark;

import java.io.IOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicBoolean;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Hard link with a copy fallback, the one primitive behind staging and the zero-copy checkpoint.
 *
 * <p>Why it exists: a hard link shares an immutable file (SSTs, write-once zips) without copying data,
 * but only within one filesystem. When source and target are on different filesystems (EXDEV, e.g.
 * spark.local.dir on another disk than the checkpoint location) we copy instead and warn once per JVM,
 * so a misplaced directory costs speed, never correctness. Hooks no Spark member.
 */
final class HardLinks {
  private static final Logger LOG = LoggerFactory.getLogger(HardLinks.class);
  private static final AtomicBoolean WARNED = new AtomicBoolean();

  private HardLinks() {}

  /**
   * Makes {@code dst} a hard link to (or, failing that, a copy of) {@code src}. The target appears
   * atomically: built under a temp name in its directory, then renamed. With {@code overwrite} false an
   * existing {@code dst} is an error. Returns true when linked, false when copied.
   */
  static boolean linkOrCopy(Path src, Path dst, boolean overwrite) throws IOException {
    if (!overwrite && Files.exists(dst)) throw new FileAlreadyExistsException(dst.toString());
    Path parent = dst.toAbsolutePath().getParent();
    Files.createDirectories(parent);
    Path tmp = parent.resolve("." + dst.getFileName() + "." + UUID.randomUUID() + ".lnk");
    boolean linked = linkOrCopyNew(src, tmp);
    try {
      if (overwrite) {
        Files.move(tmp, dst, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
      } else {
        Files.move(tmp, dst, StandardCopyOption.ATOMIC_MOVE);
      }
    } finally {
      Files.deleteIfExists(tmp);
    }
    return linked;
  }

  /** Like {@link #linkOrCopy} for a target that must not exist yet (inside a private temp dir). */
  static boolean linkOrCopyNew(Path src, Path dst) throws IOException {
    try {
      Files.createLink(dst, src);
      return true;
    } catch (NoSuchFileException | FileAlreadyExistsException e) {
      throw e;   // a missing source or a taken name is a real error, copying would not help
    } catch (IOException | UnsupportedOperationException e) {
      if (WARNED.compareAndSet(false, true)) {
        LOG.warn("spark-statebackend: cannot hard-link {} -> {} ({}); copying instead. Put the staging dir, "
            + "spark.local.dir and the checkpoint location on one filesystem for zero-copy commits. "
            + "(Logged once per JVM.)", src, dst, e.toString());
      }
      Files.copy(src, dst, StandardCopyOption.COPY_ATTRIBUTES);
      return false;
    }
  }

  /** Best-effort recursive delete of a directory we created; failures are logged, not thrown. */
  static void deleteTree(Path root) {
    if (root == null || !Files.exists(root)) return;
    try (var walk = Files.walk(root)) {
      walk.sorted(java.util.Comparator.reverseOrder()).forEach(p -> {
        try {
          Files.deleteIfExists(p);
        } catch (IOException e) {
          LOG.warn("spark-statebackend: could not delete {}: {}", p, e.toString());
        }
      });
    } catch (IOException e) {
      LOG.warn("spark-statebackend: could not delete {}: {}", root, e.toString());
    }
  }
}
