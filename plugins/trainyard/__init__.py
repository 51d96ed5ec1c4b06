"""Trainyard: one YAML file -> an Airflow 3 ML pipeline (validate, prepare, train, evaluate, deploy).

This package is imported when Airflow parses the dags folder, so it imports nothing heavy at module level:
no TensorFlow, Great Expectations, pandas, numpy, and no Kubernetes client
(tests/unit/test_dag_integrity.py: test_parsing_the_dags_folder_imports_nothing_heavy).
"""

__version__ = "0.1.0"
