"""The stage contract: what Trainyard's Airflow side and every stage image share (DESIGN.md, "The contract, module
by module").

Pydantic and the standard library only, and only what crosses the boundary between the Airflow side and an image,
or between two images: the config schema (`schema`), the shared-volume layout with every named run artifact
(`layout`), the run files one package writes and another reads (`artifacts`), the one entrypoint shape and the exit
codes (`runtime`), write-then-rename helpers (`atomic`), the metric names (`metrics`) and TF_CONFIG as a replica
reads it (`tf_config`). What one side alone uses lives on that side: the TF_CONFIG builder, job names and the
replica restart rule in `plugins/trainyard`, the data stages' throughput figures in `trainyard_prep`.
"""

__version__ = "0.1.0"
