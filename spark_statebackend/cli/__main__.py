"""`python -m spark_statebackend.cli`: the same as the `spark-statebackend` command."""

from . import main

main()
