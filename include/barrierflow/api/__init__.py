"""What a pipeline author writes against: parameters, state descriptors and handles, functions, windows, aggregations."""
