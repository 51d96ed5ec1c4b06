"""`from trainyard.dag_factory import dag_from_config`: the import DAG shims written before the package was split
into subpackages use. Kept so those shims go on working; new shims import `trainyard.dag.factory`."""

from trainyard.dag.factory import build_dag, dag_from_config

__all__ = ["build_dag", "dag_from_config"]
