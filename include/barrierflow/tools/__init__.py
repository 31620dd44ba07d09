"""Tools: the command line, the dev server, the deployment topology, the Spark engine launcher."""
