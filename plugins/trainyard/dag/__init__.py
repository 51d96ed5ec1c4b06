"""From a validated config to an Airflow DAG: the stage registry and its kinds, the container each stage runs, the
trigger-form Params, the operator and the factory. Runs at DAG-parse time, so nothing heavy is imported at the top."""
