"""Reading pipeline configs: YAML with source positions, the earlier spellings moved to today's, and the schema's
errors as `FILE:LINE:COL: field: message` lines. Nothing here imports Airflow."""
