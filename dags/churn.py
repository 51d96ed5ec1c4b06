"""Airflow DAG shim for pipelines_config/churn.yaml: the Trainyard factory builds the DAG from the config."""

from trainyard.dag.factory import dag_from_config

dag = dag_from_config("churn")
