"""The JVM options every JVM the suite starts inherits (``JAVA_TOOL_OPTIONS``), and the way back to production's.

- ``-XX:TieredStopAtLevel=1``: every such JVM is short-lived and runs tiny
  inputs; the C1 compiler alone spends far less CPU compiling than C2 does,
  and the suite is CPU-bound on two cores. Measured on a cold
  ``barrierflow run`` of sensor_stats (3 epochs): 47 s -> 35 s (mean of
  three each). C1 alone shrinks the default code cache to 48 MB, which a
  long-lived engine filled ("Out of space in CodeCache for method handle
  intrinsic", a fatal error): keep the usual 240 MB.
- :data:`INTERPRETED_SQL`: Spark SQL evaluates expressions and operators
  interpreted instead of compiling generated Java for them. A tiny epoch
  still compiled about a dozen classes (literals such as the watermark differ
  every epoch, and each different text is a new class); interpreted, four
  integration files on one engine took 122 / 136 s against 145 / 155 s, and
  13-20% less CPU. Spark guarantees both modes the same results and tests
  both; production keeps generated code, and so do the cluster tests
  (:func:`with_generated_code`) and ``make bench``, which checks its outputs.
  Spark reads ``spark.*`` Java system properties into every driver's
  configuration, so this reaches engines, CLI drivers and spark-submit alike.
- Then each JVM maps the class-data-sharing archive of Spark's classes
  (``barrierflow.execution.jvm_archive``) that ``make setup`` dumps.
"""

from __future__ import annotations

INTERPRETED_SQL = "-Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN"
COMPILER = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def suite_java_options(archive_options: str) -> str:
    return f"{COMPILER} {INTERPRETED_SQL} {archive_options}".strip()


def with_generated_code(options: str) -> str:
    """``JAVA_TOOL_OPTIONS`` ``options`` with Spark SQL as production runs it: generated code, not interpreted."""
    return " ".join(options.replace(INTERPRETED_SQL, " ").split())
