"""Trainyard's stream image: the scorer (events -> the served model -> results) and the lander (labelled events ->
the pipeline's daily partitions)."""
