"""Spark plumbing: sessions, running a list of tasks, progress, readable Spark errors.

Sessions are configured from the profile ``spark/<profile>.conf`` of the conf directories
(``sparktf.paths``; spark-defaults style). Under
``spark-submit`` (``scripts/submit.sh``) the submitted configuration wins and
``get_session`` only fills in what is missing; from plain Python (tests, notebooks) it reads
the profile file and starts the session itself. Given a Spark Connect URL (``remote``, or
``$SPARK_REMOTE`` outside spark-submit) it returns a Connect session instead
(``sparktf.remote``): no JVM in this process, only runtime settings applied.

``run_tasks`` runs one Spark task per item with progress in the log; ``task_progress`` and
``stage_progress`` report a running job; ``spark_failure`` and ``spark_error_text`` turn a
Py4J/Spark failure into the Python error that caused it, not the JVM trace around it.

The rooms: :mod:`~sparktf.spark.profiles` (profiles, masters, sizing),
:mod:`~sparktf.spark.session` (sessions), :mod:`~sparktf.spark.transport` (authentication and
encryption of Spark's channels), :mod:`~sparktf.spark.progress` (tasks and their progress),
:mod:`~sparktf.spark.failures` (readable errors, executors). Nothing heavy is imported at
import time (executors import this package to run tasks).
"""

from __future__ import annotations

from sparktf.remote import is_connect
from sparktf.spark.failures import (
    ExecutorCountError,
    executor_slots,
    is_spark_error,
    placement_problem,
    registered_executors,
    spark_error_text,
    spark_failure,
    task_error,
    wait_for_executors,
)
from sparktf.spark.profiles import (
    PROFILES,
    PROPAGATED_ENV,
    cluster_master,
    cluster_resources,
    executor_sizing,
    local_cluster_env,
    local_spark_home,
    log4j_conf,
    profile_conf,
    profile_file,
    read_conf_file,
    spark_cluster_dir,
    use_local_spark_home,
    yarn_site,
)
from sparktf.spark.progress import (
    PROGRESS_EVERY_S,
    STAGE_PROGRESS_EVERY_S,
    every,
    run_tasks,
    stage_progress,
    task_progress,
)
from sparktf.spark.s3a import spark_settings as s3a_settings
from sparktf.spark.session import (
    get_session,
    job_session,
    launched_by_spark_submit,
    quiet_py4j,
    session_conf,
    stop_session,
)
from sparktf.spark.transport import (
    SECRET_CONF,
    SECRET_FILE_ENV,
    TRANSPORT_SETTINGS,
    TransportError,
    private_properties_args,
    private_settings,
    read_secret,
    remote_executors,
    secret_file,
    transport_defaults,
    transport_secret,
    transport_warning,
    write_private_conf,
)

__all__ = [
    "ExecutorCountError",
    "PROFILES",
    "PROGRESS_EVERY_S",
    "PROPAGATED_ENV",
    "SECRET_CONF",
    "SECRET_FILE_ENV",
    "STAGE_PROGRESS_EVERY_S",
    "TRANSPORT_SETTINGS",
    "TransportError",
    "cluster_master",
    "cluster_resources",
    "every",
    "executor_sizing",
    "get_session",
    "is_connect",
    "is_spark_error",
    "job_session",
    "launched_by_spark_submit",
    "local_cluster_env",
    "log4j_conf",
    "placement_problem",
    "profile_conf",
    "profile_file",
    "quiet_py4j",
    "read_conf_file",
    "read_secret",
    "executor_slots",
    "registered_executors",
    "remote_executors",
    "run_tasks",
    "secret_file",
    "session_conf",
    "stop_session",
    "local_spark_home",
    "use_local_spark_home",
    "spark_cluster_dir",
    "spark_error_text",
    "spark_failure",
    "stage_progress",
    "task_error",
    "task_progress",
    "transport_defaults",
    "transport_secret",
    "transport_warning",
    "wait_for_executors",
    "private_properties_args",
    "private_settings",
    "s3a_settings",
    "write_private_conf",
    "yarn_site",
]
