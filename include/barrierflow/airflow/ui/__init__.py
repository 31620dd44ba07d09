"""barrierflow's checkpoints page: epoch history, lineages, savepoints, an SVG chart.

``history`` gathers the data (also of a run's "Checkpoint" tab) with no web framework; ``render`` and ``chart`` turn it into HTML
and SVG; ``app`` serves both as a FastAPI app that ``plugin`` hands to Airflow. Importing it loads neither FastAPI nor Airflow."""
