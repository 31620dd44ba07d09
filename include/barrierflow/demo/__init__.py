"""Demo: the reference pipelines, their input generators."""
