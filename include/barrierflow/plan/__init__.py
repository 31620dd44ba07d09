"""The plan: the pipeline graph, its declaration and the registry of pipelines."""
