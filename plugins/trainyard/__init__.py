"""Trainyard: one YAML file -> an Airflow 3 ML pipeline (validate, prepare, train, evaluate, deploy).

This package is imported when Airflow parses the dags folder, so it imports nothing heavy at module level:
no TensorFlow, Great Expectations, pandas, numpy, and no Kubernetes client (see tests/unit/test_parse_imports.py).
"""

__version__ = "0.1.0"
