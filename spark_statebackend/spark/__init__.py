"""What a Spark application sees: its spark.conf keys, configure(), start-up validation, status(), and
the driver-side restore of a query's checkpoint location."""

from .driver_restore import jar_path

__all__ = ["jar_path"]
