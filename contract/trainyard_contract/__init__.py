"""The stage contract: what Trainyard's Airflow side and every stage image share (DESIGN.md, "The contract").

Pydantic and the standard library only: the config schema (`schema`), the shared-volume layout with every named
run artifact (`layout`), the stage runtime every entrypoint uses (`runtime`: exit codes, arguments, the result
line, the pod environment), write-then-rename helpers (`atomic`), TF_CONFIG shapes (`cluster_spec` to build,
`tf_config` to read) and the replica restart rule both job monitors apply (`replica_policy`).
"""

__version__ = "0.1.0"
